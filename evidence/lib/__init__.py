"""What every room of the dashboard uses: hosts, a run's counts, keyset pages, roles and people, logs,
the client's address. It imports only the models and the writer/reader, never a room."""
