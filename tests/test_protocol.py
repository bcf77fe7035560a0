"""receipts.protocol against the spec's vectors, the JSON corpus, and properties."""

from __future__ import annotations

import errno
import json
import os
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from receipts import durable, protocol
from tests.helpers import PROJECT, corpus_files, data_path

DUPLICATE_KEY_FILES = {"y_object_duplicated_key.json", "y_object_duplicated_key_and_value.json"}


def test_protocol_and_runtime_import_nothing_from_django():
    import subprocess
    import sys

    code = (
        "import sys, receipts.protocol, receipts.durable, receipts.tools, receipts.tasks, receipts.runtime,"
        " receipts.recovery, receipts.replay, receipts.reader, receipts.findings, receipts.cli, receipts.demo;"
        "sys.exit(1 if any(m == 'django' or m.startswith('django.') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_canonical_json_matches_every_vector(vectors):
    for vector in vectors["canonical_json"]:
        encoded = protocol.canonical_json(vector["value"])
        assert encoded == vector["canonical_utf8"].encode("utf-8")
        assert protocol.sha256_hex(encoded) == vector["sha256"]


def test_canonical_json_refuses_every_non_finite_vector(vectors):
    for literal in vectors["canonical_json_rejects"]:
        with pytest.raises(ValueError, match="JSON compliant"):
            protocol.canonical_json(float(literal))


def test_make_call_id_matches_every_vector(vectors):
    for vector in vectors["call_id"]:
        call_id = protocol.make_call_id(
            vector["contract_sha256"],
            vector["attempt"],
            vector["tool"],
            vector["args"],
            tool_version=vector.get("tool_version"),
            identity=vector["identity"],
        )
        assert call_id == vector["call_id"], vector.get("note", vector["identity"])


def test_make_call_id_refuses_an_unknown_formula():
    with pytest.raises(ValueError, match="unknown identity"):
        protocol.make_call_id("c" * 64, 1, "t", {}, identity="call-id-v9")


def test_input_sha256_matches_every_vector(vectors):
    for vector in vectors["input_sha256"]:
        assert protocol.input_sha256(vector["args"]) == vector["input_sha256"]


def test_request_digest_matches_every_vector(vectors):
    for vector in vectors["request_digest_write_task_v1"]:
        assert protocol.request_digest(vector["request"]) == vector["request_digest"], vector["case"]


def test_the_corpus_is_there():
    names = [path.name for path in corpus_files()]
    assert len(names) > 300
    assert {name[:2] for name in names} == {"y_", "n_", "i_"}


@pytest.mark.parametrize("path", corpus_files(), ids=lambda path: path.name)
def test_load_json_strict_on_the_corpus(path: Path):
    data = path.read_bytes()
    try:
        protocol.load_json_strict(data)
    except ValueError:
        accepted = False
    else:
        accepted = True
    # Anything but ValueError escapes the try above and fails the test.
    if path.name in DUPLICATE_KEY_FILES:
        assert not accepted, "duplicate keys must be refused"
    elif path.name.startswith("y_"):
        assert accepted
    elif path.name.startswith("n_") or refused_by_our_rules(path.name):
        assert not accepted
    else:  # an i_ number our rules leave to Python: finite, so accepted
        assert accepted


def refused_by_our_rules(name: str) -> bool:
    """The i_ cases ("parsers may go either way") that RUN_DIRECTORY.md decides: refused.

    Lone surrogates and invalid UTF-8 (every i_string_ and i_object_ case), a byte
    order mark, nesting past 256, and numbers that overflow to infinity.
    """
    if not name.startswith("i_"):
        return False
    return (
        name.startswith(("i_string_", "i_object_"))
        or "BOM" in name
        or name == "i_structure_500_nested_arrays.json"
        or any(word in name for word in ("huge_exp", "overflow"))
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"a": NaN}', "NaN"),
        (b"[Infinity]", "Infinity"),
        (b"[-Infinity]", "Infinity"),
        (b"[1e400]", "out of range"),
        (b'{"a": 1, "a": 2}', "duplicate key"),
        (b'\xef\xbb\xbf{"a": 1}', "byte order mark"),
        (b'{"a": "\xff"}', "invalid UTF-8"),
        (b'{"a": "\\ud800"}', "lone surrogate"),
        (b'{"\\udc00": 1}', "lone surrogate"),
        (b"[" * 100_000 + b"]" * 100_000, "nesting"),
        (b"[" * 300 + b"]" * 300, "nesting"),
        (b"", "invalid JSON"),
        (b'{"a": 1} x', "invalid JSON"),
    ],
)
def test_load_json_strict_refuses_with_a_clear_value_error(data: bytes, message: str):
    with pytest.raises(ValueError, match=message):
        protocol.load_json_strict(data)


