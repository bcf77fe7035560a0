"""What a page costs in-process (run by hand; not part of the suite): issue 41's profile.

Drives the dashboard with Django's test client, debugging off, over a database that
`bench_pages.py` (or any import of a run named ``big-run``) left behind, in English and in
Chinese, and says for each page: the median and 95th percentile of the whole request's time
in this process (``--repeat`` requests after one to warm it) and of this process's CPU time
(which a busy machine's run queue does not add to), the SQL's share, the catalogue lookups
(gettext calls), the template nodes rendered and how many of them were ``{% translate %}``
tags. Counts do not move with the machine's load; times do, so compare two versions
interleaved on one machine, by their medians (``--json FILE`` keeps the figures). ``--save DIR`` writes each page's
HTML (CSRF tokens and ages blanked) for ``--compare``: two such folders, whitespace
normalised, page by page.

    DATABASE_URL=sqlite:///tests/bench/out/bench_pages.sqlite3 DJANGO_STATIC_ROOT=... \\
        python tests/bench/bench_render.py [--repeat 15] [--only home,run-seq500000] [--save DIR]
    python tests/bench/bench_render.py --compare BEFORE AFTER

The static files must have been collected (``manage.py collectstatic``) where
``DJANGO_STATIC_ROOT`` says: with debugging off, a page names their hashed files.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

BIG = "big-run"
CSRF = re.compile(r'(name="csrfmiddlewaretoken" value="|"X-CSRFToken": ")[^"]+')
AGE = re.compile(r'(<time datetime="[^"]+" title="[^"]+">)[^<]*(</time>)')  # "3 h ago" moves with the clock


def normalised(page: str) -> str:
    page = AGE.sub(r"\1AGE\2", CSRF.sub(r"\1X", page))
    return re.sub(r"\s+", " ", re.sub(r">\s+<", "><", page)).replace("><", ">\n<")


def compare(before: Path, after: Path) -> int:
    differ = 0
    pages = sorted(page for page in before.glob("*.html") if (after / page.name).exists())
    for page in pages:
        old, new = normalised(page.read_text()), normalised((after / page.name).read_text())
        if old != new:
            differ += 1
            print(f"{page.name} differs:")
            for line in list(difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0))[:20]:
                print("   ", line[:200])
    print(f"{len(pages) - differ} pages equivalent, {differ} differ")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--only", default="", help="page names, comma separated")
    parser.add_argument("--save", type=Path)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    options = parser.parse_args()
    if options.compare:
        raise SystemExit(compare(*options.compare))
    os.environ.update(DJANGO_SETTINGS_MODULE="evidence.settings", DJANGO_DEBUG="0", DJANGO_HTTPS="0",
                      DJANGO_ALLOWED_HOSTS="testserver")  # fmt: skip
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-" + "k" * 50)
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.template import base
    from django.test import Client
    from django.utils.translation import trans_real

    counts: collections.Counter[str] = collections.Counter()

    def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return original(*args, **kwargs)

        return wrapped

    # Every catalogue lookup (gettext, pgettext, ngettext and the lazy strings) ends in one of these.
    translation = trans_real.DjangoTranslation
    translation.gettext = counted("gettext", translation.gettext)  # type: ignore[method-assign]
    translation.ngettext = counted("gettext", translation.ngettext)  # type: ignore[method-assign]
    render_annotated = base.Node.render_annotated

    def counting_render(node: base.Node, context: Any) -> Any:
        counts["nodes"] += 1
        counts[type(node).__name__] += 1
        return render_annotated(node, context)

    base.Node.render_annotated = counting_render  # type: ignore[method-assign,assignment]
    sql = [0.0]

    def timed(execute: Callable[..., Any], *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(*args)
        finally:
            sql[0] += time.perf_counter() - started

    user, _ = User.objects.get_or_create(username="bench-render", defaults={"is_superuser": True})
    client = Client()
    client.force_login(user)

    def get(path: str, language: str) -> str:
        response = client.get(path, HTTP_ACCEPT_LANGUAGE=language)
        assert response.status_code == 200, (path, response.status_code)
        return response.content.decode()

    def older(path: str) -> str:
        """The page's own "older" link, as a reader following it asks for it."""
        href = re.search(r'<a href="([^"]+)" rel="next"', get(path, "en"))
        assert href is not None, f"{path} has no older page"
        return path.split("?")[0] + href.group(1).replace("&amp;", "&")

    call = re.search(rf'href="/runs/{BIG}/calls/([0-9a-f]+)/"', get(f"/runs/{BIG}/", "en"))
    assert call is not None
    pages = {
        "home": "/",
        "runs-older": older("/"),
        "runs-last": "/?page=last",
        "run-first": f"/runs/{BIG}/",
        "run-seq500000": f"/runs/{BIG}/?seq=500000",
        "run-seq500000-older": older(f"/runs/{BIG}/?seq=500000"),
        "run-calls-last": f"/runs/{BIG}/?calls_page=last",
        "call": f"/runs/{BIG}/calls/{call.group(1)}/",
        "replay": f"/runs/{BIG}/replay/",
        "findings": "/findings/",
        "stale": "/reservations/",
        "inbox": "/inbox/",
        "audit": "/audit/",
        "retention": "/retention/",
    }
    only = set(options.only.split(",")) - {""}
    results = {}
    for language in ("en", "zh-hans"):
        for name, path in pages.items():
            if only and name not in only:
                continue
            page = get(path, language)
            if options.save:
                options.save.mkdir(parents=True, exist_ok=True)
                (options.save / f"{name}.{language}.html").write_text(page)
            counts.clear()
            get(path, language)
            once = dict(counts)
            times, cpus, sqls = [], [], []
            with connection.execute_wrapper(timed):
                for _ in range(options.repeat):
                    sql[0] = 0.0
                    started, cpu = time.perf_counter(), time.process_time()
                    get(path, language)
                    times.append((time.perf_counter() - started) * 1000)
                    cpus.append((time.process_time() - cpu) * 1000)
                    sqls.append(sql[0] * 1000)
            times.sort()
            cpus.sort()
            result = {
                "median_ms": statistics.median(times),
                "p95_ms": times[round(0.95 * (len(times) - 1))],
                # This process's CPU time: what a busy machine's queue does not add to.
                "cpu_median_ms": statistics.median(cpus),
                "cpu_p95_ms": cpus[round(0.95 * (len(cpus) - 1))],
                "sql_ms": statistics.median(sqls),
                "gettext": once.get("gettext", 0),
                "nodes": once.get("nodes", 0),
                "translate_nodes": once.get("TranslateNode", 0) + once.get("BlockTranslateNode", 0),
            }
            results[f"{name} {language}"] = result
            print(
                f"{name:20} {language:7} median {result['median_ms']:6.1f} ms  p95 {result['p95_ms']:6.1f} ms  "
                f"CPU {result['cpu_median_ms']:6.1f} ms  p95 {result['cpu_p95_ms']:6.1f} ms  "
                f"SQL {result['sql_ms']:5.1f} ms  gettext {result['gettext']:5}  nodes {result['nodes']:5}  "
                f"translate {result['translate_nodes']:4}",
                flush=True,
            )
    if options.json:
        options.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
