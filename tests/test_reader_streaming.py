"""The reader with a sink (``read_run_files(sink=...)``): the calls handed over in bounded batches,
each cross-checked, give the records, decisions and findings of a read that keeps them all.

Generated runs mix what every cross-check looks at: receipts the ledger names or not, calls the
ledger names with no receipt, unreadable files, commits the ledger never recorded, refused reuses,
open calls (stale or not) and confirmations, valid or not; the batch size goes down to one."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from receipts import protocol
from receipts.reader import CallRecord, LedgerCursor, RunFiles, diskset, read_ledger, read_run_files
from receipts.reader import files as files_module
from receipts.reader import spill as spill_module
from receipts.reader.diskset import DiskSet
from receipts.replay import apply_decisions, decide_calls, resolutions_of
from tests.helpers import CONTRACT
from tests.volume import _append_chained, _stamp

NOW = protocol.parse_time("2026-11-29T14:00:00Z")

# What one call of a generated run is: its receipt file, and what the ledger says of it.
RECEIPT_FILES = ("committed", "prepared", "unknown", "rejected", "unreadable", "none")
LEDGER_SAYS = ("commit", "receipt_only", "refused", "refused_then_reused", "nothing")


@st.composite
def runs(draw) -> tuple[list[tuple[str, str, str]], int]:
    """Calls as (receipt file, what the ledger says, confirmation), and a batch size."""
    calls = draw(
        st.lists(
            st.tuples(
                st.sampled_from(RECEIPT_FILES),
                st.sampled_from(LEDGER_SAYS),
                st.sampled_from(("none", "valid", "invalid")),
            ),
            max_size=25,
        )
    )
    return calls, draw(st.integers(min_value=1, max_value=8))


def write_run(run_dir: Path, calls: list[tuple[str, str, str]]) -> None:
    (run_dir / "receipts").mkdir(parents=True)
    (run_dir / "confirmations").mkdir()
    (run_dir / "steer.json").write_text(json.dumps({"contract_sha256": CONTRACT}))
    (run_dir / "state.json").write_text(json.dumps({"name": "running", "attempts": 1}))
    events: list[dict] = []
    for number, (receipt_file, ledger_says, confirmation) in enumerate(calls):
        args = {"path": f"file-{number}.txt"}
        call_id = protocol.make_call_id(CONTRACT, 1, "write_file", args, "1.0.0", protocol.IDENTITY_V2)
        status = receipt_file if receipt_file not in ("unreadable", "none") else "committed"
        receipt = {
            "call_id": call_id, "identity": protocol.IDENTITY_V2, "contract_sha256": CONTRACT, "attempt": 1,
            "tool": "write_file", "tool_version": "1.0.0", "args": args, "input_sha256": protocol.input_sha256(args),
            "status": status, "created_at": "2026-11-29T12:00:00Z",
            # Half the open calls are stale at NOW, half not yet (they set next_stale_at).
            "updated_at": "2026-11-29T12:00:00Z" if number % 2 else "2026-11-29T13:59:00Z",
        }  # fmt: skip
        if status == "committed":
            result = {"path": f"workspace/{args['path']}"}
            receipt |= {"result": result, "output_sha256": protocol.input_sha256(result)}
        path = run_dir / "receipts" / f"{call_id}.json"
        if receipt_file == "unreadable":
            path.write_bytes(b'{"call_id": ')
        elif receipt_file != "none":
            path.write_bytes(protocol.canonical_json(receipt))
        if confirmation != "none" and receipt_file != "none":
            sha = protocol.sha256_hex(path.read_bytes()) if confirmation == "valid" else "0" * 64
            document = {
                "schema": protocol.CONFIRMATION_SCHEMA, "call_id": call_id, "resolution": "committed",
                "receipt_sha256": sha, "reason": "seen in the target",
                "confirmation_id": protocol.confirmation_id(call_id, "committed", sha),
            }  # fmt: skip
            (run_dir / "confirmations" / f"{call_id}.json").write_text(json.dumps(document))
        said = {"type": "receipt", "call_id": call_id, "tool": "write_file", "attempt": 1}
        if ledger_says == "commit":
            events.append({**said, "status": "committed"})
        elif ledger_says == "receipt_only":
            events.append({**said, "status": "prepared"})
        elif ledger_says.startswith("refused"):
            events += [{**said, "status": "committed"}, {"type": "reuse_refused", "call_id": call_id}]
            if ledger_says == "refused_then_reused":
                events.append({"type": "call_reused", "call_id": call_id})
    numbered = ({**event, "seq": seq, "ts": _stamp(seq)} for seq, event in enumerate(events, start=1))
    (run_dir / "events.jsonl").write_bytes(b"")
    _append_chained(run_dir / "events.jsonl", numbered)


def whole_ledger(run_dir: Path, on_disk: str | None = None) -> LedgerCursor:
    """The cursor after the whole ledger; its sets of calls ``on_disk`` (a SQLite file's
    ``DiskSet``s, a few ids held at a time) as the importer's child reads them, if given."""
    cursor = LedgerCursor()
    if on_disk is not None:
        cursor = LedgerCursor(
            call_ids=DiskSet(on_disk, "call_ids", buffered=3),
            committed_call_ids=DiskSet(on_disk, "committed_call_ids", buffered=3),
            disputed_call_ids=DiskSet(on_disk, "disputed_call_ids", buffered=3),
        )
    for batch in read_ledger(run_dir, cursor):
        cursor = batch.cursor
    return cursor


