"""A re-import reads and checks only what changed, and ends where reading everything again would.

The importer keeps each run's receipts as one digest per bucket of call ids
(``rereading.receipt_buckets``); a re-import reads the buckets that differ, the calls
the ledger's new lines name, the open calls and the confirmed ones (``rereading.Scope``).
Each test changes real files the ways a writer, a crash or an attacker would, imports
the root, and compares every table with what an import that reads everything again
(``force``) makes of the same files.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import pytest
from django.db import connection

from evidence.ingest import importer, storing
from evidence.ingest.rereading import Known, Listing
from evidence.ingest.watch import Watch
from evidence.models import Call, Event, Finding, Run
from receipts import durable, protocol, runtime
from tests.helpers import CONTRACT, table_snapshot
from tests.volume import synthetic_run

pytestmark = pytest.mark.django_db

LATER = protocol.utc_now() + dt.timedelta(minutes=20)  # the demo's killed calls are stale by then


@pytest.fixture
def root(demo_root: Path) -> Path:
    synthetic_run(demo_root / "many", events=400, receipts=120, contract=CONTRACT)
    return demo_root


@pytest.fixture
def scoped_reads(monkeypatch) -> list[int | None]:
    """How many receipts each read of a run was asked to look at (``None``: all of them)."""
    asked: list[int | None] = []
    read = importer.read_run_files

    def counting(*args, **kwargs):
        names = kwargs.get("receipt_names")
        asked.append(None if names is None else len(names))
        return read(*args, **kwargs)

    monkeypatch.setattr(importer, "read_run_files", counting)
    return asked


def open_findings() -> list[tuple]:
    rows = Finding.objects.filter(closed_at__isnull=True)
    return sorted(rows.values_list("run__run_id", "code", "subject", "call_id", "detail", "severity"))


def state() -> tuple:
    return table_snapshot(), open_findings()


def assert_as_if_read_whole(root: Path) -> None:
    importer.root_import(root=root, now=LATER)
    after_some = state()
    importer.root_import(root=root, now=LATER, force=True)
    assert after_some == state()


def receipts_of(run: Path) -> list[Path]:
    return sorted(path for path in (run / "receipts").glob("*.json"))


def replace_same_bytes(run: Path, rng: random.Random) -> None:
    receipt = rng.choice(receipts_of(run))
    temp = receipt.with_name(f".{receipt.name}.tmp")
    shutil.copyfile(receipt, temp)
    os.replace(temp, receipt)


def tamper(run: Path, rng: random.Random) -> None:
    receipt = rng.choice(receipts_of(run))
    document = json.loads(receipt.read_bytes())
    document["args"] = {"path": "elsewhere.txt"}
    receipt.write_bytes(json.dumps(document).encode())


def remove(run: Path, rng: random.Random) -> None:
    receipt = rng.choice(receipts_of(run))
    receipt.rename(run / f".removed-{receipt.name}")  # a dot name the reader never considers


def restore(run: Path, rng: random.Random) -> None:
    for removed in sorted(run.glob(".removed-*")):
        removed.rename(run / "receipts" / removed.name.removeprefix(".removed-"))


def orphan(run: Path, rng: random.Random) -> None:
    receipt = rng.choice(receipts_of(run))
    shutil.copyfile(receipt, run / "receipts" / f"{rng.randbytes(32).hex()}.json")


def garbage(run: Path, rng: random.Random) -> None:
    rng.choice(receipts_of(run)).write_bytes(b'{"call_id": ')


def not_a_call_id(run: Path, rng: random.Random) -> None:
    (run / "receipts" / f"{'x' * (protocol.MAX_CALL_ID_LENGTH + 1)}.json").write_bytes(b"{}")


def commit_event(run: Path, rng: random.Random) -> None:
    receipt = rng.choice(receipts_of(run))
    durable.append_event(run, "receipt", {"call_id": receipt.stem, "status": "committed"})


def refuse_reuse(run: Path, rng: random.Random) -> None:
    durable.append_event(run, "reuse_refused", {"call_id": rng.choice(receipts_of(run)).stem})


def reuse(run: Path, rng: random.Random) -> None:
    durable.append_event(run, "call_reused", {"call_id": rng.choice(receipts_of(run)).stem})


def note(run: Path, rng: random.Random) -> None:
    durable.append_event(run, "note", {})


def confirm(run: Path, rng: random.Random) -> None:
    in_doubt = [path for path in receipts_of(run) if _status(path) in protocol.OPEN_STATUSES]
    if in_doubt:
        receipt = rng.choice(in_doubt)
        runtime.confirm_call(
            run,
            receipt.stem,
            resolution=rng.choice(["committed", "rejected"]),
            reason="checked the target",
            actor="tester",
            receipt_sha256=hashlib.sha256(receipt.read_bytes()).hexdigest(),
        )


def forge_confirmation(run: Path, rng: random.Random) -> None:
    """A confirmation nobody wrote, of a call that is not in doubt: checked against its receipt."""
    settled = [path for path in receipts_of(run) if _status(path) not in protocol.OPEN_STATUSES]
    if settled:
        (run / "confirmations").mkdir(exist_ok=True)
        (run / "confirmations" / rng.choice(settled).name).write_text('{"resolution": "rejected"}')


def _status(receipt: Path) -> str | None:
    try:
        return json.loads(receipt.read_bytes()).get("status")
    except (ValueError, AttributeError):
        return None


CHANGES = [
    replace_same_bytes, tamper, remove, restore, orphan, garbage, not_a_call_id,
    commit_event, refuse_reuse, reuse, note, confirm, forge_confirmation,
]  # fmt: skip


@pytest.mark.parametrize("changes", [[change] for change in CHANGES if change is not restore] + [[remove, restore]],
                         ids=lambda changes: "-".join(change.__name__ for change in changes))  # fmt: skip
def test_each_kind_of_change_ends_as_a_whole_read_would(root, scoped_reads, changes):
    importer.root_import(root=root, now=LATER)
    rng = random.Random(changes[-1].__name__)
    for change in changes:
        for run in sorted(path for path in root.iterdir() if (path / "receipts").is_dir()):
            if receipts_of(run):
                change(run, rng)
        scoped_reads.clear()
        assert_as_if_read_whole(root)
        some = [count for count in scoped_reads[: len(scoped_reads) // 2] if count is not None]
        assert some, "the re-import looked at some receipts, not all"


@pytest.mark.parametrize("seed", range(6))
def test_any_sequence_of_changes_ends_as_a_whole_read_would(root, scoped_reads, seed):
    rng = random.Random(seed)
    importer.root_import(root=root, now=LATER)
    runs = sorted(path for path in root.iterdir() if (path / "receipts").is_dir())
    for _ in range(5):
        for _ in range(rng.randint(1, 4)):
            run = rng.choice(runs)
            if receipts_of(run):
                rng.choice(CHANGES)(run, rng)
        assert_as_if_read_whole(root)
    assert any(count is not None for count in scoped_reads)


# What goes through a folder's entries (a rename, a file made or removed) or the ledger: what a
# watch's listing by names sees. An edit in place (``tamper``, ``garbage``) waits for the whole
# listing of the cold sweep (tests/test_watch_glance.py).
def not_a_call_id_put_in_place(run: Path, rng: random.Random) -> None:
    """``not_a_call_id`` as the writer puts files: a second time is a new file, not an edit in place."""
    temp = run / "receipts" / ".not-a-call-id.tmp"
    temp.write_bytes(b"{}")
    os.replace(temp, run / "receipts" / f"{'x' * (protocol.MAX_CALL_ID_LENGTH + 1)}.json")


SEEN_BY_NAMES = [
    replace_same_bytes, remove, restore, orphan, not_a_call_id_put_in_place, commit_event, refuse_reuse, reuse, note,
    confirm,
]  # fmt: skip


def import_as_a_watch(root: Path, watch: Watch) -> set[str]:
    """Each run of ``root`` imported as a watch's pass imports it (listed again by names when the
    watch kept its parts); how each was listed."""
    for run_dir in sorted(path for path in root.iterdir() if path.is_dir()):
        known = Known.of(Run.objects.get(run_id=run_dir.name))
        listing = watch.listed_again(run_dir, known, LATER) or Listing.of(run_dir, glance=True)
        report = importer.run_import(path=run_dir, now=LATER, listing=listing)
        assert not report.failed
        watch.keep(run_dir, listing, LATER)
    return set(watch.told_by.values())


@pytest.mark.parametrize("seed", range(4))
def test_any_sequence_of_changes_listed_again_by_names_ends_as_a_whole_read_would(root, scoped_reads, seed):
    rng = random.Random(seed)
    importer.root_import(root=root, now=LATER)
    watch = Watch(cold_sweep=dt.timedelta(hours=1))
    import_as_a_watch(root, watch)
    runs = sorted(path for path in root.iterdir() if (path / "receipts").is_dir())
    for _ in range(5):
        watch.told_by.clear()
        for _ in range(rng.randint(1, 4)):
            run = rng.choice(runs)
            if receipts_of(run):
                rng.choice(SEEN_BY_NAMES)(run, rng)
        assert import_as_a_watch(root, watch) == {"relisting"}
        after_some = state()
        importer.root_import(root=root, now=LATER, force=True)
        assert after_some == state()


def test_one_changed_receipt_of_many_is_the_only_one_read(root, scoped_reads):
    importer.root_import(root=root, now=LATER)
    many = root / "many"
    before = Run.objects.get(run_id="many").receipt_buckets
    buckets: dict[str, list[Path]] = {}
    for path in receipts_of(many):
        buckets.setdefault(path.name[:2], []).append(path)
    in_its_bucket = max(buckets.values(), key=len)
    assert len(in_its_bucket) >= 2, "the fixture's call ids share a bucket"
    receipt = in_its_bucket[-1]
    replace_same_bytes_at(receipt)
    scoped_reads.clear()
    importer.root_import(root=root, now=LATER)
    assert scoped_reads == [1], f"the changed receipt alone: not the {len(in_its_bucket)} of its bucket, nor the 120"
    after = Run.objects.get(run_id="many").receipt_buckets
    assert {bucket for bucket in before if before[bucket] != after[bucket]} == {receipt.name[:2]}


def test_a_receipt_named_json_and_names_not_utf8_do_not_stop_the_imports_after(root):
    """A receipt ``.json`` is in a bucket of no call id (""), and a name that is not UTF-8 gives a
    call id no database takes: each import after the first failed on them until they were gone."""
    importer.root_import(root=root, now=LATER)
    many = root / "many"
    (many / "receipts" / ".json").write_text("{}")
    (many / "receipts" / os.fsdecode(b"\xfe\xff.json")).write_text("{}")
    (many / "confirmations").mkdir(exist_ok=True)
    (many / "confirmations" / os.fsdecode(b"\xfe.json")).write_text("{}")
    for _ in range(2):
        durable.append_event(many, "note", {})
        assert_as_if_read_whole(root)
        assert not Finding.objects.filter(code="import_failed", closed_at__isnull=True).exists()


def test_a_run_imported_before_buckets_were_kept_is_read_whole_once(root, scoped_reads):
    importer.root_import(root=root, now=LATER)
    Run.objects.update(receipt_buckets={})  # as migration 0024 leaves the runs it finds
    replace_same_bytes_at(receipts_of(root / "many")[0])
    scoped_reads.clear()
    importer.root_import(root=root, now=LATER)
    assert scoped_reads == [None]
    assert Run.objects.get(run_id="many").receipt_buckets


def test_a_changed_contract_reads_every_receipt_again(root, scoped_reads):
    importer.root_import(root=root, now=LATER)
    many = root / "many"
    (many / "steer.json").write_text(json.dumps({"contract_sha256": "d" * 64}))
    scoped_reads.clear()
    assert_as_if_read_whole(root)
    assert scoped_reads[:2] == [0, None], "asked for none, it found the contract changed and read them all"
    assert Call.objects.filter(run__run_id="many", verification=protocol.VERIFIED).count() == 0


def replace_same_bytes_at(receipt: Path) -> None:
    temp = receipt.with_name(f".{receipt.name}.tmp")
    shutil.copyfile(receipt, temp)
    os.replace(temp, receipt)


def test_findings_of_receipts_not_read_again_stay_open(root, scoped_reads):
    """A file that could not be read keeps its finding while another bucket changes."""
    many = root / "many"
    first, *others = receipts_of(many)
    first.write_bytes(b"[")
    not_a_call_id(many, random.Random(0))
    importer.root_import(root=root, now=LATER)
    findings = open_findings()
    subjects = {subject for run_id, _, subject, *_ in findings if run_id == "many"}
    assert f"receipts/{first.name}" in subjects and len(subjects) == 2
    replace_same_bytes_at(next(path for path in others if path.name[:2] not in (first.name[:2], "xx")))
    scoped_reads.clear()
    importer.root_import(root=root, now=LATER)
    assert scoped_reads and scoped_reads[0] is not None and open_findings() == findings
    importer.root_import(root=root, now=LATER, force=True)
    assert open_findings() == findings


def test_an_open_call_turns_stale_when_only_time_has_passed(demo_root, scoped_reads):
    importer.root_import(root=demo_root)  # now: the killed calls are not stale yet
    stale = Finding.objects.filter(code="stale_call", closed_at__isnull=True)
    assert not stale.exists()
    scoped_reads.clear()
    assert_as_if_read_whole(demo_root)  # twenty minutes later, not a file changed
    open_calls = Call.objects.filter(status__in=protocol.OPEN_STATUSES).values("run").distinct().count()
    assert stale.exists() and scoped_reads[:open_calls] == [1] * open_calls, "the open call, no other"


def test_a_change_beside_an_open_call_checks_it_against_the_clock(demo_root, scoped_reads):
    importer.root_import(root=demo_root)
    for run in sorted(path for path in demo_root.iterdir() if (path / "receipts").is_dir()):
        if receipts_of(run):
            note(run, random.Random(0))
    assert_as_if_read_whole(demo_root)
    assert Finding.objects.filter(code="stale_call", closed_at__isnull=True).exists()


def planner_rows(model) -> float | None:
    """What PostgreSQL's planner thinks ``model``'s table holds (-1: never analysed); None on SQLite,
    where the importer asks for no statistics (and so no ``sqlite_stat1`` table may appear)."""
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            cursor.execute("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_stat1'")
            assert cursor.fetchone() == (0,), "an import analysed the SQLite database"
            return None
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [model._meta.db_table])
        return cursor.fetchone()[0]


def test_an_import_that_grows_a_table_leaves_the_planner_its_statistics(tmp_path, monkeypatch):
    monkeypatch.setattr(storing, "STATISTICS_AFTER_ROWS", 100)
    synthetic_run(tmp_path / "big", events=3_000, receipts=300, contract=CONTRACT)
    synthetic_run(tmp_path / "small", events=20, receipts=2, contract=CONTRACT)
    importer.run_import(path=tmp_path / "big")
    events_known, calls_known = planner_rows(Event), planner_rows(Call)
    if connection.vendor == "postgresql":  # before, both were -1 until autovacuum came by
        assert events_known == 3_000 and calls_known == 300
    importer.run_import(path=tmp_path / "small")  # 20 events: under the threshold, nothing asked
    assert (planner_rows(Event), planner_rows(Call)) == (events_known, calls_known)
