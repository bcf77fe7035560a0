"""An answer the target's evidence contradicts asks twice in a real browser, with and without a
script; once decided, the call's page keeps what the target shows; a decision not yet written is
withdrawn. Seen in English at a phone's width and in Chinese at a laptop's (screenshots with
`make screenshots`)."""

from __future__ import annotations

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from playwright.sync_api import expect

from evidence.models import Call, HumanDecision
from tests.browser.conftest import PASSWORD, screenshot
from tests.helpers import join

pytestmark = pytest.mark.browser
AXE = Axe()

LOCALES = {"en": "en-US", "zh": "zh-CN"}
WORDS: dict[str, dict[str, str]] = {
    "en": {
        "rejected": "It did not happen (rejected)",
        "against": "I have checked the target myself: decide against what it shows",
        "warning": "You chose “It did not happen”, and the target shows the effect.",
        "target": "What the target shows now",
        "withdraw": "Withdraw this decision",
        "withdrawn": "Withdrawn: the decision that this call did not happen was never written into the run.",
    },
    "zh": {
        "rejected": "未发生（已拒绝）",
        "against": "我已亲自核查目标系统：违背它显示的情况作出裁定",
        "warning": "你选择了“未发生”，而目标系统显示该效果已经产生。",
        "target": "目标系统现在显示的情况",
        "withdraw": "撤回此裁定",
        "withdrawn": "已撤回：此调用“未发生”的裁定从未写入运行目录。",
    },
}


def browser(chromium, live_server, language: str, width: int, **options):
    context = chromium.new_context(
        viewport={"width": width, "height": 900},
        base_url=live_server.url,
        locale=LOCALES[language],
        bypass_csp=True,  # axe-core's script
        **options,
    )
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.goto("/accounts/login/")
    page.locator("#id_username").fill("alice")
    page.locator("#id_password").fill(PASSWORD)
    page.locator("form:has(#id_password) button[type=submit]").click()
    page.wait_for_url("**/")
    return context, page


def no_axe_violation(page) -> None:
    """axe-core finds nothing, in light and in dark."""
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        violations = AXE.run(page).response["violations"]
        assert violations == [], [(v["id"], [node["target"] for node in v["nodes"]][:3]) for v in violations]
    page.emulate_media(color_scheme="light")


def answer_against_the_evidence(page, call: Call, language: str) -> None:
    words = WORDS[language]
    page.goto(f"/runs/send-message-killed/calls/{call.call_id}/")
    page.get_by_label(words["rejected"]).check()
    page.locator("#id_reason").fill("Nothing in the mail log.")
    page.locator("#id_confirm_call_id").fill(call.call_id[:12])
    page.locator("form.settle button[type=submit]").click()


# Each language at one of the two widths: the layout at both widths, in both languages, is
# test_languages.py's; here each flow is seen in both languages and at both widths, in two runs.
VIEWS = pytest.mark.parametrize(("language", "width"), [("en", 390), ("zh", 1366)])


@VIEWS
def test_did_not_happen_against_the_outbox_asks_twice_and_the_evidence_stays(
    chromium, live_server, demo, language, width
):
    join(User.objects.create_user("alice", password=PASSWORD), "viewer", "confirmer")
    call = Call.objects.get(run__run_id="send-message-killed")
    words = WORDS[language]
    context, page = browser(chromium, live_server, language, width)
    answer_against_the_evidence(page, call, language)
    warning = page.locator("#against-evidence")
    expect(warning).to_contain_text(words["warning"])
    expect(warning).to_contain_text("msg-")  # the outbox line, as the panel lists it
    expect(page.get_by_role("alert")).to_be_visible()
    assert not HumanDecision.objects.exists()
    screenshot(page, f"{language}-{width}-settle-against-evidence")
    no_axe_violation(page)

    page.get_by_label(words["against"]).check()
    page.locator("form.settle button[type=submit]").click()
    expect(page.get_by_role("status")).to_be_visible()
    assert HumanDecision.objects.get().resolution == "rejected"
    target = page.get_by_role("region", name=words["target"])
    expect(target).to_contain_text("msg-")
    expect(target.locator("#target-contradicts")).to_be_visible()
    screenshot(page, f"{language}-{width}-settled-target-shown")
    no_axe_violation(page)
    context.close()


def test_without_a_script_the_second_confirmation_works_the_same(chromium, live_server, demo):
    join(User.objects.create_user("alice", password=PASSWORD), "viewer", "confirmer")
    call = Call.objects.get(run__run_id="send-message-killed")
    context, page = browser(chromium, live_server, "en", 390, java_script_enabled=False)
    answer_against_the_evidence(page, call, "en")
    expect(page.locator("#against-evidence")).to_contain_text(WORDS["en"]["warning"])
    assert not HumanDecision.objects.exists()
    page.get_by_label(WORDS["en"]["against"]).check()
    page.locator("form.settle button[type=submit]").click()
    expect(page.get_by_role("region", name=WORDS["en"]["target"])).to_be_visible()
    assert HumanDecision.objects.get().resolution == "rejected"
    context.close()


@VIEWS
def test_a_decision_waiting_for_its_host_is_withdrawn(chromium, live_server, demo, settings, language, width):
    join(User.objects.create_user("alice", password=PASSWORD), "viewer", "confirmer")
    settings.EVIDENCE_HOST_NAME = "web-host"  # the live server is not the run's host: the decision waits
    call = Call.objects.get(run__run_id="send-message-killed")
    words = WORDS[language]
    context, page = browser(chromium, live_server, language, width)
    answer_against_the_evidence(page, call, language)  # from here the target cannot be read: asked once
    withdraw = page.get_by_role("button", name=words["withdraw"])
    expect(withdraw).to_be_visible()
    screenshot(page, f"{language}-{width}-decision-waiting-withdraw")
    no_axe_violation(page)
    withdraw.click()
    expect(page.get_by_role("status")).to_contain_text(words["withdrawn"])
    assert not HumanDecision.objects.exists()
    screenshot(page, f"{language}-{width}-decision-withdrawn")
    context.close()
