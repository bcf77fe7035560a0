"""Retention: what each run's policy says is due (plans), and doing it (actions): legal holds,
stripping bodies, archiving runs."""
