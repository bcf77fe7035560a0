from django.apps import AppConfig


class ReceiptsConfig(AppConfig):
    name = "receipts"
    verbose_name = "Receipts"
