"""The HTTP adapter against a real service on 127.0.0.1 that keeps idempotency keys as Stripe documents them."""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from receipts import protocol, runtime
from receipts.adapters.http import HttpRequest, http_factory
from receipts.tools import ABSENT, NOT_DONE, PRESENT, UNCLEAR, OutcomeUnknown, Rejected
from tests.idempotent_service import KEY_LIFETIME, Service

CHARGE = {"amount": 1200, "description": "invoice 42"}


@pytest.fixture
def service() -> Iterator[Service]:
    with Service() as running:
        yield running


def charges(service: Service, **options) -> HttpRequest:
    options.setdefault("retry_wait", 0.01)
    return HttpRequest(name="create_charge", url=f"{service.url}/v1/charges", **options)


def by_key(service: Service, **options) -> HttpRequest:
    return charges(service, lookup_url=f"{service.url}/v1/charges?idempotency_key={{call_id}}", **options)


def post(service: Service, key: str, body: dict) -> tuple[int, dict, str | None]:
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{service.url}/v1/charges", data=data, method="POST", headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - the test's own service
            return response.status, json.loads(response.read()), response.headers.get("Idempotent-Replayed")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read()), error.headers.get("Idempotent-Replayed")


def test_the_service_keeps_keys_as_stripe_documents(service):
    """The test service itself: replay, another body refused, keys forgotten after 24 hours."""
    status, first, replayed = post(service, "k1", CHARGE)
    assert (status, replayed) == (200, None)
    assert post(service, "k1", CHARGE) == (200, first, "true")
    status, error, _ = post(service, "k1", {**CHARGE, "amount": 1})
    assert status == 400 and error["error"]["type"] == "idempotency_error"
    assert post(service, "k2", {"amount": -1})[0] == 400 and "k2" not in service.keys, "a refused body saves nothing"
    created = service.keys["k1"].created
    service.clock = lambda: created + KEY_LIFETIME + 1
    assert post(service, "k1", CHARGE)[2] is None and len(service.charges) == 2, "an expired key is a new request"


def test_a_call_sends_its_call_id_as_the_idempotency_key_and_records_the_resource(run_dir, service):
    adapter = charges(service)
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    [charge] = service.charges
    assert charge["idempotency_key"] == outcome.call_id
    assert outcome.result == {"status": 200, "resource_id": charge["id"], "idempotency_key": outcome.call_id}


def test_a_lost_response_is_retried_with_the_key_and_answered_from_it(run_dir, service):
    service.script = ["drop"]  # the charge is made, the connection dropped before the answer
    adapter = charges(service)
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    [charge] = service.charges
    assert outcome.status == "committed" and (outcome.result or {})["replayed"] is True
    assert (outcome.result or {})["resource_id"] == charge["id"]
    assert [key for _, key in service.requests] == [outcome.call_id, outcome.call_id]


def test_a_response_lost_past_the_retries_is_in_doubt_and_the_lookup_settles_it(run_dir, service):
    service.script = ["drop"]
    adapter = by_key(service, retries=0)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    lost = executor.call(adapter.name, CHARGE)
    assert lost.status == "unknown" and lost.needs == "confirmation" and "no answer" in (lost.error or {})["message"]
    resumed = executor.call(adapter.name, CHARGE)
    [charge] = service.charges
    assert resumed.status == "committed" and resumed.reused and (resumed.result or {})["resource_id"] == charge["id"]


def test_once_the_service_may_have_forgotten_the_key_not_found_is_in_doubt_not_done(run_dir, service):
    """A charge whose answer was lost, looked up a day later: the service keeps a key 24 hours, so
    its 404 no longer says "never charged", and a resume that took it so charged the card twice.
    The day is the service's (its Date): this host's clock says a minute has passed."""
    service.script = ["drop"]
    adapter = by_key(service, retries=0)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    lost = executor.call(adapter.name, CHARGE)
    assert lost.status == "unknown" and len(service.charges) == 1
    [saved] = service.keys.values()
    service.clock = lambda: saved.created + KEY_LIFETIME + 60  # a day on, by the service: it forgets the key
    later = by_key(service, retries=0)
    resumed = runtime.Executor(run_dir, {later.name: later}).call(later.name, CHARGE)
    assert len(service.charges) == 1, "charged twice"
    assert resumed.needs == "confirmation" and "keeps an idempotency key for 24 h" in (resumed.error or {})["message"]
    evidence = later.evidence(run_dir, CHARGE, lost.call_id)
    assert evidence.verdict == UNCLEAR and any("may have forgotten" in fact for fact in evidence.facts)


