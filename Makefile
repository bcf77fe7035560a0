# Two commands for a new user: `make demo` and `make test`. Everything else is here too.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNS ?= var/runs
ADDR ?= 127.0.0.1:8000
PIP_VERSION := 26.3
UV_VERSION := 0.13.9

.PHONY: install lock demo test-packages messages test check screenshots lint format bench bench-serve bench-serve-memory bench-import bench-import-10m bench-export bench-pages bench-pages-10m bench-watch-10m bench-ship torture clean

# Everything comes from the lock file, each package by its hash (the test and deploy extras,
# so the suite, the proxy tests and the benchmarks run on the same versions everywhere);
# the project itself goes on top, editable, with nothing more.
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q pip==$(PIP_VERSION)
	$(BIN)/python -m pip install -q --require-hashes -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# After a change to the dependencies in pyproject.toml: the newest versions that satisfy them,
# pinned with their hashes (tests/test_packaging.py fails while the lock is behind).
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv==$(UV_VERSION)
	$(BIN)/uv pip compile pyproject.toml --extra test --extra deploy --generate-hashes --upgrade --custom-compile-command "make lock" \
	  --python-version 3.11 --python-platform x86_64-unknown-linux-gnu -o requirements.lock -q

# The demo serves what a deployment would: debugging off, collected static files
# served by whitenoise, the branded error pages, a secret key made once under var/.
# Only HTTPS is off, because it serves plain HTTP on loopback. The watcher
# re-imports what changes every 3 s, so open run pages refresh live; the worker
# makes the evidence exports asked for on a run page. Each step's output goes to
# var/*.log, so that the login is the last thing printed, once the server answers (and only then
# the word "running": demo_login prints the login, nothing more); all three stop with make (Ctrl-C).
DEMO_HOST = $(firstword $(subst :, ,$(ADDR)))
DEMO_ENV = DJANGO_DEBUG=0 DJANGO_HTTPS=0 DJANGO_SECRET_KEY="$$(cat var/secret_key)" \
	DJANGO_ALLOWED_HOSTS=$(DEMO_HOST),127.0.0.1,localhost EVIDENCE_RUNS_ROOT=$(RUNS)

var/secret_key:
	@mkdir -p var
	@umask 077 && $(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(50))' > $@

