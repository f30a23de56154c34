"""`pip install forgerl` works outside the checkout: the sdist and wheel carry everything, and declare what they import.

`pip install -e .` hides a missing module or data file (the checkout is on the path), so the slow tests build
the sdist and, from it, the wheel (`python -m build`, as a release would), install the wheel without `-e`
into a fresh venv at the versions of the lock, and run each verb's `--help` and the demo from a folder
outside the checkout, with nothing of the checkout on the path but examples/demo.py itself.

The fast test reads every import of the product folders (function-level ones too) and checks that each
third-party one is a distribution pyproject.toml declares: a package that only arrives as another's
dependency can vanish with that package's next release.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]  # forgerl.<x> -> its folder
LOCK = REPO / "requirements-train.lock"  # the full set: forge-train --help needs the train extra
VERBS = ("record", "convert", "analyze", "run", "train")
# Imported by product files but not a dependency to declare, and why.
NOT_OURS = {
    "claw_eval": "ClawEval's own package: installed from the benchmark's folder (make claweval), "
                 "imported only when ClawEval tasks are loaded",
    "browser_use": "harnesses/browser_use_cli.py runs in browser-use's own venv (requirements-browser.lock)",
}


def run(*args: object, **kwargs) -> str:
    """Run a command to success and return its stdout; a failure shows what it printed."""
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, args))}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def folders() -> dict[str, Path]:
    return {package: REPO / folder for package, folder in PACKAGE_DIR.items()}


def source_files(folder: Path) -> list[Path]:
    """The folder's files as a fresh clone has them (tracked, or new and not ignored), that exist now."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "."],
                            cwd=folder, check=True, capture_output=True, text=True).stdout.split("\0")
    return [(folder / name).resolve() for name in listed if name and (folder / name).is_file()]


def docs(files: list[Path]) -> set[Path]:
    """READMEs and the images they show: the only files of a product folder that the wheel leaves out."""
    readmes = {f for f in files if f.name == "README.md"}
    shown = {(r.parent / m).resolve() for r in readmes
             for m in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", r.read_text())}
    return readmes | shown


def expected_in_wheel() -> set[str]:
    """Every file of every product folder, but docs, at its path in the wheel (forgerl/<package path>/...)."""
    names = set()
    for package, folder in folders().items():
        files = source_files(folder)
        for path in set(files) - docs(files):
            names.add("/".join([*package.split("."), *path.relative_to(folder).parts]))
    return names


def normalise(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def declared(extras: tuple[str, ...] = ()) -> set[str]:
    project = PYPROJECT["project"]
    return {normalise(r) for r in project["dependencies"]} | {
        normalise(r) for extra in extras for r in project["optional-dependencies"][extra]}


def third_party_imports(path: Path) -> set[str]:
    """Top-level names `path` imports that are neither the standard library, forgerl, nor a file beside it
    (trainer/rl_loop.py also runs as a script, importing its neighbours by name)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    beside = {p.stem for p in path.parent.iterdir()}
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("forgerl", "__future__")
            and n not in beside}


def test_every_third_party_import_is_a_declared_dependency():
    distributions = importlib.metadata.packages_distributions()
    undeclared = set()
    for package, folder in folders().items():
        allowed = declared(("train",) if package == "forgerl.trainer" else ())
        for path in (p for p in source_files(folder) if p.suffix == ".py"):
            for name in third_party_imports(path) - set(NOT_OURS):
                dists = {normalise(d) for d in distributions.get(name, [name])}
                if not dists & allowed:
                    undeclared.add(f"{path.relative_to(REPO)}: {name} ({', '.join(sorted(dists))})")
    assert not undeclared, "imported but not declared in pyproject.toml:\n" + "\n".join(sorted(undeclared))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `python -m build` makes from the sdist it makes first: what the sdist lacks, the wheel lacks."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, REPO)
    (_sdist,), (built,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """(venv, environment, working folder): the wheel with its demo and train extras, at the lock's versions,
    in a venv of its own; run from a folder outside the checkout, with no PYTHONPATH."""
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    # This venv's pip installs into the new one: nothing to bootstrap there, and nothing compiled ahead of use.
    pip = (sys.executable, "-m", "pip", "--python", venv / "bin" / "python")
    run(*pip, "install", "-q", "--no-compile", "-c", LOCK, f"forgerl[demo,train] @ {wheel.as_uri()}")
    run(*pip, "check")  # every installed distribution's own requirements are met
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path_factory.mktemp("home")),
           "LANG": os.environ.get("LANG", "C.UTF-8"), "HF_HUB_OFFLINE": "1"}
    return venv, env, tmp_path_factory.mktemp("elsewhere")


@pytest.mark.slow
def test_wheel_holds_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = expected_in_wheel() - names
    assert not missing, ("missing from the wheel (a module: its folder in [tool.setuptools.package-dir]; "
                         "data: its pattern in [tool.setuptools.package-data]):\n" + "\n".join(sorted(missing)))
    assert "forgerl/schema/toolcalls/__init__.py" in names and "forgerl/runners/pod-template.yaml" in names
    (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
    assert b"License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata)


@pytest.mark.slow
def test_every_verb_answers_help_outside_the_checkout(installed):
    venv, env, elsewhere = installed
    where = run(venv / "bin" / "python", "-c", "import forgerl; print(forgerl.__file__)", cwd=elsewhere, env=env).strip()
    assert Path(where).is_relative_to(venv), where  # the wheel's forgerl, not the checkout's
    helps = {verb: subprocess.Popen([venv / "bin" / f"forge-{verb}", "--help"], cwd=elsewhere, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE) for verb in VERBS}  # at once
    for verb, proc in helps.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.startswith(f"usage: forge-{verb}"), (verb, err[-2000:])


@pytest.mark.slow
def test_demo_runs_from_the_wheel_outside_the_checkout(installed):
    venv, env, elsewhere = installed
    out = elsewhere / "demo"
    printed = run(venv / "bin" / "python", REPO / "examples" / "demo.py", cwd=elsewhere,
                  env={**env, "FORGE_DEMO_OUT": str(out)}, timeout=240)
    assert "forge-convert: 3 sessions" in printed and (out / "report.html").is_file()
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["sft", "tokens"]
