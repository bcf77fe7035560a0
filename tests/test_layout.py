"""The house's rooms and which way their imports point (docs/architecture.md, "The code, room by room").

Read from the source (every import, those inside functions too), not by importing it: an arrow
that only a rarely taken path follows is still an arrow. An import under ``if TYPE_CHECKING:``
names a type for the checker and loads nothing: it is not one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent

# Each room of the dashboard, and the rooms it may import. The web layer, the commands, the
# templatetags, the worker's schedule and Django's own modules (settings, apps, admin) are the
# doors: they may use every room, and no room may use them.
MAY_USE: dict[str, set[str]] = {
    "models": set(),
    "lib": {"models", "words"},
    "words": {"models", "lib"},
    "retention": {"models", "lib", "words"},
    "review": {"models", "lib", "words", "retention"},
    "ingest": {"models", "lib", "words", "retention", "review"},
    "export": {"models", "lib", "words", "review"},
}
ROOMS = set(MAY_USE) - {"models"}


def modules_under(package: str) -> dict[str, Path]:
    """Every module of ``package`` (a folder of PROJECT) by its dotted name; migrations aside."""
    found = {}
    for path in sorted((PROJECT / package).rglob("*.py")):
        parts = path.relative_to(PROJECT).with_suffix("").parts
        if "migrations" in parts:
            continue
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _for_types_only(tree: ast.Module) -> set[ast.AST]:
    """The statements under ``if TYPE_CHECKING:``: they name a type for the checker and load nothing."""
    hidden: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                hidden.update(ast.walk(statement))
    return hidden


def imports_of(path: Path, known: Iterable[str]) -> set[str]:
    """The project's modules ``path`` imports (inside functions too, not those only for types):
    ``from a.b import c`` is ``a.b.c`` when that is a module."""
    known = set(known)
    names = set()
    tree = ast.parse(path.read_text())
    types_only = _for_types_only(tree)
    for node in ast.walk(tree):
        if node in types_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                names.add(submodule if submodule in known else node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.split(".")[0] in ("evidence", "receipts")}


def room_of(module: str) -> str:
    """The dashboard room a module is in; "door" for the web layer, the commands and Django's own."""
    parts = module.split(".")
    if parts[0] == "receipts":
        return "receipts"
    if module == "evidence.models":
        return "models"
    if len(parts) >= 2 and parts[1] in ROOMS:  # a room's own __init__ is in the room
        return parts[1]
    return "door"


def arrows_against_the_rooms(graph: Mapping[str, set[str]]) -> list[str]:
    """Each import from one room into another that the room may not use."""
    wrong = []
    for module, imported in sorted(graph.items()):
        room = room_of(module)
        if room in ("door", "receipts"):
            continue
        for target in sorted(imported):
            other = room_of(target)
            if other in (room, "receipts") or other in MAY_USE[room]:
                continue
            wrong.append(f"{module} ({room}) imports {target} ({other})")
    return wrong


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles among the project's modules (each strongly connected set of two or
    more, or a module that imports itself), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def project_graph() -> dict[str, set[str]]:
    modules = modules_under("evidence") | modules_under("receipts")
    graph = {name: imports_of(path, modules) & set(modules) for name, path in modules.items()}
    # A package's __init__ is loaded by whoever imports one of its modules; that is not an arrow.
    return {
        name: {target for target in targets if not name.startswith(target + ".")} for name, targets in graph.items()
    }


def test_every_room_imports_only_the_rooms_below_it():
    assert arrows_against_the_rooms(project_graph()) == []


def test_no_module_of_the_project_is_part_of_an_import_circle():
    assert circles(project_graph()) == []


def test_the_writer_and_the_reader_never_import_the_dashboard_or_django():
    for name, path in modules_under("receipts").items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("evidence", "django")), f"{name} imports {node.module}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith(("evidence", "django")), f"{name} imports {alias.name}"


def test_the_rules_find_a_planted_back_arrow_and_a_planted_circle():
    """The checks above can fail: a room that uses a door, a lower room that uses a higher one,
    and two modules that import each other are each found."""
    graph = {
        "evidence.lib.stats": {"evidence.retention.plans"},  # lib may not use retention
        "evidence.retention.plans": {"evidence.lib.stats"},  # ... and so the two make a circle
        "evidence.review.inbox": {"evidence.web.forms"},  # no room uses the web layer
        "evidence.export.bundle": {"evidence.review.selectors", "evidence.models", "receipts.protocol"},
        "evidence.web.forms": {"evidence.review.inbox"},
    }
    assert arrows_against_the_rooms(graph) == [
        "evidence.lib.stats (lib) imports evidence.retention.plans (retention)",
        "evidence.review.inbox (review) imports evidence.web.forms (door)",
    ]
    assert circles(graph) == [
        ["evidence.lib.stats", "evidence.retention.plans"],
        ["evidence.review.inbox", "evidence.web.forms"],
    ]