demo: install var/secret_key
	@echo "Preparing the demo: migrate, collect static files, write and import the demo runs (var/setup.log)"
	@{ $(DEMO_ENV) $(BIN)/python manage.py migrate --noinput && \
	  $(DEMO_ENV) $(BIN)/python manage.py collectstatic --noinput -v 0 && \
	  $(BIN)/python -m receipts demo $(RUNS) && \
	  $(DEMO_ENV) $(BIN)/python manage.py import_runs $(RUNS); } > var/setup.log 2>&1 || { tail -20 var/setup.log; exit 1; }
	@login=$$($(DEMO_ENV) $(BIN)/python manage.py demo_login --banner --url http://$(ADDR)/) || exit 1; \
	$(DEMO_ENV) $(BIN)/python manage.py import_runs $(RUNS) --watch > var/watch.log 2>&1 & watcher=$$!; \
	$(DEMO_ENV) $(BIN)/python manage.py db_worker --no-reload > var/worker.log 2>&1 & worker=$$!; \
	$(DEMO_ENV) $(BIN)/python manage.py runserver --noreload $(ADDR) > var/server.log 2>&1 & server=$$!; \
	trap 'kill $$watcher $$worker $$server 2>/dev/null; wait' EXIT INT TERM; \
	answered=; for _ in $$(seq 100); do \
	  $(BIN)/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
	    http://$(ADDR)/healthz 2>/dev/null && { answered=1; break; }; \
	  kill -0 $$server 2>/dev/null || { tail -20 var/server.log; exit 1; }; sleep 0.2; \
	done; \
	[ -n "$$answered" ] || { tail -20 var/server.log; echo "The server did not answer on http://$(ADDR)/healthz (var/server.log)."; exit 1; }; \
	printf '%s\n' "$$login" \
	  "    Logs       var/server.log, var/watch.log, var/worker.log" \
	  "" "  The demo is running. Stop it with Ctrl-C."; \
	wait $$server

# What the suite needs from Debian, installed when missing and said before: Chromium and a font
# for Chinese (the browser tests; without the font a page in 简体中文 shows boxes, and its width
# checks mean nothing), promtool from Debian's prometheus (the alert rules' tests), nginx (the
# proxy tests), GNU gettext (the catalogue's tests and `make messages`). Never a downloaded
# browser, and no recommended packages.
TEST_PACKAGES = chromium:/usr/bin/chromium prometheus:/usr/bin/promtool nginx:/usr/sbin/nginx gettext:/usr/bin/msgfmt fonts-noto-cjk:/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc
test-packages:
	@missing=; for entry in $(TEST_PACKAGES); do test -e "$${entry#*:}" || missing="$$missing $${entry%%:*}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing for the browser, proxy and translation tests (apt-get, --no-install-recommends)"; \
	  command -v apt-get >/dev/null || { echo "no apt-get here: install$$missing by hand" >&2; exit 1; }; \
	  [ "$$(id -u)" = 0 ] && SUDO= || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# After marking a string or translating one: the catalogue (evidence/locale/) made current with
# the code, then compiled. Both files are committed, so an installed wheel needs no gettext.
messages: install test-packages
	DJANGO_DEBUG=1 $(BIN)/python manage.py makemessages --locale zh_Hans --no-obsolete --no-location \
	  --ignore '.venv/*' --ignore 'tests/*' --ignore 'receipts/*.py' --ignore 'var/*' --ignore 'build/*'
	DJANGO_DEBUG=1 $(BIN)/python manage.py compilemessages --locale zh_Hans --ignore '.venv/*'

# The whole suite, as CI runs it (tests/suite.sh, docs/testing.md): on both cores; every test on
# PostgreSQL when 127.0.0.1:5432 answers, and the tests that use the database again on SQLite;
# every test on SQLite when it does not. A part of it: make test ARGS='tests/test_pages_truth.py -k settled'.
ARGS ?=
test: install test-packages
	@tests/suite.sh $(ARGS)

# The inner loop: lint, then every test that needs no browser, nginx or PostgreSQL, on SQLite,
# but the slow ones (real processes in numbers: the kill harness, the wheel, the MCP SDK; make test runs them).
check: lint
	env -u DATABASE_URL $(BIN)/python -m pytest -n $${WORKERS:-2} -m "not browser and not nginx and not slow" $(ARGS)

# ruff, then mypy with django-stubs (its files and settings: [tool.mypy] in pyproject.toml).
# The browser tests with their screenshots, in tests/browser/screenshots/ (each page at 390 and
# 1366 px, both languages, light and dark): what a person looks at before a page's change lands.
# make test and CI take none: a screenshot asserts nothing, and CI throws its copy away.
screenshots: install test-packages
	CALLPROOF_SCREENSHOTS=1 $(BIN)/python -m pytest -n $${WORKERS:-2} -m browser tests/browser $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python tests/bench/bench_writer.py

bench-serve: install
	$(BIN)/python tests/bench/bench_serve.py

# The writer daemon's peak memory with 64 clients sending their largest message at once.
bench-serve-memory: install
	$(BIN)/python tests/bench/bench_serve_memory.py

bench-export: install
	$(BIN)/python tests/bench/bench_export.py

bench-import: install
	$(BIN)/python tests/bench/bench_import.py
	$(BIN)/python tests/bench/bench_import.py --postgres

# The same at ten million events and a million receipts, one round each: the run is built once
# under tests/bench/out/ and reused by every later run.
bench-import-10m: install
	$(BIN)/python tests/bench/bench_import.py --events 10000000 --receipts 1000000 --rounds 1
	$(BIN)/python tests/bench/bench_import.py --events 10000000 --receipts 1000000 --rounds 1 --postgres

# Every page under gunicorn (in the lock, with the deploy extra), driven by wrk (Debian's package), on both databases.
bench-pages: install
	@command -v wrk >/dev/null || { [ "$$(id -u)" = 0 ] && SUDO= || SUDO=sudo; $$SUDO apt-get install -y -qq wrk; }
	$(BIN)/python tests/bench/bench_pages.py
	$(BIN)/python tests/bench/bench_pages.py --postgres

# The pages again with the big run at ten million events and a million receipts (bench-import-10m's run, reused).
bench-pages-10m: install
	@command -v wrk >/dev/null || { [ "$$(id -u)" = 0 ] && SUDO= || SUDO=sudo; $$SUDO apt-get install -y -qq wrk; }
	$(BIN)/python tests/bench/bench_pages.py --events 10000000 --receipts 1000000
	$(BIN)/python tests/bench/bench_pages.py --events 10000000 --receipts 1000000 --postgres

# The watch over 20,000 runs and a running one of ten million events (bench-import-10m's run, reused): its passes,
# and the time from a write to its row, with the big run quiet and then written to.
bench-watch-10m: install
	$(BIN)/python tests/bench/bench_watch.py --big-receipts 1000000 --repeat 3 --latency 20 --big-writing
	$(BIN)/python tests/bench/bench_watch.py --big-receipts 1000000 --repeat 3 --latency 20 --big-writing --postgres

# The shipper: its memory while it ships a big run, and a decision's way to its host meanwhile (PostgreSQL).
bench-ship: install
	$(BIN)/python tests/bench/bench_ship.py --events 1000000 --receipts 100000
	$(BIN)/python tests/bench/bench_ship.py --events 10000000 --receipts 1000000

# The real writer killed at random moments, N trials per tool (docs/KILL_TESTING.md); by hand.
N ?= 1000
torture: install
	$(BIN)/python -m tests.torture --trials $(N)

clean:
	rm -rf $(VENV) var db.sqlite3*
