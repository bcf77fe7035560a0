# Two commands for a new user: `make demo` and `make test`. Everything else is here too.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNS ?= var/runs
ADDR ?= 127.0.0.1:8000

.PHONY: install demo browser test test-postgres lint format bench bench-import clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The watcher re-imports what changes every 3 s, so open run pages refresh live;
# it stops with the server (Ctrl-C).
demo: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python -m receipts demo $(RUNS)
	$(BIN)/python manage.py import_runs $(RUNS)
	$(BIN)/python manage.py demo_login
	$(BIN)/python manage.py import_runs $(RUNS) --watch > var/watch.log 2>&1 & watcher=$$!; \
	trap 'kill $$watcher 2>/dev/null' EXIT INT TERM; \
	EVIDENCE_RUNS_ROOT=$(RUNS) $(BIN)/python manage.py runserver $(ADDR)

# Browser tests drive Debian's Chromium; install it when it is missing (never a downloaded browser).
browser:
	@test -x /usr/bin/chromium || { command -v apt-get >/dev/null && \
	  { [ "$$(id -u)" = 0 ] && SUDO= || SUDO=sudo; $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }; }

test: install browser
	$(BIN)/python -m pytest

test-postgres: install browser
	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test $(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python tests/bench/bench_writer.py

bench-import: install
	$(BIN)/python tests/bench/bench_import.py
	$(BIN)/python tests/bench/bench_import.py --postgres

clean:
	rm -rf $(VENV) var db.sqlite3*
