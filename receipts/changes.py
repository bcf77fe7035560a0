"""``apply_changes``: several files written, changed or removed as one call, one atomic version.

Standard library only (the Git mode runs the ``git`` command to write; everything it reads,
it reads itself). Several ``os.replace`` calls are several steps: a reader between two of
them sees a mix. Here the new tree is built aside, checked (each file holds what it should),
and made current by one atomic step, so that a reader sees the old version or the new one,
never a mix, whenever the writer is killed:

- ``content`` (the default): each version is a folder named by its tree hash,
  ``workspace/.versions/<tree>/trees/<hash>``, and the visible ``workspace/<tree>`` is a
  symlink to the current one, swapped by rename(2) (made under a temp name, the folder
  fsynced, renamed over);
- ``git``: the version is a commit of the bare repository ``workspace/<tree>.git``, built
  with a temporary index and ``commit-tree``, made current by ``git update-ref`` given the
  old value (compare-and-swap) of ``refs/heads/main``: that ref is what a reader sees.

Before a version is made current, the call's record says which version it started from and
which it makes (content: ``calls/<call_id>.json``; git: ``refs/callproof/calls/<call_id>``).
That is what ``query`` and ``evidence`` read: the new version current is the effect; the
version the call started from still current, and no move away from the new one ever recorded
(a later call's record starting from it, a reflog line leaving it), is positive evidence that
it never happened. Everything is written under ``RUN_DIR/workspace/`` (the lock too:
``workspace/.versions/<tree>.lock``), never in ``.writer/``. Versions no longer current are
kept: collecting them is left to the operator (docs/runtime-authors.md).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import posixpath
import re
import stat
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from receipts.confined import UnsafePath, folder, open_in, read_file, read_json_file
from receipts.durable import (
    create_durable,
    exclusive_lock,
    failpoint,
    is_temp_name,
    json_file,
    remove_temp_files,
    temp_name_for,
    write_all,
)
from receipts.protocol import canonical_json, sha256_hex
from receipts.tools import (
    ABSENT,
    NOT_DONE,
    PRESENT,
    UNCLEAR,
    Evidence,
    Fact,
    OutcomeUnknown,
    Rejected,
    _NotDone,
    normal_workspace_path,
    short_text,
)

MODES = ("content", "git")
# Bounds: a call is one reviewable change, and every file of it is checked before it is made current.
MAX_CHANGES = 1000
MAX_PATH_LENGTH = 1024
MAX_TREE_NAME_LENGTH = 100
VERSIONS = ".versions"  # workspace/.versions/<tree>/: the content mode's versions and records, and the locks
GIT_REF = "refs/heads/main"
CALL_REFS = "refs/callproof/calls"
HEX64_RE = re.compile(r"[0-9a-f]{64}")
OID_RE = re.compile(r"[0-9a-f]{40}")
# The keys `git init --bare` writes: a repository whose config says more (a hook path, an
# fsmonitor, a filter) is not one this tool made, and git is not run on it.
GIT_CONFIG_KEYS = {"repositoryformatversion", "filemode", "bare", "logallrefupdates"}


def tree_digest(manifest: Mapping[str, str]) -> str:
    """The digest over a tree's files: sha256 of the canonical JSON of ``{path: sha256 of its bytes}``.

    It is the content mode's version (the folder's name) and both modes' ``files_sha256``: the
    same changes on the same files give the same digest in either mode."""
    return sha256_hex(canonical_json(dict(manifest)))


def _normal_tree(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TREE_NAME_LENGTH:
        raise Rejected(f"argument 'tree' must be a name of 1 to {MAX_TREE_NAME_LENGTH} characters")
    if "/" in value or "\\" in value or "\x00" in value or value in (".", "..") or value.startswith("."):
        raise Rejected(f"tree {value!r} must be one plain name in the workspace (no slash, not starting with a dot)")
    if value.endswith(".git") or is_temp_name(value):
        raise Rejected(f"tree {value!r} must not end in .git (the Git mode's repository is <tree>.git)")
    return value


def _normal_change(change: Any) -> dict[str, Any]:
    if not isinstance(change, Mapping):
        raise Rejected("each change must be an object: {path, content} or {path, remove: true}")
    unknown = set(change) - {"path", "content", "remove"}
    if unknown:
        raise Rejected(f"unknown key(s) in a change: {', '.join(sorted(map(str, unknown)))}")
    path = change.get("path")
    if not isinstance(path, str) or len(path) > MAX_PATH_LENGTH:
        raise Rejected(f"a change's path must be a string of at most {MAX_PATH_LENGTH} characters")
    path = normal_workspace_path(path)
    if "remove" in change:
        if change["remove"] is not True or "content" in change:
            raise Rejected(f"change {path!r}: 'remove' must be true, and comes without 'content'")
        return {"path": path, "remove": True}
    if not isinstance(change.get("content"), str):
        raise Rejected(f"change {path!r}: 'content' must be a string (or 'remove': true)")
    return {"path": path, "content": change["content"]}


def case_collision(paths: Iterable[str]) -> tuple[str, str] | None:
    """Two names among ``paths`` and their folders that differ only by case (``str.casefold``):
    one file or folder on a case-insensitive filesystem (macOS' and Windows' by default), where
    a tree holding both cannot be checked out. ``None`` when there are none."""
    seen: dict[str, str] = {}
    for path in paths:
        parts = path.split("/")
        for end in range(1, len(parts) + 1):
            name = "/".join(parts[:end])
            first = seen.setdefault(name.casefold(), name)
            if first != name:
                return first, name
    return None


def _refuse_case_collision(paths: Iterable[str], whose: str) -> None:
    collision = case_collision(paths)
    if collision is not None:
        first, second = collision
        raise Rejected(
            f"{first!r} and {second!r} {whose} differ only by case: one name on a case-insensitive filesystem"
        )


def planned_manifest(base: Mapping[str, str], changes: list[dict[str, Any]]) -> dict[str, str]:
    """The files the new version holds, ``{path: sha256}``: the base's with the changes applied.

    ``Rejected`` (nothing is written) for a removal of a file the base does not hold, for
    a path that is both a file and a folder, and for two paths (or folders) that differ only
    by case (a file the base holds renamed by case in the same changes is no collision)."""
    files = dict(base)
    for change in changes:
        if change.get("remove"):
            if change["path"] not in files:
                raise Rejected(f"cannot remove {change['path']}: the version the call starts from has no such file")
            del files[change["path"]]
        else:
            files[change["path"]] = sha256_hex(change["content"].encode("utf-8"))
    for path in files:
        parent = posixpath.dirname(path)
        while parent:
            if parent in files:
                raise Rejected(f"{parent} would be both a file and a folder")
            parent = posixpath.dirname(parent)
    _refuse_case_collision(sorted(files), "in the version it would make")
    return dict(sorted(files.items()))


class ApplyChanges:
    """Writes, changes and removes several files of ``RUN_DIR/workspace/<tree>`` as one version."""

    name = "apply_changes"
    version = "1.0.0"
    # One call, for the conformance kit (`callproof conformance receipts.changes:ApplyChanges`).
    example_args: ClassVar[dict[str, Any]] = {
        "tree": "site",
        "changes": [{"path": "index.html", "content": "<h1>v1</h1>\n"}, {"path": "notes/a.txt", "content": "a\n"}],
    }
    # A removal of a file the tree does not hold: refused, nothing made current.
    failing_args: ClassVar[dict[str, Any]] = {"tree": "site", "changes": [{"path": "missing.txt", "remove": True}]}

    def __init__(self, default_mode: str = "content") -> None:
        if default_mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.default_mode = default_mode

    def normalise(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(args, Mapping):
            raise Rejected("args must be a JSON object")
        unknown = set(args) - {"tree", "changes", "mode"}
        if unknown:
            raise Rejected(f"unknown argument(s): {', '.join(sorted(map(str, unknown)))}")
        mode = args.get("mode", self.default_mode)
        if mode not in MODES:
            raise Rejected(f"argument 'mode' must be one of {', '.join(MODES)}")
        changes = args.get("changes")
        if not isinstance(changes, list) or not 1 <= len(changes) <= MAX_CHANGES:
            raise Rejected(f"argument 'changes' must be a list of 1 to {MAX_CHANGES} changes")
        normal = sorted((_normal_change(change) for change in changes), key=lambda change: change["path"])
        for first, second in itertools.pairwise(normal):
            if first["path"] == second["path"]:
                raise Rejected(f"two changes of {first['path']}")
        # Two files written whose names differ only by case are one on macOS and Windows (a removal
        # beside a write is a rename by case; the version it makes is checked as it is planned).
        _refuse_case_collision((change["path"] for change in normal if "content" in change), "of the changes")
        # Sorted by path: the same intent in another order is the same call, with the same call_id.
        return {"tree": _normal_tree(args.get("tree")), "mode": mode, "changes": normal}

    def execute(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any]:
        run_dir = Path(run_dir)
        try:
            tree = open_tree(run_dir, args)
            with tree.locked():
                base, version, result = self._prepare(tree, args, call_id)
                failpoint("apply_before_current")
                if tree.current() != version and not tree.was_made_current(call_id, version):
                    tree.make_current(base, version)
                failpoint("apply_after_current")
                return result
        except UnsafePath as unsafe:
            # Only reads and the steps before the one that makes a version current raise it.
            raise Rejected(f"workspace/{args['tree']}: {unsafe}") from None

    def _prepare(self, tree: ContentTree | GitTree, args: Mapping[str, Any], call_id: str) -> tuple[Any, str, dict]:
        """The version the call starts from, the one it makes (built aside and checked, its record
        written) and the result; nothing made current yet."""
        tree.refuse_other_layout()
        current = tree.current()
        record = tree.record(call_id)
        if record is None:
            base = current
            manifest = planned_manifest(tree.manifest(base) if base else {}, args["changes"])
            version = tree.build(base, args["changes"], manifest, call_id)
            result = tree.result(base, version)
            tree.write_record(call_id, base, version)
            return base, version, result
        base, version = record
        # This call_id was here before (a retry after a lost answer): its version, never another.
        if current != version and tree.was_made_current(call_id, version):
            return base, version, tree.result(base, version)  # done, and a later call left it: not again
        if current != version and (current != base or tree.left(version)):
            raise OutcomeUnknown(
                f"this call's version {version[:12]} is not current, and the tree is not at the version it "
                f"started from ({short_text(base, 12)}), or left the new one since: a person decides"
            )
        return base, version, tree.result(base, version)

    def query(self, run_dir: Path, args: Mapping[str, Any], call_id: str) -> dict[str, Any] | _NotDone:
        """The result when the call's version is current (or was, by this call, and a later call left
        it); ``NOT_DONE`` when the call never reached the step that makes it current, or the version it
        started from is still current and nothing ever left the new one; else ``OutcomeUnknown``."""
        found = self.evidence(run_dir, args, call_id)
        if found.verdict == ABSENT:
            return NOT_DONE
        if found.verdict != PRESENT:
            raise OutcomeUnknown("; ".join(found.facts))
        tree = open_tree(Path(run_dir), args)
        record = tree.record(call_id)
        if record is None:
            raise OutcomeUnknown("the call's record went while it was read")
        return tree.result(*record)

    def evidence(
        self, run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
    ) -> Evidence:
        """What the tree shows of this call, read-only (no symlink followed below the run, git not run)."""
        return apply_changes_evidence(run_dir, args, call_id, result)


def apply_changes_git() -> ApplyChanges:
    """The adapter whose calls default to the Git mode: `callproof conformance receipts.changes:apply_changes_git`."""
    return ApplyChanges(default_mode="git")


# --- the two layouts -------------------------------------------------------------------------


def open_tree(run_dir: Path, args: Mapping[str, Any]) -> ContentTree | GitTree:
    tree = args.get("tree")
    if not isinstance(tree, str):
        raise UnsafePath("the call's args name no tree")
    _normal_tree(tree)
    return GitTree(run_dir, tree) if args.get("mode") == "git" else ContentTree(run_dir, tree)


def _exists(path: Path, root: Path) -> bool:
    """Whether ``path`` exists below ``root`` (a symlink counts; none is followed on the way)."""
    try:
        with folder(path.parent, root, create=False) as dir_fd:
            os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


class _Tree:
    mode: str
    shown: str  # what a person looks at, relative to the run directory

    def __init__(self, run_dir: Path, name: str) -> None:
        self.run_dir, self.name = Path(run_dir), name
        self.workspace = self.run_dir / "workspace"
        self.versions = self.workspace / VERSIONS / name  # content: versions and records

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The tree's lock, under workspace/ (never .writer/): calls of one tree, one at a time."""
        with exclusive_lock(self.workspace / VERSIONS / f"{self.name}.lock", root=self.run_dir):
            yield

    def refuse_other_layout(self) -> None:
        git = _exists(self.workspace / f"{self.name}.git", self.run_dir)
        content = _exists(self.workspace / self.name, self.run_dir) or _exists(self.versions, self.run_dir)
        if self.mode == "content" and git:
            raise Rejected(f"the tree {self.name} is kept in Git (workspace/{self.name}.git): call with mode git")
        if self.mode == "git" and content:
            raise Rejected(f"the tree {self.name} is kept as versions (workspace/{self.name}): call with mode content")

    def result(self, base: str | None, version: str) -> dict[str, Any]:
        manifest = self.manifest(version)
        return {
            "tree": self.name,
            "mode": self.mode,
            "path": self.shown,
            "version": version,
            "base": base,
            "files": len(manifest),
            "files_sha256": tree_digest(manifest),
        }

    # Each layout says these.
    def current(self) -> str | None:
        raise NotImplementedError

    def record(self, call_id: str) -> tuple[str | None, str] | None:
        raise NotImplementedError

    def left(self, version: str) -> bool:
        raise NotImplementedError

    def made_only_by(self, call_id: str, version: str) -> bool:
        """Whether no other call's record names ``version``: then, once current, it was this call's doing."""
        raise NotImplementedError

    def was_made_current(self, call_id: str, version: str) -> bool:
        """The version is not current, but was, by this call: a later call left it."""
        return self.left(version) and self.made_only_by(call_id, version)

    def manifest(self, version: str) -> dict[str, str]:
        raise NotImplementedError

    def build(self, base: str | None, changes: list[dict[str, Any]], manifest: dict[str, str], call_id: str) -> str:
        raise NotImplementedError

    def write_record(self, call_id: str, base: str | None, version: str) -> None:
        raise NotImplementedError

    def make_current(self, base: str | None, version: str) -> None:
        raise NotImplementedError


