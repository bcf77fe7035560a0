from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The dashboard: its models, commands, template tags and admin.

    The label is the one the models were first made under, when they lived in the
    ``receipts`` package: it names every existing database's tables, migrations and
    permissions (``receipts.confirm_call``), so it stays.
    """

    name = "evidence"
    label = "receipts"
    verbose_name = "Receipts"