def test_load_json_strict_accepts_a_surrogate_pair_and_nesting_within_the_limit():
    assert protocol.load_json_strict(b'["\\ud834\\udd1e"]') == ["\U0001d11e"]
    depth = protocol.MAX_JSON_DEPTH
    assert protocol.load_json_strict(b"[" * depth + b"]" * depth) is not None


def test_load_json_strict_refuses_text_instead_of_bytes():
    with pytest.raises(ValueError, match="takes bytes"):
        protocol.load_json_strict('{"a": 1}')  # type: ignore[arg-type]  # the point: text where bytes belong


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(st.characters(exclude_categories=["Cs"]), max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=8), st.randoms())
@settings(max_examples=200)
def test_canonical_bytes_do_not_depend_on_key_order(mapping, random):
    items = list(mapping.items())
    random.shuffle(items)
    assert protocol.canonical_json(dict(items)) == protocol.canonical_json(mapping)


@given(json_values)
@settings(max_examples=300)
def test_canonical_bytes_survive_a_strict_decode_encode_round_trip(value):
    encoded = protocol.canonical_json(value)
    assert protocol.canonical_json(protocol.load_json_strict(encoded)) == encoded


def values_in(value: object) -> int:
    if isinstance(value, dict):
        return 1 + sum(values_in(child) for child in value.values())
    if isinstance(value, list):
        return 1 + sum(values_in(child) for child in value)
    return 1


@given(json_values, st.booleans())
@settings(max_examples=300)
def test_json_nodes_never_counts_fewer_values_than_a_text_holds(value, spaced):
    """The bound a message is held to before it is parsed (issue 55, case 3): never under the
    values it holds, whatever its strings hold (commas, brackets, escaped quotes, backslashes),
    on the quick count and on the one that looks past strings."""
    text = json.dumps(value, indent=1 if spaced else None).encode() if spaced else protocol.canonical_json(value)
    for limit in (protocol.MAX_VALUE_NODES, 0):  # 0: every text takes the count past its strings
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(protocol, "MAX_VALUE_NODES", limit)
            assert protocol.json_nodes(text) >= values_in(value)
    if isinstance(value, str):  # a string is one value, whatever it holds
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(protocol, "MAX_VALUE_NODES", 0)
            assert protocol.json_nodes(json.dumps(value).encode()) == 1


text_fields = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)


@st.composite
def requests(draw):
    request = {field: draw(st.none() | text_fields) for field in protocol.REQUEST_FIELDS}
    request["references"] = draw(st.none() | st.lists(text_fields, max_size=3))
    return request


def map_text(request: dict, change) -> dict:
    """``request`` with ``change`` applied to every string in it."""

    def each(value):
        if isinstance(value, str):
            return change(value)
        if isinstance(value, list):
            return [each(item) for item in value]
        return value

    return {key: each(value) for key, value in request.items()}


@given(requests())
@settings(max_examples=200)
def test_request_digest_ignores_line_end_style(request):
    # The same text written with \n, \r\n or \r line ends. (A text that already holds a
    # \r is not "the same text with other line ends" once each \n becomes \r\n.)
    request = map_text(request, lambda text: text.replace("\r", ""))
    digest = protocol.request_digest(request)
    assert protocol.request_digest(map_text(request, lambda text: text.replace("\n", "\r\n"))) == digest
    assert protocol.request_digest(map_text(request, lambda text: text.replace("\n", "\r"))) == digest


