"""The Callproof dashboard site: settings, URLs, views, evidence export."""
