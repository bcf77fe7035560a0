"""URLs of the dashboard (INTERFACES.md lists the stable ones)."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.urls import path
from django.views.i18n import set_language

from evidence.web import api, views
from evidence.web.forms import LoginForm
from evidence.web.views import notifications, ship

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    # Before the API's own URLs: a page behind the login like every other, not the API's 401.
    path("api/docs", views.api_docs, name="api_docs"),
    path("api/", api.urls()),
    # callproof ship: agent hosts with a host key (evidence/ingest/shipping.py)
    path("ship/v1/push", ship.push, name="ship_push"),
    path("ship/v1/report", ship.report, name="ship_report"),
    path("ship/v1/removal", ship.removal, name="ship_removal"),
    path("ship/v1/instructions", ship.instructions, name="ship_instructions"),
    path("ship/v1/acks", ship.acks, name="ship_acks"),
    path("ship/v1/stopped", ship.stopped, name="ship_stopped"),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(authentication_form=LoginForm), name="login"),
    # A person with no role must still be able to log out.
    path("accounts/logout/", login_not_required(auth_views.LogoutView.as_view()), name="logout"),
    # The language switcher: a cookie, so the login page offers it too.
    path("language/", login_not_required(set_language), name="set_language"),
    path("", views.runs, name="runs"),
    path("search/", views.search, name="search"),
    path("findings/", views.findings, name="findings"),
    path("reservations/", views.reservations, name="reservations"),
    path("findings/<int:finding_id>/triage/", views.triage_page, name="triage"),
    path("findings/<int:finding_id>/triage/act/", views.triage_action, name="triage_action"),
    path("runs/<str:run_id>/", views.run, name="run"),
    path("runs/<str:run_id>/replay/", views.replay, name="replay"),
    path("runs/<str:run_id>/evidence.zip", views.run_evidence, name="run_evidence"),
    path("runs/<str:run_id>/export/", views.export_request, name="export_request"),
    path("runs/<str:run_id>/exports/", views.export_panel, name="export_panel"),
    path("runs/<str:run_id>/exports/<int:export_id>.zip", views.export_download, name="export_download"),
    path("runs/<str:run_id>/hold/", views.legal_hold, name="legal_hold"),
    path("runs/<str:run_id>/calls/<str:call_id>/", views.call, name="call"),
    path("runs/<str:run_id>/calls/<str:call_id>/confirm/", views.confirm, name="confirm"),
    path("runs/<str:run_id>/calls/<str:call_id>/withdraw/", views.withdraw, name="withdraw"),
    path("audit/", views.audit, name="audit"),
    path("inbox/", views.inbox_page, name="inbox"),
    path("inbox/claim/", views.claim_action, name="claim"),
    path("retention/", views.retention_page, name="retention"),
    path("hosts/", views.hosts_page, name="hosts"),
    path("notifications/", notifications.notifications_page, name="notifications"),
    path("notifications/rules/", notifications.rule_add, name="notification_rule_add"),
    path("notifications/rules/<int:rule_id>/", notifications.rule_action, name="notification_rule_action"),
]

handler400 = "evidence.web.views.errors.bad_request"
handler403 = "evidence.web.views.errors.forbidden"
