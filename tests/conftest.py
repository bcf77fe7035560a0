"""Shared fixtures: run directories made by the real writer, the spec's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from receipts import protocol, runtime

SHARED = Path(__file__).resolve().parents[2] / "shared"
CONTRACT = protocol.sha256_hex(b"test contract")


def shared_path(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"{path} is missing: the tests need ../shared beside the checkout")
    return path


@pytest.fixture
def vectors() -> dict:
    return json.loads(shared_path("spec", "vectors.json").read_bytes())


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run-1"
    runtime.run_init(path, contract_sha256=CONTRACT)
    return path


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
