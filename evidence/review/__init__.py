"""Review: what needs a person and what they decide. Pages' reads (selectors, listings), the inbox,
triage, claims, settling a call in doubt, and alerts."""
