"""Each top-level folder imports only what the README's Layout table says it may.

The imports are read from the source (every `import` and `from`, relative ones
resolved against the package they sit in, function-level ones included), so a
lazy import inside a function cannot slip past. The top package (`forgerl/`:
errors, the verbs' wrapper, the printer) may be imported from anywhere and
imports none of the folders.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

# folder -> what it may import besides itself and the top package (a folder, or one module of it), as README.md's
# Layout table has it.
MAY_IMPORT: dict[str, set[str]] = {
    "forgerl": set(),
    "harnesses": set(),
    "schema": {"harnesses"},
    "recorder": {"harnesses", "schema"},
    "converters": {"harnesses", "schema", "recorder"},
    "analysis": {"harnesses", "schema", "converters", "recorder.images"},
    "runners": {"harnesses", "schema", "recorder", "analysis"},
    "trainer": {"harnesses", "schema", "recorder", "converters", "analysis", "runners"},
}
FOLDERS = set(MAY_IMPORT) - {"forgerl"}


def imported(path: Path, folder: str, root: Path = REPO) -> set[str]:
    """The forgerl modules `path` (in `root`'s `folder`) imports, as dotted names below `forgerl`."""
    package = [] if folder == "forgerl" else list(path.relative_to(root).parent.parts)
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            names.add(".".join(["forgerl", *base, *([node.module] if node.module else [])]))
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
    return {n.removeprefix("forgerl.") for n in names if n.startswith("forgerl.")}


def crossings(folder: str, root: Path = REPO) -> set[str]:
    """`file: module` for each import of another folder that `MAY_IMPORT` does not allow."""
    allowed = MAY_IMPORT[folder]
    bad = set()
    for path in sorted((root / folder).rglob("*.py")):
        for name in imported(path, folder, root):
            other = name.split(".")[0]
            if other in FOLDERS and other != folder and not any(name == a or name.startswith(f"{a}.")
                                                               for a in allowed):
                bad.add(f"{path.relative_to(root)}: {name}")
    return bad


def test_every_folder_imports_only_what_the_layout_allows():
    assert {folder: crossings(folder) for folder in MAY_IMPORT} == {folder: set() for folder in MAY_IMPORT}


def test_a_crossing_is_seen_wherever_it_hides(tmp_path):
    """A relative import two levels up, inside a function, is found and resolved to its folder; one allowed
    module of a folder does not allow the rest of it."""
    (tmp_path / "analysis" / "viewer").mkdir(parents=True)
    probe = tmp_path / "analysis" / "viewer" / "probe.py"
    probe.write_text("def later():\n    from ...runners import local\n    from ..views import VIEWS\n"
                     "    import forgerl.recorder.images, forgerl.recorder.proxy\n")
    assert imported(probe, "analysis", tmp_path) == {"runners", "analysis.views", "recorder.images",
                                                     "recorder.proxy"}
    assert crossings("analysis", tmp_path) == {"analysis/viewer/probe.py: runners",
                                               "analysis/viewer/probe.py: recorder.proxy"}


# ---------------------------------------------------------------- modules


def modules(root: Path = REPO) -> dict[str, Path]:
    """Every product module by dotted name below `forgerl` (a package by its folder's name)."""
    found = {}
    for folder in MAY_IMPORT:
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)[1 if folder == "forgerl" else 0:]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def module_imports(name: str, path: Path, known: dict[str, Path], root: Path = REPO) -> tuple[set[str], set[str]]:
    """The product modules `name` imports (function-level ones and `importlib.import_module(f"{__name__}.…")`
    of its own submodules included, `if TYPE_CHECKING:` blocks not), and `from M import _private` lines taking
    a private name of another module."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    package = (name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]) if name else []
    targets: set[str] = set()
    private: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets |= {a.name.removeprefix("forgerl.") for a in node.names if a.name.startswith("forgerl.")}
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("forgerl")):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])]) if node.level else \
                node.module.removeprefix("forgerl").lstrip(".")
            for alias in node.names:
                sub = f"{module}.{alias.name}".lstrip(".")
                if sub in known:
                    targets.add(sub)
                else:
                    targets.add(module)
                    if alias.name.startswith("_") and module != name:
                        private.add(f"{path.relative_to(root)}: from {module} import {alias.name}")
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args \
                and ast.unparse(node.args[0]).startswith("f'{__name__}."):
            targets |= {m for m in known if m.startswith(f"{name}.") and m.count(".") == name.count(".") + 1}
    return {t for t in targets if t in known and t != name}, private


def import_graph(root: Path = REPO) -> tuple[dict[str, set[str]], set[str]]:
    known = modules(root)
    graph, private = {}, set()
    for name, path in known.items():
        graph[name], bad = module_imports(name, path, known, root)
        private |= bad
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_import_cycle():
    assert cycles(import_graph()[0]) == []


def test_no_private_name_is_imported_across_modules():
    assert import_graph()[1] == set()


def test_a_cycle_and_a_private_import_are_seen_however_they_hide(tmp_path):
    """A cycle closed by a function-level import, or by `import_module` of the package's own submodules, is
    found; so is a private name taken from a sibling."""
    kinds = tmp_path / "runners" / "kinds"
    kinds.mkdir(parents=True)
    (tmp_path / "runners" / "__init__.py").write_text("")
    (tmp_path / "runners" / "tasks.py").write_text("def load():\n    from .kinds import kind_of\n")
    (kinds / "__init__.py").write_text("import importlib\ndef kind_of(n):\n"
                                       "    return importlib.import_module(f'{__name__}.{n}')\n")
    (kinds / "web.py").write_text("from ..tasks import Task, _helper\n")
    graph, private = import_graph(tmp_path)
    assert cycles(graph) == [["runners.kinds", "runners.kinds.web", "runners.tasks"]]
    assert {p.split(": ")[1] for p in private} == {"from runners.tasks import _helper"}
