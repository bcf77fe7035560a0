"""Optional signing: an HMAC-SHA256 on every record the writer makes in a run, with the key's id.

Standard library only. Without a key nothing changes. With one (a file outside
the run directory, named by ``RECEIPTS_SIGNING_KEY``), ``init`` records the
key's id and a random ``run_uid`` in steer.json (itself signed), and the writer
signs every receipt,
ledger line and confirmation of that run. In a signed run the writer refuses to
reuse a receipt, or follow a confirmation, whose signature does not verify, and
refuses to act at all without the run's key (or with another): signed and
unsigned records never mix. The formulas are in ``receipts.protocol``.

What it protects against: an agent (or anyone) that can write under the run
directory but cannot read the key file forges no receipt, event or decision
that verifies. What it does not: an agent that can read the key; a run
rewritten whole as an unsigned one (steer.json without ``signing_key_id``),
unless the writer runs with the key set (it then refuses unsigned runs) and the
dashboard requires signed runs; deleting records (the ledger's chain and the
reader's cross-checks show gaps); submissions, tasks and state.json, which are
not signed.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from receipts import protocol
from receipts.confined import read_json_file
from receipts.protocol import SigningKey

KEY_ENV = "RECEIPTS_SIGNING_KEY"
# Shorter secrets can be guessed offline from any signed record.
MIN_SECRET_BYTES = 32


def load_key(path: str | Path) -> SigningKey:
    """The key in the file at ``path`` (its bytes, surrounding whitespace stripped)."""
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as error:
        raise ValueError(f"the signing key file {path} cannot be read: {error.strerror or error}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the signing key in {path} is shorter than {MIN_SECRET_BYTES} bytes")
    return SigningKey.from_secret(secret)


def writer_key() -> SigningKey | None:
    """The key ``RECEIPTS_SIGNING_KEY`` names, or ``None`` when it names none."""
    path = os.environ.get(KEY_ENV)
    return load_key(path) if path else None


def key_for_new_run(run_dir: Path, steer: Mapping[str, Any]) -> SigningKey | None:
    """The writer's key, bound to the run whose steer.json is ``steer`` (its ``run_uid``:
    ``protocol.signing_subject``); ``ValueError`` when the key file lies inside the run."""
    key = writer_key()
    if key is not None and _inside(Path(os.environ[KEY_ENV]), Path(run_dir)):
        raise ValueError(f"the signing key file lies inside {run_dir}: anyone who can read the run could sign")
    return None if key is None else key.for_run(protocol.signing_subject(steer, Path(run_dir).name))


def new_run_uid() -> str:
    """A signed run's own identity, recorded (and signed) in its steer.json at init."""
    return secrets.token_hex(16)


def key_for_run(run_dir: Path) -> SigningKey | None:
    """The key of a signed run, ``None`` for an unsigned one; ``ValueError`` when the writer cannot act.

    A signed run needs its own key; a writer that has a key acts only on signed
    runs, so that an unsigned copy of a run does not pass for it.
    """
    run_dir = Path(run_dir)
    steer = read_json_file(run_dir / "steer.json", run_dir)
    key_id = steer.get("signing_key_id") if isinstance(steer, dict) else None
    key = key_for_new_run(run_dir, steer if isinstance(steer, dict) else {})
    if key_id is None:
        if key is not None and steer is not None:
            raise ValueError(
                f"{KEY_ENV} is set but {run_dir} is not a signed run (made without a key, or its steer.json "
                "lost the key id): the writer does not mix signed and unsigned records"
            )
        return None
    if key is None:
        raise ValueError(f"{run_dir} is a signed run (key {str(key_id)[:40]}): set {KEY_ENV} to its key file")
    if key.key_id != key_id:
        raise ValueError(f"{run_dir} is signed with key {str(key_id)[:40]}, not with {key.key_id}")
    if protocol.signature_problem(steer, key) is not None:
        # Its contract and call_id formula decide every call_id: an edited one would re-run effects.
        raise ValueError(f"{run_dir}/steer.json does not verify with the run's key (altered?): a person has to look")
    return key


def run_keys() -> dict[str, SigningKey]:
    """The writer's key by its id, for reading a run as the writer would (replay, the new-attempt rule)."""
    key = writer_key()
    return {} if key is None else {key.key_id: key}


def load_keys(paths: list[str]) -> dict[str, SigningKey]:
    """Keys by id, for the reader and the dashboard."""
    keys = [load_key(path) for path in paths if path]
    return {key.key_id: key for key in keys}


def _inside(path: Path, directory: Path) -> bool:
    try:
        return path.resolve().is_relative_to(directory.resolve())
    except OSError:
        return False
