"""Page benchmark (run by hand: `make bench-pages`; not part of the suite).

Builds once, under tests/bench/out/pages-world/, a runs root of 1,000 runs: one
of 1,000,000 ledger events and 100,000 receipts, and 999 small ones of which
every third has a receipt left `prepared` (a stale call in doubt, in the inbox),
every third has no steer.json (a schema finding) and every third has a receipt
no event names and one that is not JSON: 1,332 open findings in all. It imports the root into a
fresh database, serves the dashboard with gunicorn (two sync workers, debug off,
static files by whitenoise) on loopback, logs in, and drives every page with
wrk for a few seconds each.

Why wrk: a C load generator, event-driven, from Debian's packages; one thread
keeps both workers busy while taking little of the second core from the server
on a two-core machine, and it reports latency percentiles. It runs a closed
loop with two connections, as many as there are workers, so a latency is a
request's own time (queued behind none); a Python client would compete with
the server for the CPU it measures.

    python tests/bench/bench_pages.py [--postgres] [--seconds 5] [--small-runs 999]
                                      [--events 1000000 --receipts 100000]

With --events and --receipts the big run is of that size (the same run
`bench_import.py` builds and keeps, hard-linked), in a world of its own
(pages-world-EVENTS/); the ledger's middle page is then at half its events.
"""

from __future__ import annotations

import argparse
import html
import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_import import CONTRACT, OUT, PROJECT, build_run, fresh_database, manage

WORLD = OUT / "pages-world"
BIG = "big-run"
USER, PASSWORD = "bench", "a-long-bench-password-1"


def build_world(small_runs: int, events: int = 1_000_000, receipts: int = 100_000) -> Path:
    sys.path.insert(0, str(PROJECT))
    from tests.volume import synthetic_run

    world = WORLD if (events, receipts) == (1_000_000, 100_000) else OUT / f"pages-world-{events}-{receipts}"
    big = build_run(events, receipts)
    if not (world / BIG).exists():
        world.mkdir(parents=True, exist_ok=True)
        # Hard links: the big run's receipts are not copied (nothing here writes to them).
        subprocess.run(["cp", "-al", str(big), str(world / BIG)], check=True)
    for index in range(small_runs):
        run = world / f"run-{index:04d}"
        if not run.exists():
            synthetic_run(run, events=30, receipts=3, contract=CONTRACT)
            if index % 3 == 0:
                receipt = sorted((run / "receipts").iterdir())[0]
                document = json.loads(receipt.read_bytes())
                receipt.write_text(json.dumps({**document, "status": "prepared"}))
            if index % 3 == 1:
                (run / "steer.json").unlink()
        if index % 3 == 2 and not (run / "receipts" / "broken.json").exists():
            receipt = sorted((run / "receipts").iterdir())[0]
            (run / "receipts" / f"{'e' * 64}.json").write_bytes(receipt.read_bytes())  # named by no event
            (run / "receipts" / "broken.json").write_text("{")
    return world


def watch_pass_seconds(url: str, world: Path) -> list[float]:
    """Three passes of the watch (``root_import`` without reports) over the unchanged root."""
    code = (
        "import time; from pathlib import Path; from evidence.ingest.importer import root_import\n"
        "for _ in range(3):\n"
        "    started = time.perf_counter()\n"
        f"    root_import(root=Path({str(world)!r}), report_unchanged=False)\n"
        "    print(time.perf_counter() - started)"
    )
    completed = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", code],
        env={**os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "1"}, cwd=PROJECT, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return [float(line) for line in completed.stdout.split()]


def open_findings(url: str) -> int:
    code = "from evidence.models import Finding; print(Finding.objects.filter(closed_at=None).count())"
    completed = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c", code],
        env={**os.environ, "DATABASE_URL": url, "DJANGO_DEBUG": "1"}, cwd=PROJECT, capture_output=True, text=True,
    )  # fmt: skip
    return int(completed.stdout.strip())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_env(url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": url,
        "DATABASE_CONN_MAX_AGE": "60",
        "DJANGO_DEBUG": "0",
        "DJANGO_HTTPS": "0",
        "DJANGO_SECRET_KEY": "bench-" + "k" * 50,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
    }


def found(pattern: str, text: str, flags: int = 0) -> re.Match[str]:
    match = re.search(pattern, text, flags)
    if match is None:
        raise SystemExit(f"{pattern!r} is not in:\n{text[:2000]}")
    return match