def test_a_host_fast_at_the_send_and_set_right_later_never_charges_twice(run_dir, service, monkeypatch):
    """Issue 55, case 6: this host 2 h fast at the send, its clock set right later, the call resumed
    24.5 h after the send. Dated by its receipt it looked 22.5 h old, younger than the service's 24 h:
    the lookup's 404 (the key forgotten) read as "never done", and the card was charged twice, marked
    committed. Now the receipt's date is held to the service's clock before anything is sent."""
    real = protocol.utc_now()
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(real + dt.timedelta(hours=2)))  # the writer's clock
    service.script = ["drop"]
    adapter = by_key(service, retries=0)
    sent = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    service.clock = lambda: time.time() + 24.5 * 3600  # 24.5 h on, by the service: it forgets the key
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(real + dt.timedelta(hours=24.5)))  # set right
    later = by_key(service, retries=0)
    resumed = runtime.Executor(run_dir, {later.name: later}).call(later.name, CHARGE)
    assert len(service.charges) < 2, f"charged twice, the resume {resumed.status}"
    assert sent.status == "rejected" and (sent.error or {})["kind"] == "retryable", sent
    assert "2 h ahead of the service's clock" in (sent.error or {})["message"]
    assert [request for request, _ in service.requests if request.startswith("POST")] == [], "nothing was sent"
    assert resumed.status == "rejected" and service.charges == []
    monkeypatch.delenv("RECEIPTS_CLOCK")
    service.clock, service.script = time.time, []
    runtime.run_set_state(run_dir, state="retrying", attempts=1)  # the next attempt may start
    again = runtime.Executor(run_dir, {later.name: later}).call(later.name, CHARGE)
    assert again.status == "committed" and len(service.charges) == 1, "the call made once, at its next attempt"


def test_a_host_clock_set_back_at_the_resume_never_charges_twice(run_dir, service, monkeypatch):
    """Right at the send, 2 h slow at the resume 24.5 h later: by this host the call is 22.5 h old, by
    the service 24.5 h, and the service's clock is the one that forgets keys."""
    service.script = ["drop"]
    adapter = by_key(service, retries=0)
    lost = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert lost.status == "unknown" and len(service.charges) == 1
    service.clock = lambda: time.time() + 24.5 * 3600  # 24.5 h on, by the service: it forgets the key
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(protocol.utc_now() + dt.timedelta(hours=22.5)))
    resumed = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert len(service.charges) == 1, f"charged twice, the resume {resumed.status}"
    assert resumed.needs == "confirmation" and "may have forgotten" in (resumed.error or {})["message"]


def test_a_receipt_dated_in_the_future_of_the_services_clock_proves_nothing_by_not_found(run_dir, service):
    """The service's clock set back since the send: the call's age by it is unknown."""
    service.script = ["drop"]
    adapter = by_key(service, retries=0)
    lost = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    service.charges.clear()  # as if the charge never happened: only the clock can still stop the resume
    service.clock = lambda: time.time() - 2 * 3600
    resumed = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert (
        resumed.needs == "confirmation" and "in the future of the service's clock" in (resumed.error or {})["message"]
    )
    assert service.charges == [] and lost.status == "unknown"


def test_a_lookup_without_a_date_proves_nothing_by_not_found(run_dir, service):
    service.script = ["drop"]
    adapter = by_key(service, retries=0)
    lost = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    service.charges.clear()
    service.dated = False
    resumed = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert resumed.needs == "confirmation" and "no Date" in (resumed.error or {})["message"]
    assert service.charges == [] and lost.status == "unknown"


def test_the_service_clock_is_read_before_the_send_and_kept_a_while(run_dir, service, monkeypatch):
    """A receipt dated a minute ahead of the service is sent; one read of the service's clock serves the
    calls that follow it closely (its age measured on this process's monotonic clock); a service that
    gives no Date cannot date its keys, and nothing is sent to it."""
    ahead = protocol.utc_now() + dt.timedelta(minutes=1)
    monkeypatch.setenv("RECEIPTS_CLOCK", protocol.format_time(ahead))
    adapter = by_key(service)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    first = executor.call(adapter.name, CHARGE)
    second = executor.call(adapter.name, {**CHARGE, "amount": 1300})
    assert first.status == second.status == "committed" and len(service.charges) == 2
    assert [request for request, _ in service.requests] == ["GET /v1/charges", "POST /v1/charges", "POST /v1/charges"]
    undated = by_key(service)
    service.dated = False
    refused = runtime.Executor(run_dir, {undated.name: undated}).call(undated.name, {**CHARGE, "amount": 1400})
    assert refused.status == "rejected" and "no Date" in (refused.error or {})["message"]
    assert len(service.charges) == 2