def finding_key(finding) -> str:
    return json.dumps(dataclasses.asdict(finding), sort_keys=True, default=str)


def decided_elsewhere(files: RunFiles) -> dict[str, tuple[str, str]]:
    """A decision not yet delivered for every other call, on the receipt as read (or another)."""
    return {
        call.call_id: ("rejected", call.file_sha256 if number % 4 else "f" * 64)
        for number, call in enumerate(files.calls)
        if number % 2
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_a_read_in_batches_gives_what_a_whole_read_gives(run):
    calls, batch = run
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        write_run(run_dir, calls)
        cursor = whole_ledger(run_dir)
        whole = read_run_files(run_dir, ledger=cursor, now=NOW)
        decided = decided_elsewhere(whole)
        apply_decisions(whole, decided=decided)

        handed: list[list[CallRecord]] = []
        held: list[int] = []

        def sink(batch_calls: list[CallRecord], files: RunFiles) -> None:
            held.append(len(batch_calls) + len(files.calls))
            decide_calls(batch_calls, resolutions_of(files.confirmations), decided=decided)
            handed.append(batch_calls)

        streamed = read_run_files(run_dir, ledger=cursor, now=NOW, sink=sink, calls_batch=batch)
        handed_in_memory = handed
        handed = []
        on_disk = str(Path(tmp) / "calls.sqlite3")
        try:
            disk_cursor = whole_ledger(run_dir, on_disk)
            for name in ("call_ids", "committed_call_ids", "disputed_call_ids"):
                assert isinstance(getattr(disk_cursor, name), DiskSet)
                assert set(getattr(disk_cursor, name)) == getattr(cursor, name)
            against_disk = read_run_files(run_dir, ledger=disk_cursor, now=NOW, sink=sink, calls_batch=batch)
        finally:
            diskset.release(on_disk)

    assert [vars(call) for part in handed for call in part] == [vars(call) for call in whole.calls]
    assert [vars(call) for part in handed_in_memory for call in part] == [vars(call) for call in whole.calls]
    assert sorted(map(finding_key, streamed.findings)) == sorted(map(finding_key, whole.findings))
    assert sorted(map(finding_key, against_disk.findings)) == sorted(map(finding_key, whole.findings))
    assert streamed.calls == []
    assert dataclasses.replace(streamed, findings=[]) == dataclasses.replace(whole, calls=[], findings=[])
    assert all(len(part) <= batch for part in handed)
    assert all(count <= 2 * batch for count in held), "the reader holds at most two batches of records"


def test_the_reader_never_holds_more_than_its_batches(tmp_path, monkeypatch):
    """Counted, not timed: every batch set aside, or handed over, has at most ``calls_batch`` records."""
    calls = [("committed", "commit", "none")] * 40 + [("none", "commit", "none")] * 9
    calls.append(("unreadable", "commit", "none"))
    write_run(tmp_path / "run", calls)
    spilled: list[tuple[int, int]] = []
    put = spill_module.Spill.put

    def counted(self, batch) -> None:
        spilled.append((len(batch[0]), len(batch[1])))
        put(self, batch)

    monkeypatch.setattr(spill_module.Spill, "put", counted)
    handed: list[int] = []
    files = read_run_files(
        tmp_path / "run",
        ledger=whole_ledger(tmp_path / "run"),
        now=NOW,
        sink=lambda calls, _: handed.append(len(calls)),
        calls_batch=6,
    )
    # 41 receipt files (one unreadable: no record) in batches of six: six set aside, the last five
    # kept until the ledger is known; then the nine calls the ledger names with no file.
    assert [files_in_batch for _, files_in_batch in spilled] == [6] * 6
    assert all(records <= 6 for records, _ in spilled)
    assert len(handed) == 9 and sum(handed) == 49 and max(handed) <= 6 and handed[-2:] == [6, 3]
    assert files.calls == [] and len(files.unreadable_receipts) == 1


def test_a_whole_read_keeps_every_record_and_sets_nothing_aside(tmp_path, monkeypatch):
    write_run(tmp_path / "run", [("committed", "commit", "none")] * 12)
    monkeypatch.setattr(spill_module, "Spill", None)  # a whole read must not need one
    files = read_run_files(tmp_path / "run", ledger=whole_ledger(tmp_path / "run"), now=NOW)
    assert len(files.calls) == 12 and not files.findings


def test_a_reader_with_a_sink_keeps_only_the_digests_a_confirmation_needs(tmp_path, monkeypatch):
    calls = [("committed", "commit", "none")] * 5 + [("committed", "commit", "valid")]
    write_run(tmp_path / "run", calls)
    given_digests: list[set[str]] = []
    read_confirmations = files_module.read_confirmations

    def seen(run, dir_fd, receipt_shas, signing_key):
        given_digests.append(set(receipt_shas))
        return read_confirmations(run, dir_fd, receipt_shas, signing_key)

    monkeypatch.setattr(files_module, "read_confirmations", seen)
    handed: list[CallRecord] = []
    files = read_run_files(
        tmp_path / "run",
        ledger=whole_ledger(tmp_path / "run"),
        now=NOW,
        sink=lambda part, _: handed.extend(part),
        calls_batch=2,
    )
    assert [confirmation.valid for confirmation in files.confirmations] == [True]
    assert given_digests == [{files.confirmations[0].call_id}]
    assert len(handed) == 6 and not files.findings
    read_run_files(tmp_path / "run", ledger=whole_ledger(tmp_path / "run"), now=NOW)
    assert len(given_digests[1]) == 6, "a whole read keeps every digest, as before"