def test_the_graph_sees_imports_inside_functions_and_the_folders_have_their_rooms(tmp_path):
    source = tmp_path / "lazy.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from evidence.web import forms\n"
        "def later():\n    from evidence.review import settle\n    import receipts.durable\n"
    )
    known = {"evidence.review.settle", "receipts.durable", "evidence.web.forms"}
    assert imports_of(source, known) == {"evidence.review.settle", "receipts.durable"}
    # Every folder under evidence/ is a room of the table or a door Django or the layout names.
    folders = {path.name for path in (PROJECT / "evidence").iterdir() if (path / "__init__.py").exists()}
    assert folders - ROOMS == {"web", "templatetags", "management", "migrations", "formats"}


# --- docs/architecture.md's tables say what each module imports -------------------------------

ARCHITECTURE = PROJECT / "docs" / "architecture.md"
# What a table's "imports" cell may say besides the project's modules.
OUTSIDE_WORDS = {
    "django",
    "the standard library",
    "nothing",
    "detect-secrets",
    "ninja",
    "prometheus_client",
    "django-tasks",
    "django-axes",
    "the `mcp` sdk",
    "each framework",
    "an extra",
    "imported only where the proxy runs",
    "imported only when a tool is made",
    "when used",
    "ending a triage when its finding changes",
    "stripping what was stripped before",
    "the sentences its problems are said in",
    "each other",
}
# Words that stand for a part of the project the row does not list module by module.
WILDCARDS = {"its modules", "the modules above", "the checks", "the rooms", "everything", "the rooms' tasks"}
SYNONYMS = {"the reader": "reader", "the verifier": "reader", "the verifier's format": "reader",
            "retention's plans": "plans", "retention's actions": "actions", "the demo": "demo"}  # fmt: skip


def seen_as(imported: str, importer: str) -> str:
    """What the tables call ``imported`` in ``importer``'s row: a package's own modules by their
    names, another package (the reader, the runtime, the conformance kit) by its name."""
    for package in ("receipts.reader", "receipts.runtime", "receipts.conformance", "receipts.integrations"):
        if (imported == package or imported.startswith(package + ".")) and not importer.startswith(package + "."):
            return package.rsplit(".", 1)[1]
    if imported == "receipts":
        return "receipts"
    if imported.startswith("receipts.adapters."):
        return imported.removeprefix("receipts.")
    if imported.startswith("evidence.web.views."):
        return imported.removeprefix("evidence.web.")
    return imported.rsplit(".", 1)[1]


def table_rows() -> list[tuple[list[str], str]]:
    """(the modules a row of "The code, room by room" is about, its imports cell)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text[text.index("## The code, room by room") :]
    base, rows, modules_table = "", [], False
    for line in section.splitlines():
        if line.startswith("| module |"):
            modules_table = True
        elif not line.startswith("|"):
            modules_table = False
        if line.startswith(("#### The doors", "#### `lib/`")):  # rows named from evidence/ itself
            base = "evidence/"
        elif heading := re.match(r"#{3,4} `([\w/]+)`", line):
            folder = heading.group(1)
            base = folder if folder.startswith(("receipts", "evidence")) else f"evidence/{folder}"
        elif line.startswith("| `") and base and modules_table:
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            names, folder, modules = re.findall(r"`([\w./]+)`", cells[0]), "", []
            for name in names:
                folder = name.rsplit("/", 1)[0] + "/" if "/" in name.rstrip("/") else folder
                path = PROJECT / base / (name if "/" in name.rstrip("/") else folder + name)
                found = sorted(path.rglob("*.py")) if name.endswith("/") else [path]
                modules += [".".join(p.relative_to(PROJECT).with_suffix("").parts).removesuffix(".__init__")
                            for p in found if "migrations" not in p.parts]  # fmt: skip
            rows.append((modules, cells[-1]))
    return rows


def said_imports(cell: str) -> tuple[set[str], bool]:
    """The modules an imports cell names, and whether it also stands for more (a wildcard)."""
    named, wild = set(), False
    for item in re.split(r"[,;()]|\band\b|: ", cell):
        item = item.strip().lower()
        if not item or item in OUTSIDE_WORDS or item in ("http", "sql"):
            continue
        if item in WILDCARDS:
            wild = True
            continue
        named.add(SYNONYMS.get(item, item.removesuffix(" when used")))
    return named, wild


def test_the_architecture_tables_say_what_each_module_imports():
    graph = project_graph()
    rows = table_rows()
    covered = {module for modules, _ in rows for module in modules}
    wrong = []
    for modules, cell in rows:
        missing_files = [module for module in modules if module not in graph]
        assert not missing_files, f"the tables name modules that are not there: {missing_files}"
        actual = {seen_as(target, module) for module in modules for target in graph[module] if target not in modules}
        named, wild = said_imports(cell)
        if named - actual or (actual - named and not wild):
            wrong.append(f"{', '.join(modules)}: says {sorted(named - actual)} it does not import, "
                         f"leaves out {sorted(actual - named) if not wild else []}")  # fmt: skip
    assert wrong == []
    # Every module with code has its row (a package's __init__ that is only a docstring needs none).
    unlisted = [name for name in graph if name not in covered and ast.parse(
        (PROJECT / Path(*name.split("."))).with_suffix(".py").read_text()
        if (PROJECT / Path(*name.split("."))).with_suffix(".py").exists()
        else (PROJECT / Path(*name.split(".")) / "__init__.py").read_text()).body[1:]]  # fmt: skip
    assert unlisted == []
