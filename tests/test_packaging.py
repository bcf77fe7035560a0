"""The writer as an agent runtime installs it: the project's wheel, built here, installed with no
dependency into a fresh virtual environment outside the checkout, where Django cannot be
imported. Its console script makes a run, a call, a task, a replay, and verifies an evidence
export that the dashboard (in this process) made of that run.

The boundary is the installation itself: whatever the writer side imported from a third
party would fail here, not in a check of ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from django.core.management import call_command

from evidence.ingest import importer
from receipts import __version__
from receipts.demo import login_request
from tests.helpers import CONTRACT, PROJECT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory) -> tuple[Path, str]:
    """The wheel, and what building it printed."""
    out = tmp_path_factory.mktemp("dist")
    # Built from a copy: setuptools writes build/ and callproof.egg-info into the tree it builds,
    # and two builds of one tree at once (two xdist workers) broke each other.
    source = Path(shutil.copytree(
        PROJECT, tmp_path_factory.mktemp("source") / "callproof",
        ignore=shutil.ignore_patterns(".venv", "var", "build", "*.egg-info", "__pycache__", ".git", "tests"),
    ))  # fmt: skip
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-w", str(out)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    [path] = out.glob("callproof-*.whl")
    return path, built.stdout + built.stderr


@pytest.fixture(scope="module")
def wheel(wheel_build) -> Path:
    return wheel_build[0]


def test_the_wheel_builds_without_a_setuptools_warning(wheel_build):
    """A build that warns teaches people to skip its output. Issue 37: setuptools warned about each
    folder of templates/, static/ and the catalogue (BuildBackendWarning: "Package
    'evidence.static.css' is absent from the packages configuration"), at every build."""
    _, printed = wheel_build
    assert "Successfully built callproof" in printed
    assert re.findall(r"\w+Warning\b.*", printed) == [], printed[-3000:]


def empty_venv(home: Path) -> Path:
    """A new virtual environment with nothing installed, not even pip; its bin folder."""
    venv.EnvBuilder(clear=True).create(home / "venv")
    return home / "venv" / "bin"


def pip_install(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``pip install ARGS`` into the environment of ``bin_dir``, by this environment's pip
    (``--python``): the same install as the environment's own pip would make, without the seconds
    ensurepip takes to put a pip there first. No bytecode is compiled ahead: a module's first import
    does it, for the modules the test imports rather than all of Django."""
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "-q",
                           "--no-compile", *args], capture_output=True, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def writer_only(wheel, tmp_path_factory) -> Path:
    """A virtual environment holding the wheel and nothing else; its bin folder."""
    bin_dir = empty_venv(tmp_path_factory.mktemp("writer-env"))
    installed = pip_install(bin_dir, "--no-index", "--no-deps", str(wheel))
    assert installed.returncode == 0, installed.stderr.decode()[-2000:]
    return bin_dir


def run(bin_dir: Path, *args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    # Nothing of the checkout on the path: only what the wheel installed.
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(list(args), cwd=cwd, env=env, input=stdin, capture_output=True, check=False)


def test_the_wheel_carries_a_licence_a_version_and_a_console_script(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(name for name in names if name.endswith(".dist-info/METADATA"))).decode()
        entry_points = archive.read(next(name for name in names if name.endswith("entry_points.txt"))).decode()
    assert f"Version: {__version__}" in metadata and "License-Expression: Apache-2.0" in metadata
    assert not [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert any(name.endswith("licenses/LICENSE") for name in names)
    assert "callproof = receipts.cli:main" in entry_points


@pytest.mark.django_db
def test_the_writer_runs_from_its_wheel_with_no_third_party_package(writer_only, tmp_path):
    python = str(writer_only / "python")
    assert run(writer_only, python, "-c", "import django", cwd=tmp_path).returncode != 0, "Django is not there"
    callproof = str(writer_only / "callproof")
    version = run(writer_only, callproof, "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.decode().strip() == f"callproof {__version__}"
    run_dir = tmp_path / "run-from-wheel"
    steps = [
        ("init", str(run_dir), "--contract-sha256", CONTRACT),
        ("call", str(run_dir), "--tool", "write_file", "--args", json.dumps({"path": "a.txt", "content": "x"})),
        ("call", str(run_dir), "--tool", "send_message", "--args", json.dumps({"to": "ops", "body": "done"})),
        ("write-task", str(run_dir), "--request", "-", "--submission-id", "wheel-1"),
        ("replay", str(run_dir), "--json"),
    ]
    for step in steps:
        stdin = json.dumps(login_request()).encode() if step[0] == "write-task" else None
        completed = run(writer_only, callproof, *step, cwd=tmp_path, stdin=stdin)
        assert completed.returncode == 0, (step, completed.stderr.decode())
    decisions = json.loads(completed.stdout)["decisions"]
    assert len(decisions) == 2 and {row["decision"] for row in decisions} == {"reuse"}
    # The dashboard (this process) imports and exports the run; the wheel's verifier checks it.
    importer.run_import(path=run_dir)
    out = tmp_path / "export"
    call_command("export_evidence", run_dir.name, "--out", str(out))
    verified = run(writer_only, callproof, "verify-evidence", str(out), "--against", str(run_dir), cwd=tmp_path)
    assert verified.returncode == 0 and b"intact" in verified.stdout, verified.stderr.decode()
    (out / "index.html").write_bytes((out / "index.html").read_bytes() + b" ")
    assert run(writer_only, callproof, "verify-evidence", str(out), cwd=tmp_path).returncode == 1
    assert os.path.isdir(run_dir / "receipts") and not (tmp_path / "db.sqlite3").exists()


def test_the_guides_the_help_cites_are_installed_with_the_command(writer_only, tmp_path):
    """`callproof --help` sends people to guides; an installed wheel has no checkout, so it names
    them as `callproof docs NAME`, which prints the guide shipped in the wheel (issue 37: it cited
    docs/runtime-authors.md, a file no install has)."""
    callproof = str(writer_only / "callproof")
    helped = run(writer_only, callproof, "--help", cwd=tmp_path)
    assert helped.returncode == 0
    text = " ".join(helped.stdout.decode().split())  # argparse wraps lines where it likes
    assert "docs/" not in text and ".md" not in text, "no path of a checkout"
    cited = set(re.findall(r"callproof docs ([\w-]+)", text))
    assert cited >= {"runtime-authors", "operations"}, text
    for name in cited:
        guide = run(writer_only, callproof, "docs", name, cwd=tmp_path)
        assert guide.returncode == 0, guide.stderr.decode()
        assert guide.stdout.decode() == (PROJECT / "docs" / f"{name}.md").read_text(encoding="utf-8")
    listed = run(writer_only, callproof, "docs", cwd=tmp_path).stdout.decode()
    assert {line.split()[0] for line in listed.splitlines()} == {path.stem for path in (PROJECT / "docs").glob("*.md")}
    assert "runtime-authors      A guide for runtime authors" in listed
    unknown = run(writer_only, callproof, "docs", "nonesuch", cwd=tmp_path)
    assert unknown.returncode == 2 and b"the guides: INTERFACES" in unknown.stderr and unknown.stdout == b""


def test_the_mcp_proxy_from_the_wheel_alone_says_which_extra_to_install(writer_only, tmp_path):
    callproof = str(writer_only / "callproof")
    run_dir = tmp_path / "run-for-proxy"
    assert (
        run(writer_only, callproof, "init", str(run_dir), "--contract-sha256", CONTRACT, cwd=tmp_path).returncode == 0
    )
    proxy = run(writer_only, callproof, "mcp-proxy", "--run", str(run_dir), "--", "true", cwd=tmp_path)
    assert proxy.returncode == 7, proxy.stderr.decode()
    assert b"pip install 'callproof[mcp]'" in proxy.stderr and b"Traceback" not in proxy.stderr
    assert proxy.stdout == b"", "nothing on the MCP channel"


IMPORT_EVERY_MODULE = """
import importlib, pkgutil, receipts
# __main__ is the command itself: running it is what the other test does.
names = [info.name for info in pkgutil.walk_packages(receipts.__path__, "receipts.")]
names = [name for name in names if name != "receipts.__main__"]
for name in names:
    importlib.import_module(name)
print(len(names), " ".join(names))
"""


def test_every_module_of_the_writer_and_the_reader_imports_with_no_third_party_package(writer_only, tmp_path):
    """The folders are the boundary: everything under receipts/ is what a runtime embeds, and
    loads where nothing but the standard library is installed."""
    completed = run(writer_only, str(writer_only / "python"), "-c", IMPORT_EVERY_MODULE, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr.decode()[-2000:]
    count, *names = completed.stdout.decode().split()
    in_checkout = {
        ".".join(path.relative_to(PROJECT).with_suffix("").parts).removesuffix(".__init__")
        for path in (PROJECT / "receipts").rglob("*.py")
    } - {"receipts", "receipts.__main__"}
    assert set(names) == in_checkout and int(count) == len(in_checkout)


def test_the_wheel_carries_every_package_of_the_checkout_and_the_sites_files(wheel):
    """pyproject.toml lists the packages (templates/ and static/ are mapped into evidence/):
    a new package of the checkout that the list forgot would be missing from every install."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    packages = {str(init.parent.relative_to(PROJECT)) for top in ("receipts", "evidence")
                for init in (PROJECT / top).rglob("__init__.py")}  # fmt: skip
    assert {f"{package}/__init__.py" for package in packages} <= names
    site_files = {str(path.relative_to(PROJECT)) for top in ("templates", "static")
                  for path in (PROJECT / top).rglob("*") if path.is_file()}  # fmt: skip
    assert {f"evidence/{path}" for path in site_files} <= names
    catalogues = {str(path.relative_to(PROJECT)) for path in (PROJECT / "evidence" / "locale").rglob("*.[mp]o")}
    assert catalogues and catalogues <= names, "the Chinese catalogue, compiled, travels in the wheel"


DASHBOARD_PROBE = """
import re
import django
django.setup()
from django.contrib.auth import get_user_model
from django.test import Client
from evidence.lib.roles import ensure_roles
user = get_user_model().objects.create_user("operator")
user.groups.add(ensure_roles()["viewer"])
client = Client()
client.force_login(user)
page = client.get("/")
stylesheet = re.search(r'<link rel="stylesheet" href="([^"]+)"', page.content.decode()).group(1)
css = client.get(stylesheet)
chinese = client.get("/", HTTP_ACCEPT_LANGUAGE="zh-CN").content.decode()
print(page.status_code, "clean-run" in page.content.decode(), stylesheet, css.status_code,
      b"".join(css.streaming_content if css.streaming else [css.content])[:200].decode(errors="replace").count("{") > 0,
      '<html lang="zh-Hans">' in chinese and "待处理" in chinese)
"""


def test_the_dashboard_runs_from_its_wheel_with_its_templates_and_stylesheet(wheel, tmp_path):
    home = tmp_path / "site"
    home.mkdir()
    bin_dir = empty_venv(home)
    installed = pip_install(bin_dir, f"{wheel}[dashboard]")
    assert installed.returncode == 0, installed.stderr.decode()[-2000:]
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "DJANGO_SETTINGS_MODULE": "evidence.settings",
        "DATABASE_URL": f"sqlite:///{home / 'db.sqlite3'}", "DJANGO_SECRET_KEY": "wheel-test-" + "k" * 50,
        "DJANGO_DEBUG": "0", "DJANGO_HTTPS": "0", "DJANGO_ALLOWED_HOSTS": "testserver",
        "DJANGO_STATIC_ROOT": str(home / "static"), "EVIDENCE_RUNS_ROOT": str(home / "runs"),
    }  # fmt: skip

    def step(*args: str) -> str:
        completed = subprocess.run(list(args), cwd=home, env=env, capture_output=True, check=False)
        assert completed.returncode == 0, (args, completed.stderr.decode()[-2000:])
        return completed.stdout.decode()

    # A first start as the README's install section has it, before a secret key is made: one line
    # that names the variable and how to make one (issue 37: Django's 20-line traceback).
    unkeyed = {
        name: value for name, value in env.items() if name not in {"DJANGO_SECRET_KEY", "DJANGO_SETTINGS_MODULE"}
    }
    first = subprocess.run(["python", "-m", "evidence", "migrate"], cwd=home, env=unkeyed, capture_output=True,
                           text=True, check=False)  # fmt: skip
    assert first.returncode == 1 and first.stdout == "", first.stderr
    [said] = first.stderr.splitlines()
    assert said.startswith("error: DJANGO_SECRET_KEY is not set") and "secrets.token_urlsafe(50)" in said
    made = step("python", *shlex.split(said.split("with: ", 1)[1])[1:])
    assert len(made.strip()) >= 50, "the command it gives makes a key"
    assert not (home / "db.sqlite3").exists(), "nothing was done"

    step("python", "-m", "evidence", "migrate", "--noinput", "-v", "0")
    step("callproof", "demo", str(home / "runs"))
    step("python", "-m", "evidence", "import_runs", str(home / "runs"))
    step("python", "-m", "evidence", "collectstatic", "--noinput", "-v", "0")
    status, listed, stylesheet, css_status, is_css, in_chinese = step("python", "-c", DASHBOARD_PROBE).split()
    assert (status, listed, css_status, is_css, in_chinese) == ("200", "True", "200", "True", "True"), stylesheet
    assert stylesheet.startswith("/static/css/site.") and stylesheet != "/static/css/site.css", "hashed by the manifest"


def test_the_lock_file_pins_every_dependency_the_project_names():
    """`make install` installs requirements.lock by hash: a dependency added to pyproject.toml
    and not locked (`make lock`) would be missing from every install, or drift."""
    import re
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    lock = (PROJECT / "requirements.lock").read_text()
    pinned = {
        name.lower().replace("_", "-"): version
        for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", lock, flags=re.MULTILINE)
    }
    assert re.findall(r"--hash=sha256:[0-9a-f]{64}", lock), "pinned by hash"
    named = [
        Requirement(text)
        for extra in ("dashboard", "test", "deploy")
        for text in project["optional-dependencies"][extra]
    ]
    for requirement in named:
        if requirement.name == "callproof":
            continue
        name = requirement.name.lower().replace("_", "-")
        assert name in pinned, f"{name} is not in requirements.lock: run make lock"
        assert requirement.specifier.contains(pinned[name]), f"{name}=={pinned[name]} is not {requirement.specifier}"
