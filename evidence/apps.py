import importlib
from collections.abc import Iterable

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _

from receipts import doubt


class DashboardConfig(AppConfig):
    """The dashboard: its models, commands, template tags and admin.

    The label is the one the models were first made under, when they lived in the
    ``receipts`` package: it names every existing database's tables, migrations and
    permissions (``receipts.confirm_call``), so it stays.
    """

    name = "evidence"
    label = "receipts"
    verbose_name = _("Receipts")

    def ready(self) -> None:
        from evidence.lib import people

        register_evidence_adapters(settings.EVIDENCE_ADAPTERS)
        people.connect()


def register_evidence_adapters(specs: Iterable[str]) -> None:
    """Build the adapters ``EVIDENCE_ADAPTERS`` names and give the doubt panel their evidence.

    A factory returns an adapter or a list of them, built with targets this
    deployment configures. One that fails stops start-up with what went wrong.
    """
    for spec in specs:
        module, _, attribute = spec.partition(":")
        try:
            built = getattr(importlib.import_module(module), attribute)()
        except Exception as error:
            raise ImproperlyConfigured(
                f"EVIDENCE_ADAPTERS: {spec} built no adapter: {type(error).__name__}: {error}"
            ) from error
        for adapter in built if isinstance(built, (list, tuple)) else [built]:
            if not isinstance(getattr(adapter, "name", None), str) or not callable(getattr(adapter, "evidence", None)):
                raise ImproperlyConfigured(
                    f"EVIDENCE_ADAPTERS: {spec} gave {adapter!r}, which has no name and evidence"
                )
            doubt.register_adapter(adapter)
