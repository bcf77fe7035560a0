"""The dashboard's own formats (FORMAT_MODULE_PATH), over Django's for each language.

A time is shown to the second, in UTC, as the ledger holds it: "2026-12-03 06:49:32 UTC"
in English, "2026年12月3日 06:49:32 UTC" in Chinese. Counts group digits in threes in both
languages (Django's Chinese default groups none): event counts reach millions, and
engineers reading Chinese read 1,000,000 in consoles every day.
"""