def login(base: str) -> str:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(base + "/accounts/login/").read().decode()
    token = found(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode({"username": USER, "password": PASSWORD, "csrfmiddlewaretoken": token})
    opener.open(urllib.request.Request(base + "/accounts/login/", data=form.encode(), headers={"Referer": base + "/"}))
    cookies = {cookie.name: cookie.value for cookie in jar}
    assert "sessionid" in cookies, "the bench user could not log in"
    return "; ".join(f"{name}={value}" for name, value in cookies.items())


def page_text(base: str, path: str, cookie: str) -> str:
    return urllib.request.urlopen(urllib.request.Request(base + path, headers={"Cookie": cookie})).read().decode()


def older(base: str, path: str, cookie: str) -> str:
    """The page's own "older" link (its keyset cursor), as a reader following it would ask."""
    href = html.unescape(found(r'<a href="([^"]+)" rel="next"', page_text(base, path, cookie)).group(1))
    return urllib.parse.urljoin(path, href)


def urls(base: str, cookie: str, middle: int = 500_000) -> dict[str, str]:
    call = found(rf'href="/runs/{BIG}/calls/([0-9a-f]+)/"', page_text(base, f"/runs/{BIG}/", cookie)).group(1)
    return {
        "runs list": "/",
        "runs list, older page": older(base, "/", cookie),
        "runs needing attention": "/?attention=1",
        "runs list, last page": "/?page=last",
        "run, ledger first page": f"/runs/{BIG}/",
        f"run, ledger middle (seq {middle:,})": f"/runs/{BIG}/?seq={middle}",
        "run, ledger middle, older page": older(base, f"/runs/{BIG}/?seq={middle}", cookie),
        "run, ledger last page": f"/runs/{BIG}/?page=last",
        "run, filter type=receipt": f"/runs/{BIG}/?type=receipt",
        "run, filter type=note, last page": f"/runs/{BIG}/?type=note&page=last",
        "run, calls last page": f"/runs/{BIG}/?calls_page=last",
        "call": f"/runs/{BIG}/calls/{call}/",
        "recovery decisions": f"/runs/{BIG}/replay/",
        "recovery decisions, last page": f"/runs/{BIG}/replay/?page=last",
        "findings": "/findings/",
        "findings, last page": "/findings/?page=last",
        "stale": "/reservations/",
        "search (run ids)": "/search/?q=run-00",
        "search (call_id prefix)": f"/search/?q={call[:8]}",
        "inbox": "/inbox/",
        "inbox, last page": "/inbox/?page=last",
        "audit": "/audit/",
        "retention": "/retention/",
        "retention, last page": "/retention/?page=last",
    }


def wrk(url: str, cookie: str, seconds: int) -> dict[str, float]:
    completed = subprocess.run(
        ["wrk", "-t1", "-c2", f"-d{seconds}s", "--latency", "-H", f"Cookie: {cookie}", url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out = completed.stdout
    if "Non-2xx or 3xx responses" in out:
        raise SystemExit(f"{url} answered with errors:\n{out}")

    def ms(label: str) -> float:
        value, unit = found(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    rate = float(found(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return {"p50_ms": ms("50%"), "p99_ms": ms("99%"), "rps": rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--small-runs", type=int, default=999)
    parser.add_argument("--events", type=int, default=1_000_000, help="the big run's ledger events")
    parser.add_argument("--receipts", type=int, default=100_000, help="the big run's receipts")
    options = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install wrk")
    world = build_world(options.small_runs, options.events, options.receipts)
    label = "PostgreSQL" if options.postgres else "SQLite"
    url = fresh_database(options.postgres, "bench_pages")
    import_seconds, import_rss, _ = manage(url, "import_runs", str(world))
    watch_pass = watch_pass_seconds(url, world)
    env = server_env(url)
    run: dict[str, Any] = {"env": env, "cwd": PROJECT, "check": True}
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], **run)
    create = f"from django.contrib.auth.models import User; User.objects.create_superuser('{USER}', '', '{PASSWORD}')"
    subprocess.run([sys.executable, "manage.py", "shell", "-c", create], **run)
    port = free_port()
    gunicorn = Path(sys.executable).with_name("gunicorn")
    server = subprocess.Popen(
        [str(gunicorn), "evidence.wsgi", "--workers", "2", "--bind", f"127.0.0.1:{port}", "--log-level", "warning"],
        env=env, cwd=PROJECT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        cookie = login(base)
        results = {}
        for name, path in urls(base, cookie, options.events // 2).items():
            wrk(base + path, cookie, 1)  # warm both workers' caches
            results[name] = wrk(base + path, cookie, options.seconds)
            r = results[name]
            print(f"{name:36} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  {r['rps']:7.1f} req/s", flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    passes = ", ".join(f"{seconds:.2f}" for seconds in watch_pass)
    findings = f"{open_findings(url)} open findings; a watch pass over the unchanged root: {passes} s"
    size = f"{options.small_runs + 1:,} runs, the big one {options.events:,} events, {options.receipts:,} receipts"
    print(f"\n{label}: import of the root ({size}) {import_seconds:.1f} s, peak {import_rss:.0f} MiB; {findings}")
    print(f"| page | {label} p50 | p99 | req/s |\n|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms | {r['rps']:.0f} |")
    sizes = {"events": options.events, "receipts": options.receipts, "small_runs": options.small_runs}
    print(json.dumps({"db": label, **sizes, "import_s": import_seconds, "watch_pass_s": watch_pass, "pages": results}))


if __name__ == "__main__":
    main()
