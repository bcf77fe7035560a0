# Two commands for a new user: `make demo` and `make test`. Everything else is here too.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNS ?= var/runs
ADDR ?= 127.0.0.1:8000
PIP_VERSION := 26.3
UV_VERSION := 0.13.9

.PHONY: install lock demo browser nginx gettext messages test test-postgres lint format bench bench-import bench-export bench-pages torture clean

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
# var/*.log, so that the login is the last thing printed, once the server answers;
# all three stop with make (Ctrl-C).
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
	for _ in $$(seq 100); do \
	  $(BIN)/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
	    http://$(ADDR)/healthz 2>/dev/null && break; \
	  kill -0 $$server 2>/dev/null || { tail -20 var/server.log; exit 1; }; sleep 0.2; \
	done; \
	printf '%s\n' "$$login"; \
	wait $$server

# Browser tests drive Debian's Chromium; install it when it is missing (never a downloaded browser).
# Chromium, and a font for Chinese: without one a page in 简体中文 shows boxes, and its
# screenshots and width checks mean nothing.
browser:
	@{ test -x /usr/bin/chromium && fc-list :lang=zh | grep -q .; } || { command -v apt-get >/dev/null && \
	  { [ "$$(id -u)" = 0 ] && SUDO= || SUDO=sudo; $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium fonts-noto-cjk; }; }

# The proxy tests serve the dashboard through Debian's nginx (tests/test_proxy.py).
# GNU gettext: makemessages and compilemessages need it, and so do the catalogue's tests.
gettext:
	@command -v msgfmt >/dev/null || { command -v apt-get >/dev/null && \
	  { [ "$$(id -u)" = 0 ] && SUDO= || SUDO=sudo; $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gettext; }; }

# After marking a string or translating one: the catalogue (evidence/locale/) made current with
# the code, then compiled. Both files are committed, so an installed wheel needs no gettext.
messages: install gettext
	DJANGO_DEBUG=1 $(BIN)/python manage.py makemessages --locale zh_Hans --no-obsolete --no-location \
	  --ignore '.venv/*' --ignore 'tests/*' --ignore 'receipts/*.py' --ignore 'var/*' --ignore 'build/*'
	DJANGO_DEBUG=1 $(BIN)/python manage.py compilemessages --locale zh_Hans --ignore '.venv/*'

nginx:
	@test -x /usr/sbin/nginx || { command -v apt-get >/dev/null && \
	  { [ "$$(id -u)" = 0 ] && SUDO= || SUDO=sudo; $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nginx; }; }

test: install browser nginx gettext
	$(BIN)/python -m pytest

test-postgres: install browser nginx gettext
	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test $(BIN)/python -m pytest

# ruff, then mypy with django-stubs (its files and settings: [tool.mypy] in pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python tests/bench/bench_writer.py

bench-export: install
	$(BIN)/python tests/bench/bench_export.py

bench-import: install
	$(BIN)/python tests/bench/bench_import.py
	$(BIN)/python tests/bench/bench_import.py --postgres

# Every page under gunicorn (in the lock, with the deploy extra), driven by wrk (Debian's package), on both databases.
bench-pages: install
	@command -v wrk >/dev/null || { [ "$$(id -u)" = 0 ] && SUDO= || SUDO=sudo; $$SUDO apt-get install -y -qq wrk; }
	$(BIN)/python tests/bench/bench_pages.py
	$(BIN)/python tests/bench/bench_pages.py --postgres

# The real writer killed at random moments, N trials per tool (docs/KILL_TESTING.md); by hand.
N ?= 1000
torture: install
	$(BIN)/python -m tests.torture --trials $(N)

clean:
	rm -rf $(VENV) var db.sqlite3*
