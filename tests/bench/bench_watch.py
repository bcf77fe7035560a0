"""Watch benchmark (run by hand; not part of the suite).

Builds (once, cached under tests/bench/out/) a runs root of 20,000 small runs,
finished, of which 50 are running; imports it whole into a fresh database, then
times, in this process, with the importer's own functions:
- a full pass, nothing changed: what the cold sweep costs (every run's files
  stat-ed), and every pass of a watch cost before the hot set;
- a full pass after each of the 50 running runs was appended events: a watch's
  pass before the hot set, on a root where 50 runs are writing;
- the first pass of a watch (every listed name looked up once, no file of a cold run read);
- a hot pass after each of the 50 running runs was appended events (the
  events imported), and a hot pass with nothing changed right after (each hot
  run's full fingerprint: its files were just written);
- with --big-receipts N, one more running run of N receipts (10 events each);
- a hot pass with nothing changed once the files are older than the glance's
  settle (each hot run told unchanged at a glance), the same pass made to list
  every hot run again by names and inodes (its glance forgotten), and made to
  take every hot run's full fingerprint (its parts forgotten too);
each measurement but the first import the median of --repeat passes (the full
pass without a change: of --repeat + 1, the first one right after the import).

With --latency N, then: a real ``import_runs --watch`` (default interval) on the
root, and N times an event appended to a running run (a writer's command ends
with its ledger line), the time from the append's end until the event is in the
database (polled every 5 ms; the page that shows it adds its own render time),
as p50 and p95. With --big-writing too, the same again with the big run written
to meanwhile (a call a second: a receipt put in place and its ledger line), and then
the big run's own writes (N/5 of them).

    python tests/bench/bench_watch.py [--runs N] [--active N] [--repeat N] [--big-receipts N]
                                      [--latency N [--big-writing] [--latency-only]] [--postgres]

With --latency-only, only the latencies, on the database the last run imported
(the code of now against a root imported once: a first import at full size takes
20 minutes).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "out"
CONTRACT = "c" * 64
# The benchmarks' own PostgreSQL database: made again from nothing by each run of this script.
PG_SERVER = "postgres://postgres@127.0.0.1:5432"
PG_NAME = "imp"
BIG = "big-run"


def build_root(runs: int, active: int, big_receipts: int) -> Path:
    """``runs`` run directories of 20 events and 2 receipts each, the first ``active`` running;
    with ``big_receipts``, one more running run (``big-run``) of that many receipts."""
    root = OUT / (f"watch-root-{runs}-{active}" + (f"-big-{big_receipts}" if big_receipts else ""))
    done = root / ".built"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    from tests.volume import synthetic_run

    started = time.perf_counter()
    for number in range(runs):
        run_dir = root / f"run-{number:05d}"
        synthetic_run(run_dir, events=20, receipts=2, contract=CONTRACT)
        if number < active:
            (run_dir / "state.json").write_text(json.dumps({"name": "running", "attempts": 1}))
    if big_receipts:
        from tests.bench.bench_import import build_run

        # bench_import's run of that size, built once: its receipts hard-linked, and what this
        # benchmark writes (the ledger it appends to, state.json) copies of its own.
        big = build_run(10 * big_receipts, big_receipts)
        subprocess.run(["cp", "-al", str(big), str(root / BIG)], check=True)
        for name in ("events.jsonl", "state.json"):
            (root / BIG / name).unlink()
            shutil.copyfile(big / name, root / BIG / name)
        (root / BIG / "state.json").write_text(json.dumps({"name": "running", "attempts": 1}))
    done.touch()  # a dot-name: no reader lists it
    print(f"built {runs:,} runs in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return root


def fresh_database(postgres: bool) -> str:
    if postgres:
        import psycopg

        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {PG_NAME}")
            conn.execute(f"CREATE DATABASE {PG_NAME}")
        url = f"{PG_SERVER}/{PG_NAME}"
    else:
        path = OUT / "bench_watch.sqlite3"
        for suffix in ("", "-wal", "-shm", ".import.lock"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        url = f"sqlite:///{path}"
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "1"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], env=env, cwd=PROJECT, check=True)
    return url


def append_now(run_dir: Path, count: int) -> int:
    """``count`` chained note events stamped now: the run is writing. The last one's seq."""
    from receipts import protocol
    from tests.volume import _append_chained, last_line

    last = json.loads(last_line(run_dir / "events.jsonl"))
    stamp = protocol.format_time(protocol.utc_now())
    seqs = range(last["seq"] + 1, last["seq"] + 1 + count)
    _append_chained(run_dir / "events.jsonl", ({"seq": seq, "ts": stamp, "type": "note"} for seq in seqs))
    return seqs[-1]