@given(requests())
@settings(max_examples=200)
def test_request_digest_ignores_nfd_versus_nfc(request):
    nfd = map_text(request, lambda text: unicodedata.normalize("NFD", text))
    assert protocol.request_digest(nfd) == protocol.request_digest(request)


@given(requests(), st.dictionaries(st.text(min_size=1).filter(lambda k: k not in protocol.REQUEST_FIELDS), json_values))
@settings(max_examples=200)
def test_request_digest_ignores_execution_fields(request, extra):
    assert protocol.request_digest({**extra, **request}) == protocol.request_digest(request)


def test_request_digest_keeps_types_and_array_order():
    base = {"subject": "x", "priority": 1, "references": ["a", "b"]}
    assert protocol.request_digest(base) != protocol.request_digest({**base, "priority": "1"})
    assert protocol.request_digest(base) != protocol.request_digest({**base, "references": ["b", "a"]})


def test_request_digest_normalises_object_keys_too():
    nfc, nfd = "é", unicodedata.normalize("NFD", "é")
    assert protocol.request_digest({"parent": {nfc: 1}}) == protocol.request_digest({"parent": {nfd: 1}})


def test_write_durable_replaces_the_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "receipt.json"
    durable.write_durable(target, b"one", root=tmp_path)
    durable.write_durable(target, b"two", root=tmp_path)
    assert target.read_bytes() == b"two"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["receipt.json"]


def test_an_fsync_error_is_fatal_and_the_old_content_stays(tmp_path, monkeypatch):
    target = tmp_path / "receipt.json"
    durable.write_durable(target, b'{"status": "prepared"}', root=tmp_path)

    def failing_fsync(fd):
        raise OSError(errno.EIO, "simulated disk error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="simulated disk error"):
        durable.write_durable(target, b'{"status": "committed"}', root=tmp_path)
    monkeypatch.undo()
    assert target.read_bytes() == b'{"status": "prepared"}'
    assert sorted(path.name for path in tmp_path.iterdir()) == ["receipt.json"]


def test_create_durable_fails_when_the_target_exists_and_keeps_it(tmp_path):
    target = tmp_path / "TASK-000001.md"
    durable.create_durable(target, b"first", root=tmp_path)
    with pytest.raises(FileExistsError):
        durable.create_durable(target, b"second", root=tmp_path)
    assert target.read_bytes() == b"first"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["TASK-000001.md"]


def test_create_durable_never_uses_replace(tmp_path, monkeypatch):
    def forbidden(*args):
        raise AssertionError("a create-only write must not use os.replace")

    monkeypatch.setattr(os, "replace", forbidden)
    durable.create_durable(tmp_path / "task.md", b"content", root=tmp_path)
    assert (tmp_path / "task.md").read_bytes() == b"content"


def test_temp_files_are_named_so_readers_skip_them(tmp_path):
    temp = tmp_path / durable.temp_name_for("abc.json")
    assert temp.name.startswith(".") and temp.name.endswith(".tmp")
    temp.write_bytes(b"partial")
    assert durable.remove_temp_files(tmp_path / "abc.json", tmp_path) == [temp]
    assert not temp.exists()


def test_append_event_chains_each_line_to_the_previous(tmp_path):
    from tests.ledger import read_ledger

    for number in range(5):
        event = durable.append_event(tmp_path, "note", {"n": number, "seq": 999})
        assert event["seq"] == number + 1
    events = read_ledger(tmp_path)
    assert [event["n"] for event in events] == [0, 1, 2, 3, 4]
    assert events[0]["prev_sha256"] == protocol.ZERO_HASH


def test_append_event_cuts_a_torn_tail_left_by_a_crash(tmp_path):
    from tests.ledger import read_ledger

    durable.append_event(tmp_path, "note", {})
    with (tmp_path / "events.jsonl").open("ab") as ledger:
        ledger.write(b'{"seq": 2, "type": "no')  # a crash mid-append
    durable.append_event(tmp_path, "note", {})
    assert [event["seq"] for event in read_ledger(tmp_path)] == [1, 2]


def test_times_are_rfc3339_utc_with_a_z():
    text = protocol.format_time(protocol.utc_now())
    assert text.endswith("Z") and "T" in text
    assert protocol.format_time(protocol.parse_time(text)) == text
    with pytest.raises(ValueError, match="without a zone"):
        protocol.parse_time("2026-11-29T12:00:00")


def test_vectors_file_is_valid_under_the_strict_rules():
    data = data_path("vectors.json").read_bytes()
    assert protocol.load_json_strict(data) == json.loads(data)


@pytest.mark.parametrize("hostile", [b"[1, 2]", b'{"seq": NaN}', b"\xff", b'{"seq": "7"}'])
def test_append_event_goes_on_after_a_hostile_last_line(tmp_path, hostile):
    durable.append_event(tmp_path, "note", {})
    with (tmp_path / "events.jsonl").open("ab") as ledger:
        ledger.write(hostile + b"\n")
    event = durable.append_event(tmp_path, "note", {})
    assert event["seq"] == 2, "seq follows the last valid event"
    assert event["prev_sha256"] == protocol.sha256_hex(hostile), "the chain covers the hostile line's bytes"


def test_the_rooms_import_only_what_the_layout_says():
    import subprocess
    import sys

    # The reader never loads the writer, and the pages' read layer never loads the reader.
    code = (
        "import sys, importlib; mod = importlib.import_module(sys.argv[1]);"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('receipts'))))"
    )
    loaded = {}
    for module in ("receipts.reader", "receipts.recovery"):
        completed = subprocess.run([sys.executable, "-c", code, module], capture_output=True, text=True, check=True)
        loaded[module] = set(completed.stdout.split())
    assert not loaded["receipts.reader"] & {"receipts.runtime", "receipts.tasks", "receipts.tools", "receipts.durable"}
    # ... findings: a leaf, the sentences the protocol's problems are said in (docs/architecture.md);
    # and the table of states (``receipts.states``), standard library with no import of its own.
    assert loaded["receipts.recovery"] == {
        "receipts",
        "receipts.findings",
        "receipts.protocol",
        "receipts.recovery",
        "receipts.states",
    }
    # The pages' read layer reaches the recovery rules without the reader; only the
    # evidence of a call in doubt (the adapters' evidence, in receipts.tools) opens files,
    # through the confined open (receipts.confined: no symlink below the run followed).
    for module in (
        "evidence/review/selectors.py",
        "evidence/review/listings.py",
        "receipts/doubt.py",
        "receipts/tools.py",
    ):
        imported = imported_modules(PROJECT / module)
        assert not {name for name in imported if name.startswith("receipts.reader")}, module