def test_a_commit_past_its_keys_retention_stays_committed_when_receipt_and_ledger_agree(run_dir, service):
    """The service forgot the key of a charge made a day ago: its 404 is no sign against the commit,
    which the receipt (its result's digest) and the ledger record. It went to a person before."""
    adapter = by_key(service)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    first = executor.call(adapter.name, CHARGE)
    [saved] = service.keys.values()
    service.clock = lambda: saved.created + KEY_LIFETIME + 60
    again = executor.call(adapter.name, CHARGE)
    assert again.status == "committed" and again.reused and again.needs is None, again.error
    assert again.result == first.result and len(service.charges) == 1
    evidence = adapter.evidence(run_dir, CHARGE, first.call_id, result=first.result)
    assert evidence.verdict == PRESENT and any("the receipt and the ledger" in fact for fact in evidence.facts)
    ledger = run_dir / "events.jsonl"
    kept = [line for line in ledger.read_bytes().splitlines(keepends=True) if b'"committed"' not in line]
    ledger.write_bytes(b"".join(kept))  # the ledger no longer records the commit
    disputed = adapter.evidence(run_dir, CHARGE, first.call_id, result=first.result)
    assert disputed.verdict == UNCLEAR, disputed
    assert adapter.evidence(run_dir, CHARGE, first.call_id).verdict == UNCLEAR, "no result: nothing to agree with"
    assert executor.call(adapter.name, CHARGE).needs == "confirmation"


def test_a_commit_the_service_should_still_know_is_disputed_by_its_not_found(run_dir, service):
    adapter = by_key(service)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    executor.call(adapter.name, CHARGE)
    service.charges.clear()  # the service lost the charge while it keeps the key
    again = executor.call(adapter.name, CHARGE)
    assert again.needs == "confirmation" and "404" in (again.error or {})["message"]


def test_without_a_lookup_a_lost_response_waits_for_a_person(run_dir, service):
    service.script = ["drop"]
    adapter = charges(service, retries=0)
    assert adapter.query is None, "not queryable: the service cannot be asked by key"
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    assert executor.call(adapter.name, CHARGE).status == "unknown"
    assert executor.call(adapter.name, CHARGE).needs == "confirmation"
    assert len(service.charges) == 1


def test_a_lookup_that_finds_nothing_lets_the_call_be_made_once(run_dir, service):
    service.script = [500]
    adapter = by_key(service, retries=0)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    assert executor.call(adapter.name, CHARGE).status == "unknown", "a 500 may come after the effect"
    assert adapter.query(run_dir, CHARGE, "a" * 64) is NOT_DONE
    resumed = executor.call(adapter.name, CHARGE)
    assert resumed.status == "committed" and not resumed.reused and len(service.charges) == 1


def test_a_5xx_is_retried_with_the_same_key(run_dir, service):
    service.script = [500, 500]
    adapter = charges(service, retries=2)
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert outcome.status == "committed" and len(service.charges) == 1


def test_while_the_keys_first_request_runs_a_retry_gets_409_and_waits(run_dir, service):
    """The first try times out while the service is still making the charge; the retry meets a 409."""
    service.hold = threading.Event()
    hold = service.hold

    def release_at_the_first_conflict() -> None:
        service.conflicts.wait()
        hold.set()

    threading.Thread(target=release_at_the_first_conflict, daemon=True).start()
    adapter = charges(service, timeout=0.2, retries=50)
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert service.conflicts.is_set(), "a retry met the first request still running"
    assert outcome.status == "committed" and (outcome.result or {})["replayed"] is True and len(service.charges) == 1


def test_a_key_used_with_another_body_is_rejected_and_nothing_of_this_request_ran(run_dir, service):
    adapter = charges(service)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    call_id = executor.call(adapter.name, CHARGE).call_id
    with pytest.raises(Rejected, match="HTTP 400") as rejected:
        adapter.execute(run_dir, {**CHARGE, "amount": 5}, call_id)
    assert rejected.value.kind == "permanent" and len(service.charges) == 1


def test_a_refused_request_is_rejected_and_an_unreachable_service_is_retryable(run_dir, service):
    adapter = charges(service)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    refused = executor.call(adapter.name, {"amount": -1})
    assert (
        refused.status == "rejected"
        and (refused.error or {})["kind"] == "permanent"
        and "HTTP 400" in (refused.error or {})["message"]
    )
    with socket.socket() as closed:  # a port nothing listens on: every try is refused before a byte is sent
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    nowhere = HttpRequest(name="create_charge", url=f"http://127.0.0.1:{port}/v1/charges", retry_wait=0.01)
    unreachable = runtime.Executor(run_dir, {nowhere.name: nowhere}).call(nowhere.name, {"amount": 7})
    assert unreachable.status == "rejected" and (unreachable.error or {})["kind"] == "retryable", unreachable.error
    assert service.charges == []


