"""Redaction for exported evidence: an allowlist first, a secret scanner on top.

Only what the exporter names as safe (ids, digests, statuses, tool names and
versions, times, counts) and the fields a policy allows stay in clear. Every
other value becomes ``{"redacted": "sha256:<digest of its canonical JSON>"}``,
so whoever holds the original can prove what it was, and nobody else learns it.

Whatever stays in clear is scanned, ids and keys included: a value under a key
that names a secret (password, token, …), or a value that looks like one, is
masked the same way. Our patterns (standard library ``re``) recognise bearer
tokens, ``sk-`` keys, Slack tokens and webhooks, Stripe and Google API keys,
Google OAuth tokens (``ya29.``), GitHub fine-grained tokens (``github_pat_``),
bare npm tokens (``npm_``, alone or not), ``Basic`` credentials, Azure storage keys and SAS
signatures, secrets in a URL's query, ``user:pass@`` in URLs, e-mail addresses,
phone numbers, card numbers (Luhn), IBANs (mod 97), US social security numbers
and base64 of JSON that holds a secret's key; a number, int or float, is
scanned as its digits.
detect-secrets' own plugins add AWS keys, GitHub and GitLab tokens, JWTs, PEM
private keys and other vendors' keys; they are called directly, without
detect-secrets' filters, so a ``pragma: allowlist secret`` written into a value
does not hide it.
"""

from __future__ import annotations