def call_now(run_dir: Path, number: int) -> None:
    """A call committed now, as the writer puts it: its receipt written beside its place and
    renamed into it, then its ledger line (a new file in ``receipts/``, in the bucket its call
    id falls in)."""
    from receipts import protocol
    from tests.volume import _append_chained, last_line

    args = {"path": f"busy-{number}.txt", "content": str(number)}
    call_id = protocol.make_call_id(CONTRACT, 1, "write_file", args, "1.0.0", protocol.IDENTITY_V2)
    stamp = protocol.format_time(protocol.utc_now())
    receipt = {
        "call_id": call_id, "identity": protocol.IDENTITY_V2, "contract_sha256": CONTRACT, "attempt": 1,
        "tool": "write_file", "tool_version": "1.0.0", "args": args, "input_sha256": protocol.input_sha256(args),
        "status": "committed", "result": {}, "output_sha256": protocol.input_sha256({}),
        "created_at": stamp, "updated_at": stamp,
    }  # fmt: skip
    temp = run_dir / "receipts" / f".{call_id}.json.tmp"
    temp.write_bytes(protocol.canonical_json(receipt))
    os.replace(temp, run_dir / "receipts" / f"{call_id}.json")
    seq = json.loads(last_line(run_dir / "events.jsonl"))["seq"] + 1
    event = {"seq": seq, "ts": stamp, "type": "receipt", "call_id": call_id, "tool": "write_file", "attempt": 1,
             "status": "committed"}  # fmt: skip
    _append_chained(run_dir / "events.jsonl", iter([event]))


