"""The project's test data: files the tests read, and modules they import."""