import binascii
import dataclasses
import functools
import json
import re
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import BasePlugin
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

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
# detect-secrets' plugins that match a key's own shape, called directly (``analyze_string``):
# its scan functions would apply its filters, and one of them skips any line that says
# "pragma: allowlist secret". None of its entropy or keyword plugins: they flag every
# digest, and digests are what evidence is made of.
DETECT_SECRETS_PLUGINS: tuple[BasePlugin, ...] = tuple(
    plugin()
    for plugin in (
        AWSKeyDetector,
        AzureStorageKeyDetector,
        BasicAuthDetector,
        DiscordBotTokenDetector,
        GitHubTokenDetector,
        GitLabTokenDetector,
        JwtTokenDetector,
        MailchimpDetector,
        NpmDetector,
        OpenAIDetector,
        PrivateKeyDetector,
        PypiTokenDetector,
        SendGridDetector,
        SlackDetector,
        SquareOAuthDetector,
        StripeDetector,
        TelegramBotTokenDetector,
        TwilioKeyDetector,
    )
)
# Not inside a longer token: a hex digest or a word that merely contains the shape.
_ALONE = r"(?<![0-9A-Za-z])"
PATTERNS = {
    "bearer token": re.compile(r"\bbearer\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
    "sk- key": re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    "private key block": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    # Each starts where its run of characters starts: tried at every letter of a long run, these
    # would take time in the square of its length.
    "URL credentials": re.compile(r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@", re.IGNORECASE),
    "e-mail address": re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"),
    "Slack token": re.compile(_ALONE + r"(?:xox[abposr]|xapp)-[A-Za-z0-9-]{10,}", re.IGNORECASE),
    "Slack webhook": re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/-]{8,}", re.IGNORECASE),
    "Stripe key": re.compile(
        _ALONE + r"(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{10,}|" + _ALONE + r"whsec_[0-9A-Za-z]{16,}"
    ),
    "Google API key": re.compile(r"AIza[0-9A-Za-z_-]{35}"),
    # An OAuth 2.0 access token Google issues (for a service account or a person): always ``ya29.``.
    "Google OAuth token": re.compile(_ALONE + r"ya29\.[0-9A-Za-z._-]{20,}"),
    # github_pat_ + 22 + _ + 59 (and a cut one still of some length); detect-secrets' GitHub plugin
    # knows only ghp_, gho_, ghu_, ghs_ and ghr_.
    "GitHub fine-grained token": re.compile(_ALONE + r"github_pat_[0-9A-Za-z_]{50,}"),
    # npm_ + 36 alphanumerics: detect-secrets' npm plugin knows one only inside an .npmrc line. Not
    # only alone: two joined (a key made of both), one with a suffix or glued to a word are tokens
    # too, and no digest or word holds "npm_" then 36 letters and digits (a name's parts have "_").
    "npm token": re.compile(r"npm_[0-9A-Za-z]{36}"),
    "Azure storage key": re.compile(
        r"(?:AccountKey|SharedAccessKey|SharedAccessSignature)\s*=\s*[^;\s]{8,}", re.IGNORECASE
    ),
    # ddd-dd-dddd, never area 000, 666 or 9xx, group 00 or serial 0000 (none is ever issued)
    "US social security number": re.compile(
        _ALONE + r"(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![0-9A-Za-z]|-\d)"
    ),
}
# ``Basic <base64 of user:password>`` (RFC 7617), as a header's value, alone or inside text; the
# scheme's name is any case. Recognised only when the token decodes to text with a colon, so that
# "basic settings" and other words after "basic" stay in clear.
BASIC_CREDENTIALS = re.compile(r"(?<![0-9A-Za-z])basic\s+([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])", re.IGNORECASE)
# A card number stands alone: digits inside a longer token (a hex digest) are not one.
CARD_CANDIDATE = re.compile(r"(?<![0-9A-Za-z])(?:\d[ -]?){12,18}\d(?![0-9A-Za-z])")
# A parameter of a URL's query (or fragment, or a connection string's part) and its value.
QUERY_PARAMETER = re.compile(r"(?:^|[?&#;])([A-Za-z0-9_.~\[\]-]{1,64})=([^&#;\s]+)")
SECRET_QUERY_NAMES = {"key", "sig", "signature", "pwd", "pass", "code", "x-amz-signature", "x-goog-signature"}
# E.164 (+ and 8 to 15 digits), whole or grouped: +14155552671, +44 20 7946 0958, +1 (415) 555-2671.
# Each group ends at a separator, so a long run of digits is never split every way (no backtracking blow-up).
PHONE_INTERNATIONAL = re.compile(
    r"(?<![0-9A-Za-z+.])\+(?:[1-9]\d{7,14}|[1-9]\d{0,3}(?:[ .-]?\(\d{1,5}\))?(?:[ .-]\d{1,10}){1,6})"
    r"(?![0-9A-Za-z]|[.-]\d)"
)
# The North American plan, grouped 3-3-4: (415) 555-2671, 415-555-2671, 1 415.555.2671.
PHONE_NORTH_AMERICAN = re.compile(
    r"(?<![0-9A-Za-z+.])(?:1[ .-])?(?:\([2-9]\d{2}\) ?|[2-9]\d{2}[ .-])[2-9]\d{2}[ .-]\d{4}(?![0-9A-Za-z]|[.-]\d)"
)
# Each country's IBAN length (the IBAN registry); the check digits are verified too (mod 97).
IBAN_LENGTHS = {
    country: int(length)
    for country, length in re.findall(
        r"([A-Z]{2})(\d{2})",
        "AD24 AE23 AL28 AT20 AZ28 BA20 BE16 BG22 BH22 BI27 BR29 BY28 CH21 CR22 CY28 CZ24 DE22 DJ27 DK18 "
        "DO28 EE20 EG29 ES24 FI18 FK18 FO18 FR27 GB22 GE22 GI23 GL18 GR27 GT28 HN28 HR21 HU28 IE22 IL23 "
        "IQ23 IS26 IT27 JO30 KW30 KZ20 LB28 LC32 LI21 LT20 LU20 LV21 LY25 MC27 MD24 ME22 MK19 MN20 MR27 "
        "MT31 MU30 NI28 NL18 NO15 OM23 PK24 PL28 PS29 PT25 QA29 RO24 RS22 RU33 SA24 SC31 SD18 SE24 SI19 "
        "SK24 SM27 SO23 ST25 SV28 TL23 TN24 TR26 UA29 VA22 VG24 XK20 YE30",
    )
}
IBAN_CANDIDATE = re.compile(r"(?<![0-9A-Za-z])([A-Z]{2})(\d{2})((?: ?[A-Z0-9]){11,30})", re.IGNORECASE)
# A token that may be base64 (standard or URL-safe) of a JSON object or list.
BASE64_CANDIDATE = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{16,}={0,2}")
MAX_BASE64_TOKEN = 1 << 20
CACHED_TEXT = 512  # longer texts (an allowed field's body) are scanned each time, not kept


@dataclasses.dataclass(frozen=True)
class Policy:
    """What a data contract lets stay in clear, beyond the exporter's allowlist."""

    allowed_fields: frozenset[str] = frozenset()  # "tool.field", e.g. "write_file.path"
    patterns: tuple[tuple[str, re.Pattern[str]], ...] = ()  # more things that count as secrets
    source: str = "default: nothing beyond the allowlist"

    def allows(self, tool: str, field: str) -> bool:
        return f"{tool}.{field}" in self.allowed_fields

    def describe(self) -> dict[str, Any]:
        """The policy as the manifest names it, scanned like any value: an allowed field names a tool."""
        return {
            "source": clear(self.source, self),
            "allowed_fields": [clear(name, self) for name in sorted(self.allowed_fields)],
            "patterns": [clear(name, self) for name, _ in self.patterns],
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
    if len(text) <= CACHED_TEXT:
        return _cached_kind(text, policy)  # an export repeats the same tools, states and ids many times
    return _kind(text, policy)


@functools.lru_cache(maxsize=8192)
def _cached_kind(text: str, policy: Policy) -> str | None:
    return _kind(text, policy)


def _kind(text: str, policy: Policy, *, decode: bool = True) -> str | None:
    for name, pattern in (*PATTERNS.items(), *policy.patterns):
        if pattern.search(text):
            return name
    for name, recognises in RECOGNISERS:
        if recognises(text):
            return name
    if decode and _base64_json_with_a_secret(text, policy):
        return "base64 JSON holding a secret"
    for plugin in DETECT_SECRETS_PLUGINS:
        for _ in plugin.analyze_string(text):
            return str(plugin.secret_type)
    return None


def _card_number(text: str) -> bool:
    return any(_luhn(re.sub(r"\D", "", match.group())) for match in CARD_CANDIDATE.finditer(text))


def _luhn(digits: str) -> bool:
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for index, digit in enumerate(reversed(digits)):
        number = int(digit) * (2 if index % 2 else 1)
        total += number - 9 if number > 9 else number
    return total % 10 == 0


def _basic_credentials(text: str) -> bool:
    for match in BASIC_CREDENTIALS.finditer(text):
        token = match.group(1)
        try:
            decoded = binascii.a2b_base64(token + "=" * (-len(token.rstrip("=")) % 4)).decode("utf-8")
        except (binascii.Error, ValueError):
            continue
        if ":" in decoded and decoded.isprintable():
            return True
    return False


def _query_secret(text: str) -> bool:
    """``?api_key=…``, ``&token=…``, ``#access_token=…``, ``&sig=…``: a parameter that names a secret."""
    if "=" not in text:
        return False
    for match in QUERY_PARAMETER.finditer(text):
        name = match.group(1).lower().replace("-", "_")
        if name in SECRET_QUERY_NAMES or name.replace("_", "-") in SECRET_QUERY_NAMES or secret_key(name):
            return True
    return False


def _phone_number(text: str) -> bool:
    if "+" in text:
        for match in PHONE_INTERNATIONAL.finditer(text):
            if 8 <= sum(character.isdigit() for character in match.group()) <= 15:
                return True
    return PHONE_NORTH_AMERICAN.search(text) is not None


def _iban(text: str) -> bool:
    for match in IBAN_CANDIDATE.finditer(text):
        country, check = match.group(1).upper(), match.group(2)
        length = IBAN_LENGTHS.get(country)
        if length is None:
            continue
        body: list[str] = []
        end = match.start(3)
        while end < len(text) and len(body) < length - 4:  # the country's length, in groups or not
            character = text[end]
            if character.isascii() and character.isalnum():
                body.append(character.upper())
            elif character != " ":
                break
            end += 1
        if len(body) != length - 4 or (end < len(text) and text[end].isascii() and text[end].isalnum()):
            continue  # shorter than the country's IBAN, or a longer token
        if _mod97("".join(body) + country + check) == 1:
            return True
    return False


def _mod97(text: str) -> int:
    return int("".join(str(int(character, 36)) for character in text)) % 97


RECOGNISERS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("card number", _card_number),
    ("Basic credentials", _basic_credentials),
    ("secret in a URL query", _query_secret),
    ("phone number", _phone_number),
    ("IBAN", _iban),
)


def _base64_json_with_a_secret(text: str, policy: Policy) -> bool:
    """A base64 token (standard or URL-safe) whose bytes are JSON with a key that names a
    secret, or a value that looks like one."""
    for match in BASE64_CANDIDATE.finditer(text):
        token = match.group()
        if len(token) > MAX_BASE64_TOKEN:
            continue
        token = token.rstrip("=").replace("-", "+").replace("_", "/")
        try:
            data = binascii.a2b_base64(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            continue
        if data.lstrip()[:1] not in (b"{", b"["):
            continue
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            continue
        if _holds_a_secret(document, policy):
            return True
    return False


def _holds_a_secret(document: Any, policy: Policy) -> bool:
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if any(secret_key(str(key)) or _kind(str(key), policy, decode=False) for key in value):
                return True
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str) and _kind(value, policy, decode=False):
            return True
    return False


def secret_key(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in SECRET_KEY_WORDS)


def clear(value: Any, policy: Policy, key: str = "") -> Any:
    """``value`` kept in clear where nothing in it looks like a secret; anything that does is redacted.

    Walks lists and objects: a key that names a secret redacts its value, and a key
    that itself looks like a secret is replaced by its digest. Ids go through here
    too, and a whole number, int or float, is scanned as its digits (a card number stored as one).
    """
    if key and secret_key(key):
        return redacted(value)
    if isinstance(value, str):
        if protocol.HEX64_RE.fullmatch(value):
            return value  # a digest is what evidence is made of, and never a secret
        return redacted(value) if secret_kind(value, policy) else value
    if isinstance(value, int) and not isinstance(value, bool):
        return redacted(value) if secret_kind(str(value), policy) else value
    if isinstance(value, float) and value.is_integer():
        # JSON has one kind of number: 4111111111111111.0 and 4.111111111111111e15 are the digits
        # of a card as surely as 4111111111111111 is. A fraction (a size, a ratio) is no card.
        return redacted(value) if secret_kind(str(int(value)), policy) else value
    if isinstance(value, list):
        return [clear(item, policy) for item in value]
    if isinstance(value, dict):
        return {shown_key(name, policy): clear(item, policy, name) for name, item in value.items()}
    return value


def shown_key(name: str, policy: Policy) -> str:
    """An object's key as an export shows it: in clear, or the ``sha256:`` digest of the key."""
    return name if secret_kind(name, policy) is None else redacted(name)["redacted"]


def file_name(value: str, policy: Policy) -> str:
    """An id as a file name shows it: in clear, or ``sha256-<digest>`` (the digest of its redaction
    marker, with a dash where the marker has a colon, which no file name on Windows may hold)."""
    shown = clear(value, policy)
    return shown if isinstance(shown, str) else shown["redacted"].replace(":", "-", 1)


def fields(values: Any, allowed: Iterable[str], policy: Policy) -> Any:
    """An object whose ``allowed`` fields stay in clear (after the scanner) and the rest are redacted."""
    if not isinstance(values, dict):
        return redacted(values)
    allowed = set(allowed)
    return {
        shown_key(name, policy): clear(value, policy, name) if name in allowed else redacted(value)
        for name, value in values.items()
    }
