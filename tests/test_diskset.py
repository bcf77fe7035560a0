"""``DiskSet``: a set of call ids in a SQLite file behaves as a set does, whatever the ids (any
text a ledger's JSON can hold, lone surrogates too), however few it holds in memory, and another
process that unpickles it reads the same set from the file. ``SpillingMap``: a run's listing,
in memory or on disk, behaves as a dict does and gives the receipts' buckets their stored format."""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence.ingest import rereading
from receipts.reader import diskset, receipt_bucket, safe_open
from receipts.reader.diskset import DiskSet, SpillingMap
from tests.helpers import PROJECT

ids = st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=12)
operations = st.lists(st.tuples(st.sampled_from(["add", "discard", "clear", "contains"]), ids), max_size=60)


@settings(max_examples=80, deadline=None)
@given(operations, st.integers(min_value=1, max_value=5), st.lists(ids, max_size=20))
def test_a_disk_set_does_what_a_set_does(steps, buffered, asked):
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "calls.sqlite3")
        try:
            on_disk, in_memory = DiskSet(path, "ids", buffered=buffered), set[str]()
            for operation, value in steps:
                if operation == "contains":
                    assert (value in on_disk) == (value in in_memory)
                elif operation == "clear":
                    on_disk.clear()
                    in_memory.clear()
                else:
                    getattr(on_disk, operation)(value)
                    getattr(in_memory, operation)(value)
            assert list(on_disk) == sorted(in_memory), "read back in Python's sorted order"
            assert len(on_disk) == len(in_memory)
            assert on_disk.among(asked) == in_memory & set(asked)
            others = DiskSet(path, "others", buffered=buffered)
            others |= asked
            assert list(on_disk.sorted_without(others)) == sorted(in_memory - set(asked))
            assert on_disk - set(asked) == in_memory - set(asked)
            assert isinstance(on_disk - set(asked), set), "a difference is a set in memory"
        finally:
            diskset.release(path)


def test_another_process_that_unpickles_a_set_reads_it_from_the_file(tmp_path):
    path = str(tmp_path / "calls.sqlite3")
    written = DiskSet(path, "call_ids", buffered=1000)
    written |= {"b", "a", "\ud800 lone", "é"}  # all still waiting in memory: pickling writes them
    try:
        child = subprocess.run(
            [sys.executable, "-c", "import pickle, sys; print(ascii(list(pickle.load(sys.stdin.buffer))))"],
            input=pickle.dumps(written), capture_output=True, cwd=PROJECT, check=True,
        )  # fmt: skip
    finally:
        diskset.release(path)
    assert child.stdout.decode().strip() == ascii(sorted({"b", "a", "\ud800 lone", "é"}))


def test_a_released_file_is_closed_and_a_table_name_is_checked(tmp_path):
    path = str(tmp_path / "calls.sqlite3")
    DiskSet(path, "call_ids").add("a")
    assert path in diskset._connections
    diskset.release(path)
    assert path not in diskset._connections
    with pytest.raises(ValueError, match="not a table name"):
        DiskSet(path, "ids; DROP TABLE call_ids")


# Names a receipts folder can hold: call ids of any length, dots (whose sorted order interleaves
# buckets: "a.b", "a", "a.z"), names that are not .json, bytes that are not UTF-8 (as
# os.scandir gives them, surrogate-escaped).
names = st.one_of(
    st.text("ab.-\udcff\u00e9", min_size=1, max_size=4).map(lambda stem: f"{stem}.json"),
    st.text("ab.", min_size=1, max_size=3),
)
signatures = st.text("0123456789.", min_size=0, max_size=6)
map_steps = st.lists(st.tuples(st.sampled_from(["set", "delete", "get"]), names, signatures), max_size=50)


@settings(max_examples=80, deadline=None)
@given(map_steps, st.integers(min_value=0, max_value=4), st.integers(min_value=1, max_value=4))
def test_a_spilling_map_does_what_a_dict_does_in_memory_and_on_disk(steps, in_memory, buffered):
    spilling, plain, most = SpillingMap(in_memory=in_memory, buffered=buffered), {}, 0
    try:
        for operation, name, value in steps:
            if operation == "set":
                spilling[name] = plain[name] = value
                most = max(most, len(plain))
            elif operation == "delete" and name in plain:
                del spilling[name], plain[name]
            elif operation == "delete":
                with pytest.raises(KeyError):
                    del spilling[name]
            else:
                assert spilling.get(name) == plain.get(name)
                assert (name in spilling) == (name in plain)
        assert list(spilling.sorted_items()) == sorted(plain.items())
        assert list(spilling) == sorted(plain) and len(spilling) == len(plain)
        for prefix in ("", "a", "a.", "\udcff", "\u00e9", "b-", "zz"):
            assert list(spilling.items_from(prefix)) == sorted(i for i in plain.items() if i[0].startswith(prefix))
        assert spilling.on_disk == (most > in_memory), "on disk once it held more than it may in memory"
    finally:
        spilling.close()


def _buckets_as_documented(listed: dict[str, str]) -> dict[str, str]:
    """Each bucket's lines ``name NUL signature``, sorted, joined by newlines, hashed: the format
    the buckets stored with every run were taken in."""
    lines: dict[str, list[str]] = {}
    for name, signature in listed.items():
        lines.setdefault(receipt_bucket(name), []).append(f"{name}\0{signature}")
    return {
        bucket: hashlib.sha256("\n".join(sorted(found)).encode("utf-8", "surrogateescape")).hexdigest()
        for bucket, found in lines.items()
    }


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(names, signatures, max_size=40), st.integers(min_value=0, max_value=5))
def test_the_buckets_of_a_listing_on_disk_are_those_of_the_documented_format(listed, in_memory):
    spilling = SpillingMap(in_memory=in_memory, buffered=3)
    try:
        spilling.update(listed)
        buckets = rereading.receipt_buckets(spilling)
        assert buckets == _buckets_as_documented(listed)
        assert rereading.receipt_buckets(listed) == _buckets_as_documented(listed)
        for some in (set(buckets), set(list(buckets)[::2]), {"a", "a."}, set()):
            in_memory = {name: signature for name, signature in listed.items() if receipt_bucket(name) in some}
            assert rereading._listed_in_buckets(spilling, some) == in_memory
    finally:
        spilling.close()


def test_a_folder_listed_past_its_bound_gives_the_names_sorted_as_in_memory(tmp_path):
    folder = tmp_path / "receipts"
    folder.mkdir()
    made = [f"{index:04x}.json" for index in range(0, 300, 7)] + ["b.json", "a.json", ".hidden", "x.tmp", "é.json"]
    for name in made:
        (folder / name).write_text("{}")
    (folder / os.fsdecode(b"\xff.json")).write_text("{}")  # not UTF-8: surrogate-escaped
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        in_memory = list(safe_open.list_names(fd, in_memory=10_000))
        on_disk = list(safe_open.list_names(fd, in_memory=3))
    finally:
        os.close(fd)
    assert in_memory == sorted(name for name in os.listdir(folder) if name not in (".hidden", "x.tmp"))
    assert on_disk == in_memory
