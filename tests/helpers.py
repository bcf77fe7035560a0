"""What several test modules use that is not a fixture: paths, the test data, small readers."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path

from receipts import protocol

PROJECT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
CONTRACT = protocol.sha256_hex(b"test contract")
# The columns an import stamps with its own time (and the hot set's): two imports of the same files
# differ only there.
IMPORT_TIMESTAMPS = ("imported_at", "first_seen", "last_seen", "closed_at", "checked_at", "changed_at", "abandoned_at")


def data_path(*parts: str) -> Path:
    """A file of the project's test data (vectors, the JSON corpus, expected downloads), in tests/data."""
    return DATA.joinpath(*parts)


def corpus_files() -> list[Path]:
    """JSONTestSuite's parsing cases (MIT, see tests/data/jsontestsuite/LICENSE)."""
    return sorted(data_path("jsontestsuite", "test_parsing").iterdir())


def import_as_seen_later(root: Path) -> None:
    """Import as a person would see the demo 20 minutes after it ran: the killed calls are stale."""
    from evidence.ingest import importer

    importer.root_import(root=root, now=protocol.utc_now() + dt.timedelta(minutes=20))


def content(response) -> str:
    """A response's body as text, streamed or not."""
    return b"".join(response.streaming_content).decode() if response.streaming else response.content.decode()


def first_call_of(run_id: str):
    """The run's call with the smallest call_id."""
    from evidence.models import Call

    return Call.objects.filter(run__run_id=run_id).order_by("call_id").first()


def join(user, *roles: str):
    """Give ``user`` these roles (evidence/lib/roles.py); returns the user.

    The data migration makes the groups, but a transactional test's flush empties
    every table, and only permissions are made again after it: ``ensure_roles``
    makes the groups again if they are gone (``test_roles`` checks the migration).
    """
    from evidence.lib.roles import ensure_roles

    groups = ensure_roles()
    user.groups.add(*(groups[role] for role in roles))
    return user


def table_snapshot() -> dict[str, list[tuple]]:
    """Every column of every receipts table, but the import's own timestamps."""
    from evidence.models import Call, Event, Finding, Run, Submission

    snapshot = {}
    for model in (Run, Call, Submission, Event, Finding):
        names = [f.attname for f in model._meta.concrete_fields if f.attname not in IMPORT_TIMESTAMPS]
        snapshot[model.__name__] = sorted(
            tuple(json.dumps(value, sort_keys=True, default=str) for value in row)
            for row in model.objects.values_list(*names)
        )
    return snapshot


def export_through_the_page(client, run_id: str):
    """Ask for the run's evidence on its page, make it as the worker would (in this process:
    tests/test_tasks.py runs the real worker), and download it: the zip's response."""
    from evidence.export import jobs
    from evidence.models import Export

    assert client.post(f"/runs/{run_id}/export/").status_code == 303
    export = Export.objects.filter(run__run_id=run_id).latest("pk")
    jobs.make_export.call(export.pk)
    return client.get(f"/runs/{run_id}/exports/{export.pk}.zip")


def until(condition: Callable[[], object], what: str, seconds: float = 60) -> object:
    """Wait for ``condition`` to hold: a deadline against a hang, never an assertion about speed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"waited {seconds} s for {what}")


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, as a ``NAME:pause`` failpoint stops itself)."""
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "T"


def downloaded(response) -> bytes:
    """A file download's bytes (read whole, which also closes the file)."""
    return b"".join(response.streaming_content)


def every_entry(folder: Path) -> dict[str, bytes | None]:
    """Each file's bytes and each folder (None) below ``folder``, by its relative name: what a
    test compares to see that nothing was made or written there."""
    entries = sorted(folder.rglob("*"))
    return {str(path.relative_to(folder)): None if path.is_dir() else path.read_bytes() for path in entries}


def state_badge(name: str) -> str:
    """A state's badge as pages draw it in English: its tone, its glyph, its word
    (receipts.states; tests/test_templatetags.py holds the markup itself)."""
    from receipts import states

    state = states.STATES[name]
    glyph = f'<span class="glyph" aria-hidden="true">{state.glyph}</span>'
    return f'class="badge badge-{state.tone} state">{glyph}{name}</span>'


def admin_change_form(user, **fields) -> dict:
    """The admin's change form of ``user`` as the page posts it, with ``fields`` added or replaced."""
    data = {
        "username": user.username, "first_name": user.first_name, "last_name": user.last_name,
        "email": user.email, "groups": [group.pk for group in user.groups.all()],
        "date_joined_0": "2026-12-01", "date_joined_1": "00:00:00", "_save": "Save",
    }  # fmt: skip
    if user.is_active:
        data["is_active"] = "on"
    return data | fields


def settle_form(call, resolution: str = "committed", reason: str = "the log shows it", **more: str) -> dict[str, str]:
    """The call page's settle form as a person fills it in (``more``: the boxes they tick)."""
    return {
        "resolution": resolution,
        "reason": reason,
        "confirm_call_id": call.call_id[:12],
        "receipt_sha256": call.file_sha256,
        **more,
    }
