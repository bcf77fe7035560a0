#!/usr/bin/env bash
# `make test`: the whole suite as CI runs it, on both cores (docs/testing.md, "Where each test runs").
#
#   tests/suite.sh [PYTEST ARGS...]      e.g. tests/suite.sh tests/test_pages_truth.py -k settled
#
# With PostgreSQL at 127.0.0.1:5432 (TEST_POSTGRES_URL names another): every test on PostgreSQL,
# then the tests that use the database again on SQLite, then a check that each of those ran on
# both (tests/suite_split.py). Without it: every test once, on SQLite; the tests that need
# PostgreSQL say they were skipped, and CALLPROOF_REQUIRE_POSTGRES=1 (CI sets it) makes that an
# error instead. WORKERS=N sets the number of pytest-xdist workers (2; 0 runs in this process).
set -uo pipefail
cd "$(dirname "$0")/.."

python=.venv/bin/python
workers=${WORKERS:-2}
postgres_url=${TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}
records=$(mktemp -d "${TMPDIR:-/tmp}/callproof-suite.XXXXXX")
trap 'rm -rf "$records"' EXIT

# A run starts thousands of Python processes (writers, the conformance kit's children, manage.py,
# the kill harness's readers) that import receipts/, evidence/ and tests/. Where
# PYTHONDONTWRITEBYTECODE is set, as in many containers, none of them keeps what it compiled and
# each compiles those modules again: compiled once here, they are loaded.
"$python" -m compileall -q receipts evidence tests || exit 1

# pytest's exit 5 is "no test collected": the first pass must run something, the second may
# find that nothing asked for uses the database.
run_pass() {
    local label=$1 empty_is_fine=$2; shift 2
    echo "=== $label"
    "$@"
    local status=$?
    if [ "$status" -eq 5 ] && [ "$empty_is_fine" = yes ]; then
        echo "=== none of the tests asked for uses the database: nothing more to run on SQLite"
        return 0
    fi
    if [ "$status" -eq 5 ]; then
        echo "pytest collected no test on $label: a broken suite or a selection that matches nothing" >&2
    elif [ "$status" -ne 0 ]; then
        echo "the suite failed on $label (pytest exit $status)" >&2
    fi
    return "$status"
}

if "$python" -c 'import socket, sys, urllib.parse as u; url = u.urlsplit(sys.argv[1]);
socket.create_connection((url.hostname, url.port or 5432), 2).close()' "$postgres_url" 2>/dev/null; then
    started=$SECONDS
    run_pass "PostgreSQL: every test" no \
        env DATABASE_URL="$postgres_url" "$python" -m pytest -n "$workers" --suite-record "$records/postgresql.json" "$@" || exit $?
    run_pass "SQLite: the tests that use the database" yes \
        env -u DATABASE_URL "$python" -m pytest -n "$workers" --database-tests-only --suite-record "$records/sqlite.json" "$@" || exit $?
    if [ -f "$records/sqlite.json" ]; then
        "$python" -m tests.suite_split "$records/postgresql.json" "$records/sqlite.json" || exit 1
    fi
    echo "=== both passes in $((SECONDS - started)) s"
elif [ "${CALLPROOF_REQUIRE_POSTGRES:-0}" = 1 ]; then
    echo "PostgreSQL at $postgres_url does not answer, and CALLPROOF_REQUIRE_POSTGRES=1 asks for both databases" >&2
    exit 1
else
    echo "=== PostgreSQL at $postgres_url does not answer: every test once, on SQLite"
    run_pass "SQLite: every test" no env -u DATABASE_URL "$python" -m pytest -n "$workers" "$@"
fi
