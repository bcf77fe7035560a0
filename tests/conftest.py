"""Shared fixtures: run directories made by the real writer, the test data under tests/data."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from receipts import protocol, runtime
from receipts.demo import write_demo_runs

DATA = Path(__file__).resolve().parent / "data"
CONTRACT = protocol.sha256_hex(b"test contract")


def data_path(*parts: str) -> Path:
    """A file of the project's test data (vectors, the JSON corpus), kept in tests/data."""
    return DATA.joinpath(*parts)


def corpus_files() -> list[Path]:
    """JSONTestSuite's parsing cases (MIT, see tests/data/jsontestsuite/LICENSE)."""
    return sorted(data_path("jsontestsuite", "test_parsing").iterdir())


@pytest.fixture
def vectors() -> dict:
    return json.loads(data_path("vectors.json").read_bytes())


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run-1"
    runtime.run_init(path, contract_sha256=CONTRACT)
    return path


@pytest.fixture(scope="session")
def demo_source(tmp_path_factory) -> Path:
    """The demo runs, written once per session by the real writer. Never change them: copy."""
    root = tmp_path_factory.mktemp("demo-source")
    write_demo_runs(root)
    return root


@pytest.fixture
def demo_root(demo_source, tmp_path) -> Path:
    """A private copy of the demo runs that a test may change (copying keeps the writer's bytes)."""
    return Path(shutil.copytree(demo_source, tmp_path / "runs", symlinks=True))


def import_as_seen_later(root: Path) -> None:
    """Import as a person would see the demo 20 minutes after it ran: the killed calls are stale."""
    from receipts import importer

    importer.root_import(root=root, now=protocol.utc_now() + dt.timedelta(minutes=20))
