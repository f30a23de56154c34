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
    "schema": set(),
    "recorder": {"schema"},
    "converters": {"schema", "recorder"},
    "analysis": {"schema", "converters", "recorder.images"},
    "runners": {"schema", "recorder", "analysis"},
    "trainer": {"schema", "recorder", "converters", "analysis", "runners"},
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
