"""Redaction for exported evidence: an allowlist first, a secret scanner on top.

Only what the exporter names as safe (ids, digests, statuses, tool names and
versions, times, counts) and the fields a policy allows stay in clear. Every
other value becomes ``{"redacted": "sha256:<digest of its canonical JSON>"}``,
so whoever holds the original can prove what it was, and nobody else learns it.

Whatever stays in clear is scanned, keys included: a value under a key that
names a secret (password, token, …), or a value that looks like one (bearer
tokens, JWTs, AWS keys, PEM private keys, GitHub tokens, ``sk-`` keys,
``user:pass@`` in URLs, e-mail addresses, card numbers) is masked the same way.
The recognisers for AWS keys, GitHub tokens, JWTs, private keys and URL
credentials are detect-secrets' (Yelp's maintained scanner); the others are
written here because detect-secrets 1.5 has no plugin for them.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from detect_secrets.core.scan import scan_line
from detect_secrets.settings import transient_settings

from receipts import protocol
from receipts.protocol import redacted

SECRET_KEY_WORDS = (
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "auth",
    "credential",
    "private_key",
    "cookie",
    "session",
)
# detect-secrets' own plugins for what they recognise well, and none of its entropy
# plugins: they flag every digest, and digests are what evidence is made of.
DETECT_SECRETS_PLUGINS = [
    {"name": name}
    for name in ("AWSKeyDetector", "GitHubTokenDetector", "JwtTokenDetector", "PrivateKeyDetector", "BasicAuthDetector")
]
PATTERNS = {
    "bearer token": re.compile(r"\bbearer\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
    "sk- key": re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    "private key block": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "URL credentials": re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@", re.IGNORECASE),
    "e-mail address": re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"),
}
# A card number stands alone: digits inside a longer token (a hex digest) are not one.
CARD_CANDIDATE = re.compile(r"(?<![0-9A-Za-z])(?:\d[ -]?){12,18}\d(?![0-9A-Za-z])")


@dataclasses.dataclass(frozen=True)
class Policy:
    """What a data contract lets stay in clear, beyond the exporter's allowlist."""

    allowed_fields: frozenset[str] = frozenset()  # "tool.field", e.g. "write_file.path"
    patterns: tuple[tuple[str, re.Pattern[str]], ...] = ()  # more things that count as secrets
    source: str = "default: nothing beyond the allowlist"

    def allows(self, tool: str, field: str) -> bool:
        return f"{tool}.{field}" in self.allowed_fields

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "allowed_fields": sorted(self.allowed_fields),
            "patterns": [name for name, _ in self.patterns],
        }


def load_policy(path: Path | None) -> Policy:
    """A TOML policy file: ``allow = ["write_file.path"]`` and ``[patterns] name = "regex"``."""
    if path is None:
        return Policy()
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"the policy {path} cannot be read: {error}") from None
    allow = document.get("allow", [])
    patterns = document.get("patterns", {})
    if not isinstance(allow, list) or not all(isinstance(item, str) and "." in item for item in allow):
        raise ValueError('the policy\'s "allow" must be a list of "tool.field" strings')
    if not isinstance(patterns, dict) or not all(isinstance(value, str) for value in patterns.values()):
        raise ValueError("the policy's [patterns] must map names to regular expressions")
    try:
        compiled = tuple((name, re.compile(regex)) for name, regex in sorted(patterns.items()))
    except re.error as error:
        raise ValueError(f"a pattern of the policy is not a regular expression: {error}") from None
    return Policy(frozenset(allow), compiled, str(path))


def secret_kind(text: str, policy: Policy) -> str | None:
    """What kind of secret ``text`` looks like, or ``None``."""
    for name, pattern in (*PATTERNS.items(), *policy.patterns):
        if pattern.search(text):
            return name
    if any(_luhn(re.sub(r"\D", "", match.group())) for match in CARD_CANDIDATE.finditer(text)):
        return "card number"
    return _detect_secrets_kind(text)


@functools.lru_cache(maxsize=65536)
def _detect_secrets_kind(text: str) -> str | None:
    # Cached: an export repeats the same tool names and ids many times.
    with transient_settings({"plugins_used": DETECT_SECRETS_PLUGINS}):
        for line in text.splitlines() or [text]:
            for found in scan_line(line):
                return found.type
    return None


def _luhn(digits: str) -> bool:
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for index, digit in enumerate(reversed(digits)):
        number = int(digit) * (2 if index % 2 else 1)
        total += number - 9 if number > 9 else number
    return total % 10 == 0


def secret_key(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in SECRET_KEY_WORDS)


def clear(value: Any, policy: Policy, key: str = "") -> Any:
    """``value`` kept in clear where nothing in it looks like a secret; anything that does is redacted.

    Walks lists and objects: a key that names a secret redacts its value, and a key
    that itself looks like a secret is replaced by its digest.
    """
    if key and secret_key(key):
        return redacted(value)
    if isinstance(value, str):
        if protocol.HEX64_RE.fullmatch(value):
            return value  # a digest is what evidence is made of, and never a secret
        return redacted(value) if secret_kind(value, policy) else value
    if isinstance(value, list):
        return [clear(item, policy) for item in value]
    if isinstance(value, dict):
        kept = {}
        for name, item in value.items():
            shown = name if secret_kind(name, policy) is None else redacted(name)["redacted"]
            kept[shown] = clear(item, policy, name)
        return kept
    return value


def fields(values: Any, allowed: Iterable[str], policy: Policy) -> Any:
    """An object whose ``allowed`` fields stay in clear (after the scanner) and the rest are redacted."""
    if not isinstance(values, dict):
        return redacted(values)
    allowed = set(allowed)
    shown = {}
    for name, value in values.items():
        key = name if secret_kind(name, policy) is None else redacted(name)["redacted"]
        shown[key] = clear(value, policy, name) if name in allowed else redacted(value)
    return shown