class ContentTree(_Tree):
    """Versions as folders named by their tree hash; ``workspace/<tree>`` a symlink to the current one."""

    mode = "content"

    def __init__(self, run_dir: Path, name: str) -> None:
        super().__init__(run_dir, name)
        self.shown = f"workspace/{name}"
        self.link_re = re.compile(rf"{re.escape(VERSIONS)}/{re.escape(name)}/trees/([0-9a-f]{{64}})")

    def current(self) -> str | None:
        try:
            with folder(self.workspace, self.run_dir, create=False) as dir_fd:
                target = os.readlink(self.name, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.EINVAL:
                raise UnsafePath(f"{self.shown} is not the symlink to a version: something else made it") from None
            raise
        found = self.link_re.fullmatch(target)
        if found is None:
            raise UnsafePath(f"{self.shown} points to {short_text(target, 80)!r}, not to one of its versions")
        return found.group(1)

    def _record_path(self, call_id: str) -> Path:
        return self.versions / "calls" / f"{call_id}.json"

    def record(self, call_id: str) -> tuple[str | None, str] | None:
        return _record_of(read_json_file(self._record_path(call_id), self.run_dir))

    def _records(self) -> Iterator[tuple[str, tuple[str | None, str]]]:
        try:
            with folder(self.versions / "calls", self.run_dir, create=False) as dir_fd:
                names = sorted(entry.name for entry in os.scandir(dir_fd))
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(".json") and not name.startswith("."):
                with contextlib.suppress(ValueError):
                    record = _record_of(read_json_file(self.versions / "calls" / name, self.run_dir))
                    if record is not None:
                        yield name.removesuffix(".json"), record

    def left(self, version: str) -> bool:
        """Whether a recorded call started from ``version``: the only way the tree leaves a version."""
        return any(base == version for _, (base, _) in self._records())

    def made_only_by(self, call_id: str, version: str) -> bool:
        # Two calls that make the same files make the same version (its name is their hash).
        return not any(other != call_id and made == version for other, (_, made) in self._records())

    def manifest(self, version: str) -> dict[str, str]:
        """The version folder's files and their digests, checked against its name (its tree hash)."""
        with folder(self.versions / "trees" / version, self.run_dir, create=False) as dir_fd:
            manifest = dict(sorted(_walk(dir_fd, "")))
        if tree_digest(manifest) != version:
            raise UnsafePath(f"the version folder {version[:12]}… no longer holds the files its name is the hash of")
        return manifest

    def build(self, base: str | None, changes: list[dict[str, Any]], manifest: dict[str, str], call_id: str) -> str:
        version = tree_digest(manifest)
        trees = self.versions / "trees"
        with folder(trees, self.run_dir) as trees_fd:
            # Under the tree's lock only: a temp folder here is one a killed build left.
            for entry in list(os.scandir(trees_fd)):
                if is_temp_name(entry.name):
                    import shutil  # here: see _git

                    shutil.rmtree(entry.name, dir_fd=trees_fd)
            with contextlib.suppress(FileNotFoundError):
                os.stat(version, dir_fd=trees_fd, follow_symlinks=False)
                self.manifest(version)  # the same files, built before (by this call killed, or another): kept
                return version
            temp = temp_name_for(version)
            os.mkdir(temp, 0o755, dir_fd=trees_fd)
            written = {change["path"]: change["content"].encode("utf-8") for change in changes if "content" in change}
            with folder(trees / temp, self.run_dir, create=False) as build_fd:
                for path in manifest:
                    data = written.get(path)
                    if data is None:
                        assert base is not None  # a file not written by this call is the base's
                        data = read_file(trees / base / path, self.run_dir)
                    _put(build_fd, path, data)
                # The check: each file holds what it should, and nothing else is there.
                if dict(sorted(_walk(build_fd, ""))) != manifest:
                    raise OutcomeUnknown("the version built aside does not hold the planned files")
            os.rename(temp, version, src_dir_fd=trees_fd, dst_dir_fd=trees_fd)
            os.fsync(trees_fd)
        return version

    def write_record(self, call_id: str, base: str | None, version: str) -> None:
        document = {"call_id": call_id, "tree": self.name, "base": base, "version": version}
        create_durable(self._record_path(call_id), json_file(document), root=self.run_dir)

    def make_current(self, base: str | None, version: str) -> None:
        """One rename(2): the symlink made under a temp name, the folder fsynced, renamed over."""
        remove_temp_files(self.workspace / self.name, self.run_dir)  # a killed swap's link (we hold the lock)
        with folder(self.workspace, self.run_dir) as dir_fd:
            temp = temp_name_for(self.name)
            os.symlink(f"{VERSIONS}/{self.name}/trees/{version}", temp, dir_fd=dir_fd)
            os.fsync(dir_fd)
            os.rename(temp, self.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)


def _record_of(document: Any) -> tuple[str | None, str] | None:
    """``(base, version)`` from a call's record, or ``None`` when there is none."""
    if document is None:
        return None
    if not isinstance(document, dict):
        raise UnsafePath("a call's record is not a JSON object")
    base, version = document.get("base"), document.get("version")
    if not isinstance(version, str) or not (base is None or isinstance(base, str)):
        raise UnsafePath("a call's record names no version")
    return base, version


def _walk(dir_fd: int, prefix: str) -> Iterator[tuple[str, str]]:
    """``(path, sha256)`` of every regular file below ``dir_fd``; a symlink or other kind is refused."""
    for entry in sorted(os.scandir(dir_fd), key=lambda entry: entry.name):
        path = f"{prefix}{entry.name}"
        info = os.stat(entry.name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                yield from _walk(child, f"{path}/")
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode):
            digest = hashlib.sha256()
            with os.fdopen(open_in(dir_fd, entry.name, os.O_RDONLY), "rb") as stream:
                while chunk := stream.read(1 << 20):
                    digest.update(chunk)
            yield path, digest.hexdigest()
        else:
            raise UnsafePath(f"{path} is a symlink or not a regular file: a version holds files and folders only")


def _put(build_fd: int, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` below the build folder, its folders made, everything fsynced."""
    *folders, name = path.split("/")
    fds = [os.dup(build_fd)]
    try:
        for part in folders:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fds[-1])
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fds[-1])
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        for dir_fd in fds:
            os.fsync(dir_fd)
    finally:
        for dir_fd in fds:
            os.close(dir_fd)


class GitTree(_Tree):
    """Versions as commits of ``workspace/<tree>.git``; ``refs/heads/main`` names the current one.

    Writes go through ``git`` (a temporary index, ``commit-tree``, ``update-ref`` with the old
    value); every read is this module's own, of the loose refs, reflog and objects: a reader
    of the evidence runs no program an agent's repository could configure."""

    mode = "git"

    def __init__(self, run_dir: Path, name: str) -> None:
        super().__init__(run_dir, name)
        self.repo = self.workspace / f"{name}.git"
        self.shown = f"workspace/{name}.git {GIT_REF}"

    # --- reading, without git ---

    def _ref(self, ref: str) -> str | None:
        value: str | None
        try:
            value = read_file(self.repo / ref, self.run_dir).decode("ascii", "replace").strip()
        except FileNotFoundError:
            value = self._packed_ref(ref)
        if value is None:
            return None
        if not OID_RE.fullmatch(value):
            raise UnsafePath(f"{ref} in workspace/{self.name}.git holds no commit id (a symbolic ref?)")
        return value

    def _packed_ref(self, ref: str) -> str | None:
        try:
            lines = read_file(self.repo / "packed-refs", self.run_dir).decode("ascii", "replace").splitlines()
        except FileNotFoundError:
            return None
        for line in lines:
            oid, _, name = line.partition(" ")
            if name == ref:
                return oid
        return None

    def current(self) -> str | None:
        return self._ref(GIT_REF)

    def record(self, call_id: str) -> tuple[str | None, str] | None:
        version = self._ref(f"{CALL_REFS}/{call_id}")
        if version is None:
            return None
        parents = self._commit(version)[1]
        return (parents[0] if parents else None), version

    def left(self, version: str) -> bool:
        """Whether the reflog of the ref records a move away from ``version``. git appends the line
        before it renames the ref into place, so a line *to* a version proves nothing; a line *from*
        it does (the ref was there)."""
        try:
            lines = read_file(self.repo / "logs" / GIT_REF, self.run_dir).splitlines()
        except FileNotFoundError:
            return False
        return any(line.split(b" ", 1)[0] == version.encode() for line in lines)

    def made_only_by(self, call_id: str, version: str) -> bool:
        return True  # each call's commit is its own: its message names the call_id

    def _object(self, oid: str) -> tuple[str, bytes]:
        if not OID_RE.fullmatch(oid):
            raise UnsafePath(f"{short_text(oid, 50)!r} is not an object id")
        try:
            data = zlib.decompress(read_file(self.repo / "objects" / oid[:2] / oid[2:], self.run_dir))
        except FileNotFoundError:
            raise UnsafePath(
                f"object {oid[:12]} is not a loose object of workspace/{self.name}.git (packed?)"
            ) from None
        except zlib.error as error:
            raise UnsafePath(f"object {oid[:12]} cannot be read: {error}") from None
        if hashlib.sha1(data, usedforsecurity=False).hexdigest() != oid:
            raise UnsafePath(f"object {oid[:12]} does not hold what its id is the hash of")
        header, _, body = data.partition(b"\x00")
        kind, _, _ = header.partition(b" ")
        return kind.decode("ascii", "replace"), body

    def _commit(self, oid: str) -> tuple[str, list[str]]:
        kind, body = self._object(oid)
        if kind != "commit":
            raise UnsafePath(f"{oid[:12]} is a {kind}, not a commit")
        tree, parents = "", []
        for line in body.split(b"\n\n", 1)[0].split(b"\n"):
            key, _, value = line.partition(b" ")
            if key == b"tree":
                tree = value.decode("ascii", "replace")
            elif key == b"parent":
                parents.append(value.decode("ascii", "replace"))
        return tree, parents

    def manifest(self, version: str) -> dict[str, str]:
        files: dict[str, str] = {}
        self._tree_files(self._commit(version)[0], "", files)
        return dict(sorted(files.items()))

    def _tree_files(self, oid: str, prefix: str, files: dict[str, str]) -> None:
        kind, body = self._object(oid)
        if kind != "tree":
            raise UnsafePath(f"{oid[:12]} is a {kind}, not a tree")
        position = 0
        while position < len(body):
            space = body.index(b" ", position)
            nul = body.index(b"\x00", space)
            mode, name = body[position:space], body[space + 1 : nul].decode("utf-8", "surrogateescape")
            child = body[nul + 1 : nul + 21].hex()
            position = nul + 21
            if mode == b"40000":
                self._tree_files(child, f"{prefix}{name}/", files)
            elif mode in (b"100644", b"100755"):
                blob_kind, data = self._object(child)
                if blob_kind != "blob":
                    raise UnsafePath(f"{prefix}{name} is a {blob_kind}, not a file")
                files[f"{prefix}{name}"] = sha256_hex(data)
            else:
                raise UnsafePath(f"{prefix}{name} is a symlink or a submodule: a version holds files and folders only")

    # --- writing, with git ---

    def _git(self, *arguments: str, stdin: bytes | None = None, index: str | None = None) -> str:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "HOME": os.devnull,
            "GIT_DIR": str(self.repo),
            # Fixed: the same call on the same version makes the same commit (the receipt has the time).
            "GIT_AUTHOR_NAME": "callproof",
            "GIT_AUTHOR_EMAIL": "callproof@localhost",
            "GIT_AUTHOR_DATE": "@0 +0000",
            "GIT_COMMITTER_NAME": "callproof",
            "GIT_COMMITTER_EMAIL": "callproof@localhost",
            "GIT_COMMITTER_DATE": "@0 +0000",
        }
        if index is not None:
            env["GIT_INDEX_FILE"] = index
        # No hook runs, every write is fsynced before git goes on.
        settings = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsync=all", "-c", "core.fsyncMethod=fsync"]
        # subprocess and shutil are imported where used: every call of every tool imports this
        # module (the writer knows apply_changes by name), and they were a tenth of its start.
        import subprocess

        done = subprocess.run(
            ["git", *settings, *arguments], input=stdin, capture_output=True, env=env, check=False, timeout=120
        )
        if done.returncode != 0:
            raise OSError(f"git {arguments[0]} failed: {done.stderr.decode(errors='replace').strip()[:300]}")
        return done.stdout.decode().strip()

    def _prepare_repo(self) -> None:
        """The bare repository, made when missing; refused when it is not one this tool would make."""
        import shutil  # here: see _git

        if shutil.which("git") is None:
            raise Rejected("mode git: git is not on PATH")
        if not _exists(self.repo, self.run_dir):
            with folder(self.workspace, self.run_dir):
                pass
            temp = self.workspace / temp_name_for(f"{self.name}.git")
            self._git("init", "--bare", "--quiet", "--initial-branch=main", str(temp))
            with folder(self.workspace, self.run_dir) as dir_fd:
                os.rename(temp.name, self.repo.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                os.fsync(dir_fd)
        config = read_file(self.repo / "config", self.run_dir).decode("utf-8", "replace")
        keys = {line.split("=")[0].strip().lower() for line in config.splitlines() if "=" in line}
        if not keys <= GIT_CONFIG_KEYS or "[" in config.replace("[core]", ""):
            raise Rejected(f"workspace/{self.name}.git has settings this tool does not make: git is not run on it")
        for forbidden in ("objects/info/alternates", "commondir"):
            if _exists(self.repo / forbidden, self.run_dir):
                raise Rejected(f"workspace/{self.name}.git has {forbidden}: git is not run on it")
        # Under the tree's lock no git of ours runs: a lock file in the repository is a killed one's.
        with contextlib.suppress(FileNotFoundError), folder(self.repo, self.run_dir, create=False) as repo_fd:
            for _directory, _, names, dir_fd in os.fwalk("refs", dir_fd=repo_fd):
                for name in names:
                    if name.endswith(".lock"):
                        os.unlink(name, dir_fd=dir_fd)
            for name in ("packed-refs.lock", f"logs/{GIT_REF}.lock"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=repo_fd)
            for entry in list(os.scandir(repo_fd)):
                if is_temp_name(entry.name):
                    os.unlink(entry.name, dir_fd=repo_fd)

    def build(self, base: str | None, changes: list[dict[str, Any]], manifest: dict[str, str], call_id: str) -> str:
        self._prepare_repo()
        index = self.repo / temp_name_for("index")  # a temporary index, never the repository's own
        try:
            self._git("read-tree", *([base] if base else ["--empty"]), index=str(index))
            lines = []
            for change in changes:
                if change.get("remove"):
                    lines.append(f"0 {'0' * 40}\t{change['path']}")
                else:
                    blob = self._git("hash-object", "-w", "--stdin", stdin=change["content"].encode("utf-8"))
                    lines.append(f"100644 {blob}\t{change['path']}")
            listing = "".join(f"{line}\n" for line in lines).encode("utf-8")
            self._git("update-index", "--index-info", stdin=listing, index=str(index))
            tree = self._git("write-tree", index=str(index))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(index)
        parent = ["-p", base] if base else []
        version = self._git("commit-tree", tree, *parent, "-m", f"apply_changes {call_id}")
        # The check, read back by this module: each file holds what it should, and nothing else is there.
        if self.manifest(version) != manifest:
            raise OutcomeUnknown("the commit built does not hold the planned files")
        return version

    def write_record(self, call_id: str, base: str | None, version: str) -> None:
        self._git("update-ref", f"{CALL_REFS}/{call_id}", version, "")

    def make_current(self, base: str | None, version: str) -> None:
        """``git update-ref`` with the old value: it moves the ref only if it still names ``base``."""
        self._git(
            "update-ref", "--create-reflog", "-m", "apply_changes", GIT_REF, version, base or "",
        )  # fmt: skip


# --- what the tree shows ----------------------------------------------------------------------


def _short(version: str | None) -> str:
    return "none" if version is None else f"{version[:12]}…"


def apply_changes_evidence(
    run_dir: Path, args: Mapping[str, Any], call_id: str, result: Mapping[str, Any] | None = None
) -> Evidence:
    """Whether the call's version is current (``present``), positively never made current
    (``absent``), or neither (``unclear``); with ``result``, ``present`` only when the receipt's
    result names that version and its files' digest."""
    if result is not None and not isinstance(result, Mapping):
        return Evidence(UNCLEAR, (Fact("result_not_object"),))
    try:
        tree = open_tree(Path(run_dir), args)
    except (UnsafePath, Rejected):
        return Evidence(UNCLEAR, (Fact("changes_no_tree"),))
    try:
        record = tree.record(call_id)
        if record is None:
            return Evidence(ABSENT, (Fact("changes_no_record", tree=tree.shown),))
        base, version = record
        current = tree.current()
        if current == version:
            files = tree.result(base, version)
            if result is not None and (
                result.get("version") != version or result.get("files_sha256") != files["files_sha256"]
            ):
                recorded = short_text(result.get("version"), 12)
                return Evidence(UNCLEAR, (Fact("changes_other_recorded", recorded=recorded, version=version[:12]),))
            return Evidence(
                PRESENT, (Fact("changes_current", tree=tree.shown, version=version[:12], files=files["files"]),)
            )
        shown = {"tree": tree.shown, "version": version[:12], "base": _short(base)}
        if tree.was_made_current(call_id, version):
            files = tree.result(base, version)
            if result is not None and (
                result.get("version") != version or result.get("files_sha256") != files["files_sha256"]
            ):
                recorded = short_text(result.get("version"), 12)
                return Evidence(UNCLEAR, (Fact("changes_other_recorded", recorded=recorded, version=version[:12]),))
            return Evidence(PRESENT, (Fact("changes_left", current=_short(current), **shown),))
        if current == base and not tree.left(version):
            return Evidence(ABSENT, (Fact("changes_at_base", **shown),))
        return Evidence(UNCLEAR, (Fact("changes_moved", current=_short(current), **shown),))
    except (OSError, ValueError) as problem:  # UnsafePath is a ValueError
        return Evidence(UNCLEAR, (Fact("changes_unreadable", tree=tree.shown, problem=problem),))