@pytest.mark.parametrize("then", [429, 400, 500])
def test_after_a_lost_try_no_refusal_can_say_nothing_happened(run_dir, service, then):
    service.script = ["drop", then]  # the charge is made and its answer lost; the retry is refused
    adapter = charges(service, retries=1)
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert outcome.status == "unknown" and f"HTTP {then}" in (outcome.error or {})["message"]
    assert len(service.charges) == 1


def test_evidence_by_key_by_resource_id_and_without_a_lookup(run_dir, service):
    adapter = by_key(service)
    result = adapter.execute(run_dir, CHARGE, "c" * 64)
    present = adapter.evidence(run_dir, CHARGE, "c" * 64, result=result)
    assert present.verdict == PRESENT and result["resource_id"] in present.facts[0]
    assert adapter.evidence(run_dir, CHARGE, "c" * 64, result={**result, "resource_id": "ch_other"}).verdict == UNCLEAR
    assert adapter.evidence(run_dir, CHARGE, "d" * 64).verdict == ABSENT
    by_id = charges(service, lookup_url=f"{service.url}/v1/charges/{{resource_id}}")
    assert by_id.query is None, "a resource id is not known for a call in doubt"
    assert by_id.evidence(run_dir, CHARGE, "c" * 64, result=result).verdict == PRESENT
    hostile = {**result, "resource_id": "../../elsewhere?x=1#"}
    gone = by_id.evidence(run_dir, CHARGE, "c" * 64, result=hostile)
    assert gone.verdict == UNCLEAR and service.requests[-1] == ("GET /v1/charges/..%2F..%2Felsewhere%3Fx%3D1%23", None)
    nothing = charges(service).evidence(run_dir, CHARGE, "c" * 64, result=result)
    assert nothing.verdict == UNCLEAR
    assert nothing.facts == (
        f"this service offers no lookup here: look in the service at POST {service.url}/v1/charges for the request "
        f"with Idempotency-Key: {'c' * 64}; the receipt records resource id {result['resource_id']}",
    )


def test_fixed_headers_are_sent_and_never_recorded(run_dir, service):
    adapter = charges(service, headers={"Authorization": "Bearer sk_test_secret"})
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert outcome.status == "committed" and service.authorizations == ["Bearer sk_test_secret"]
    written = b"".join(path.read_bytes() for path in run_dir.rglob("*") if path.is_file())
    assert b"sk_test_secret" not in written


def test_a_redirect_is_never_followed(run_dir, service):
    adapter = charges(service, lookup_url=f"{service.url}/moved?key={{call_id}}")
    evidence = adapter.evidence(run_dir, CHARGE, "c" * 64)
    assert evidence.verdict == UNCLEAR and evidence.facts[0] == f"GET {service.url}/moved: HTTP 302"
    with pytest.raises(OutcomeUnknown, match="HTTP 302"):
        adapter.query(run_dir, CHARGE, "c" * 64)


def test_configuration_is_checked():
    with pytest.raises(ValueError, match="exactly one of"):
        HttpRequest(name="x", url="http://127.0.0.1/", lookup_url="http://127.0.0.1/{call_id}/{resource_id}")
    with pytest.raises(ValueError, match="http"):
        HttpRequest(name="x", url="file:///etc/passwd")


def test_the_zero_argument_factory_reads_the_environment(run_dir, service, monkeypatch):
    monkeypatch.delenv("CALLPROOF_HTTP_URL", raising=False)
    with pytest.raises(ValueError, match="CALLPROOF_HTTP_URL"):
        http_factory()
    monkeypatch.setenv("CALLPROOF_HTTP_URL", f"{service.url}/v1/charges")
    monkeypatch.setenv("CALLPROOF_HTTP_LOOKUP_URL", f"{service.url}/v1/charges?idempotency_key={{call_id}}")
    adapter = http_factory()
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    found = adapter.query(run_dir, CHARGE, outcome.call_id)
    assert (
        outcome.status == "committed" and isinstance(found, dict) and found["resource_id"] == service.charges[0]["id"]
    )


def test_without_a_lookup_a_commit_is_reused_from_its_receipt(run_dir, service):
    """Nothing can look at the service, so its own commit was refused as "not shown by the target":
    disputed, exit 4, and the next attempt refused. It is reused from the receipt, which the writer
    checked (its identity and its result's digest): all the evidence there is without a lookup."""
    adapter = charges(service)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    first = executor.call(adapter.name, CHARGE)
    again = executor.call(adapter.name, CHARGE)
    assert first.status == "committed" and again.status == "committed" and again.reused and again.needs is None
    assert again.result == first.result and len(service.charges) == 1
