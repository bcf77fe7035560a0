"""The admin site as the admin role sees it: it opens without a staff flag, gives a person a
role through the form, and shows no field that would give more."""

from __future__ import annotations

import pytest

from tests.browser.conftest import PASSWORD, screenshot
from tests.helpers import join

pytestmark = pytest.mark.browser


def test_an_admin_gives_a_role_and_sees_nothing_that_gives_more(chromium, live_server, demo, django_user_model):
    join(django_user_model.objects.create_user("dana", password=PASSWORD), "admin")
    bob = join(django_user_model.objects.create_user("bob", password=PASSWORD), "viewer")
    context = chromium.new_context(viewport={"width": 1366, "height": 900}, base_url=live_server.url)
    page = context.new_page()
    try:
        page.goto("/admin/")  # the admin's own login page, which asks for the role, not a staff flag
        page.get_by_label("Username").fill("dana")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url("**/admin/")
        page.goto(f"/admin/auth/user/{bob.pk}/change/")
        text = page.locator("#content").inner_text()
        for absent in ("Superuser status", "Staff status", "User permissions", "Password"):
            assert absent not in text, absent
        # The admin's two-box widget: pick the role on the left, move it right.
        page.locator("#id_groups_from").select_option(label="confirmer")
        page.locator("#id_groups_add").click()
        assert sorted(page.locator("#id_groups_from option").all_inner_texts()) == ["admin", "exporter"]
        screenshot(page, "admin-user-bounded")
        page.get_by_role("button", name="Save", exact=True).click()
        page.wait_for_url("**/admin/auth/user/")
        bob.refresh_from_db()
        assert set(bob.groups.values_list("name", flat=True)) == {"viewer", "confirmer"}
    finally:
        context.close()