def test_a_tool_call_through_the_command_line_loads_no_reader_and_no_subprocess(tmp_path):
    """An agent's host starts the writer once a call: the reader (replay's) and subprocess
    (apply_changes' Git mode) were a sixth of that start for a call that uses neither. (shutil
    stays: argparse asks it for the terminal's width.)"""
    import subprocess
    import sys

    run_dir = tmp_path / "run-1"
    subprocess.run([sys.executable, "-m", "receipts", "init", str(run_dir), "--contract-sha256", "0" * 64],
                   check=True, capture_output=True)  # fmt: skip
    # -X importtime names every module the process imports, on standard error.
    args = json.dumps({"path": "notes.txt", "content": "hello"})
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "receipts", "call", str(run_dir), "--tool", "write_file",
         "--args", args], capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(completed.stdout)["status"] == "committed"
    imported = {line.rsplit("|", 1)[-1].strip() for line in completed.stderr.splitlines() if "|" in line}
    assert "receipts.runtime.executor" in imported, "the check reads the import list it means to"
    assert not {"receipts.reader", "receipts.replay", "subprocess"} & imported


def test_the_ledger_append_and_signing_do_not_import_each_other():
    # Signing reads a run's steer.json through the confined open; the ledger's append asks it for
    # the run's key. One way only, lazily or not: a circle would make either half load the other.
    assert "receipts.durable" not in imported_modules(PROJECT / "receipts" / "signing.py")
    assert "receipts.signing" in imported_modules(PROJECT / "receipts" / "durable.py")


def imported_modules(path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names if node.module == "receipts")
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names