def watch_latency(
    root: Path, run_dir: Path, trials: int, host, busy: Path | None = None
) -> tuple[list[float], list[float]]:
    """A real ``import_runs --watch`` on ``root`` (default interval), and ``trials`` times an event
    appended to ``run_dir``: the seconds from the append's end until the event is a row.

    With ``busy``, that run is written to meanwhile (a call a second, its receipt and its ledger
    line, as a writer at work), and then it is timed itself, a fifth as many times: the second
    list (empty without it)."""
    from evidence.lib import hosts
    from evidence.models import Event
    from receipts import protocol

    hosts.stopped(host)  # this process's passes were the host's watch: the child's now

    def seconds_until_stored(run_dir: Path, seq: int) -> float:
        written = time.perf_counter()
        while not Event.objects.filter(run__run_id=run_dir.name, seq=seq).exists():
            if time.perf_counter() - written > 300:
                raise SystemExit(f"event {seq} of {run_dir.name} not imported within 300 s")
            time.sleep(0.005)
        return time.perf_counter() - written

    command = [sys.executable, "manage.py", "import_runs", str(root), "--watch"]
    log = (OUT / "bench_watch_latency.log").open("w")
    # The watch's clock as the passes' above: the root's first import is past, and every run
    # but the running ones is cold (right after a bulk import, every run is hot for a while).
    clock = protocol.format_time(protocol.utc_now() + dt.timedelta(minutes=16))
    env = {**os.environ, "RECEIPTS_CLOCK": clock}
    child = subprocess.Popen(command, cwd=PROJECT, stdout=log, stderr=log, env=env)
    stop_writing = threading.Event()

    def write_busy() -> None:
        assert busy is not None
        number = 0
        while not stop_writing.wait(1.0):
            number += 1
            call_now(busy, number)

    writer = threading.Thread(target=write_busy, daemon=True) if busy else None
    try:
        seconds_until_stored(run_dir, append_now(run_dir, 1))  # the first pass: every name looked up once
        if writer:
            writer.start()
        latencies = []
        chance = random.Random(41)
        for _ in range(trials):
            time.sleep(chance.uniform(0.2, 1.5))  # anywhere in the watch's cycle
            latencies.append(seconds_until_stored(run_dir, append_now(run_dir, 1)))
        busy_latencies = []
        if writer and busy:
            stop_writing.set()
            writer.join()
            for _ in range(max(1, trials // 5)):
                time.sleep(chance.uniform(0.2, 1.5))
                busy_latencies.append(seconds_until_stored(busy, append_now(busy, 1)))
        return latencies, busy_latencies
    finally:
        stop_writing.set()
        child.terminate()
        child.wait(timeout=300)
        log.close()


def existing_database(postgres: bool) -> str:
    """The database the last run of this benchmark imported the root into (``--latency-only``)."""
    if postgres:
        return f"{PG_SERVER}/{PG_NAME}"
    path = OUT / "bench_watch.sqlite3"
    if not path.exists():
        raise SystemExit(f"{path} is not there: run the benchmark once without --latency-only")
    return f"sqlite:///{path}"


def print_latencies(latencies: list[float], big_latencies: list[float], *, beside: bool = False) -> None:
    label = f"write to stored, {BIG} written to meanwhile" if beside else "write to stored, a real watch"
    print(f"  {label}, {len(latencies)} writes: p50 {percentile(latencies, 0.5):.3f} s, "
          f"p95 {percentile(latencies, 0.95):.3f} s, worst {max(latencies):.3f} s")  # fmt: skip
    if big_latencies:
        p50 = percentile(big_latencies, 0.5)
        print(f"  write to stored in {BIG} itself, {len(big_latencies)} writes: p50 {p50:.3f} s, "
              f"worst {max(big_latencies):.3f} s")  # fmt: skip
    print(json.dumps({"beside" if beside else "quiet": latencies, "big": big_latencies}))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def timed(function, *args, **kwargs) -> tuple[float, object]:
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--active", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--big-receipts", type=int, default=0, help="one more running run of N receipts")
    parser.add_argument("--latency", type=int, default=0, help="N writes timed until stored by a real watch")
    parser.add_argument("--big-writing", action="store_true", help=f"{BIG} written to (a call a second) meanwhile")
    parser.add_argument("--postgres", action="store_true", help=f"measure on {PG_SERVER}/{PG_NAME} instead of SQLite")
    parser.add_argument("--latency-only", action="store_true",
                        help="only the latencies, on the database the last run of this benchmark imported")  # fmt: skip
    options = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    sys.path.insert(0, str(PROJECT))
    root = build_root(options.runs, options.active, options.big_receipts)
    url = existing_database(options.postgres) if options.latency_only else fresh_database(options.postgres)
    os.environ.update({"DATABASE_URL": url, "DJANGO_DEBUG": "1", "DJANGO_SETTINGS_MODULE": "evidence.settings"})
    import django

    django.setup()
    from evidence.ingest import importer
    from evidence.ingest.watch import Watch
    from evidence.lib import hosts
    from evidence.models import Event
    from receipts import protocol

    host = hosts.register(runs_root=root, watching=True)
    active = [root / f"run-{number:05d}" for number in range(options.active)]
    if options.latency_only:
        print_latencies(*watch_latency(root, active[0], options.latency, host))
        if options.big_writing and options.big_receipts:
            print_latencies(*watch_latency(root, active[0], options.latency, host, root / BIG), beside=True)
        return
    for run_dir in active + ([root / BIG] if options.big_receipts else []):
        append_now(run_dir, 1)  # writing now: not abandoned
    first_import, _ = timed(importer.root_import, root=root, host=host)
    # A watch's pass before the hot set: every run's files stat-ed, only the changed ones reported.
    full, report = timed(importer.root_import, root=root, host=host, report_unchanged=False)
    assert not report.runs  # type: ignore[attr-defined]
    # The watch's passes a quarter of an hour on: the one-off import's changes are past.
    later = dt.timedelta(minutes=15)
    watch = Watch.from_settings()
    first_watch, report = timed(importer.root_import, root=root, host=host, watch=watch, now=protocol.utc_now() + later)
    assert len(report.runs) == options.active + bool(options.big_receipts)  # type: ignore[attr-defined]

    def changed_pass(watch: Watch | None) -> float:
        events = Event.objects.count()
        for run_dir in active:
            append_now(run_dir, 10)
        seconds, report = timed(importer.root_import, root=root, host=host, watch=watch,
                                now=protocol.utc_now() + later, report_unchanged=False)  # fmt: skip
        assert sum(run.changed for run in report.runs) == options.active  # type: ignore[attr-defined]
        assert Event.objects.count() == events + 10 * options.active
        return seconds

    full_passes, full_changed_passes, changed_passes, quiet_passes = [full], [], [], []
    for _ in range(options.repeat):
        seconds, report = timed(importer.root_import, root=root, host=host, report_unchanged=False)
        assert not report.runs  # type: ignore[attr-defined]
        full_passes.append(seconds)
        full_changed_passes.append(changed_pass(None))
        changed_passes.append(changed_pass(watch))
        seconds, report = timed(importer.root_import, root=root, host=host, watch=watch,
                                now=protocol.utc_now() + later, report_unchanged=False)  # fmt: skip
        assert not report.runs  # type: ignore[attr-defined]
        quiet_passes.append(seconds)
    # Once the files are older than the glance's settle, a quiet hot run is told unchanged at a
    # glance; the same pass with the glances forgotten takes every hot run's full fingerprint.
    time.sleep(watch.settle.total_seconds() + 0.5)
    importer.root_import(root=root, host=host, watch=watch, now=protocol.utc_now() + later, report_unchanged=False)
    glance_passes: list[float] = []
    relisting_passes: list[float] = []
    fingerprint_passes: list[float] = []
    for _ in range(options.repeat):
        for passes, told in ((glance_passes, "glance"), (relisting_passes, "relisting"),
                             (fingerprint_passes, "fingerprint")):  # fmt: skip
            if told != "glance":
                watch.proved.clear()  # the glance forgotten: listed again by names and inodes
            if told == "fingerprint":
                watch.kept.clear()  # the parts forgotten too: every file stat-ed
            seconds, report = timed(importer.root_import, root=root, host=host, watch=watch,
                                    now=protocol.utc_now() + later, report_unchanged=False)  # fmt: skip
            assert not report.runs and set(watch.told_by.values()) == {told}, watch.told_by  # type: ignore[attr-defined]
            passes.append(seconds)
    glance, fingerprint = statistics.median(glance_passes), statistics.median(fingerprint_passes)
    relisting = statistics.median(relisting_passes)
    latencies: list[float] = []
    beside_latencies: list[float] = []  # with the big run written to meanwhile
    big_latencies: list[float] = []
    if options.latency:
        latencies, _ = watch_latency(root, active[0], options.latency, host)
        if options.big_writing and options.big_receipts:
            beside_latencies, big_latencies = watch_latency(root, active[0], options.latency, host, root / BIG)
    full_changed = statistics.median(full_changed_passes)
    full = statistics.median(full_passes)
    hot, quiet = statistics.median(changed_passes), statistics.median(quiet_passes)
    label = "PostgreSQL" if options.postgres else "SQLite"
    print(f"{label}: {options.runs:,} runs, {options.active} running")
    print(f"  first import of the root:                          {first_import:8.1f} s")
    print(f"  full pass, nothing changed (the cold sweep):       {full:8.2f} s")
    print(f"  full pass, 10 events appended to each running run: {full_changed:8.2f} s  (a watch's pass before)")
    print(f"  first pass of a watch:                             {first_watch:8.3f} s")
    print(f"  hot pass, 10 events appended to each running run:  {hot:8.3f} s  ({full_changed / hot:.0f}x less)")
    print(f"  hot pass, nothing changed:                         {quiet:8.3f} s  ({full / quiet:.0f}x less)")
    big = f", {options.big_receipts:,} receipts in {BIG}" if options.big_receipts else ""
    print(f"  hot pass, nothing changed, files settled{big}:")
    print(f"    each hot run at a glance:                        {glance:8.3f} s")
    print(f"    each hot run listed again by names and inodes:   {relisting:8.3f} s")
    print(f"    each hot run's full fingerprint:                 {fingerprint:8.3f} s")
    if latencies:
        p50, p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
        print(f"  write to stored, a real watch, {len(latencies)} writes:      p50 {p50:.3f} s, p95 {p95:.3f} s")
    if big_latencies:
        p50, p95 = percentile(beside_latencies, 0.5), percentile(beside_latencies, 0.95)
        print(f"  the same, {BIG} written to meanwhile:          p50 {p50:.3f} s, p95 {p95:.3f} s")
        p50, p95 = percentile(big_latencies, 0.5), percentile(big_latencies, 0.95)
        print(f"  write to stored in {BIG} itself, {len(big_latencies)} writes:   p50 {p50:.3f} s, p95 {p95:.3f} s")
    figures: dict[str, object] = {
        "first_import_s": first_import,
        "full_pass_s": full,
        "first_watch_pass_s": first_watch,
    }
    figures |= {
        "full_passes_s": full_passes,
        "full_changed_pass_s": full_changed,
        "full_changed_passes_s": full_changed_passes,
    }
    figures |= {"hot_pass_s": hot, "quiet_hot_pass_s": quiet, "hot_passes_s": changed_passes}
    figures |= {"big_receipts": options.big_receipts, "glance_pass_s": glance, "fingerprint_pass_s": fingerprint}
    figures |= {"glance_passes_s": glance_passes, "fingerprint_passes_s": fingerprint_passes}
    figures |= {"relisting_pass_s": relisting, "relisting_passes_s": relisting_passes}
    if latencies:
        figures |= {"latency_p50_s": percentile(latencies, 0.5), "latency_p95_s": percentile(latencies, 0.95)}
        figures |= {"latencies_s": latencies, "beside_big_writing_s": beside_latencies}
        figures |= {"big_latencies_s": big_latencies}
    print(
        json.dumps(
            {"db": label, "runs": options.runs, "active": options.active, **figures, "quiet_passes_s": quiet_passes}
        )
    )


if __name__ == "__main__":
    main()
