"""Evidence out: the redacted bundle of one run (bundle), the exports people ask for (jobs), and
redaction."""
