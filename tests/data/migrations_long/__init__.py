"""The dashboard's migrations as they were before the first release squashed them into
evidence/migrations (issue 40): the long way, kept only so that tests/test_migrations.py can
migrate a database through them and compare it with one made from the squashed ones.
Never shipped (the wheel has no tests/), never run by a deployment."""
