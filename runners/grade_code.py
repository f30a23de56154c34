"""A task's grade() source run on a workspace: what the grading child does, and nothing it does not need.

The child is forked from the warm fork server the jails fork from
(`forkserver.py`), which is small because nothing it imports pulls in
pyarrow: a fork copies its parent's page tables and every page the child
writes, so grading from a 90 MB parent cost twice the CPU. Keep this
module's imports to the standard library.
"""

from __future__ import annotations

import ast

# Names through which code can reach a function's arguments without naming them (frames, eval).
_INTROSPECTION = frozenset({"eval", "exec", "locals", "vars", "globals", "sys", "inspect", "__import__",
                            "builtins"})


class GradingError(RuntimeError):
    """grade() raised, hung, or returned something that is not {name: number}."""


def run_grade(code: str, transcript: list, workspace: str) -> dict[str, float]:
    """Execute grader source and call its grade(); in-process (the child of `grading.grade_workspace`)."""
    namespace: dict = {"__name__": "forgerl_task_grader"}
    exec(compile(code, "<grade>", "exec"), namespace)  # noqa: S102 - the task's own grader, in a child process
    grade = namespace.get("grade")
    if not callable(grade):
        raise GradingError("the automated checks define no grade() function")
    scores = grade(transcript, workspace)
    if not isinstance(scores, dict):
        raise GradingError(f"grade() returned {type(scores).__name__}, expected a dict")
    out: dict[str, float] = {}
    for name, value in scores.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GradingError(f"grade() score {name!r} is {value!r}, not a number")
        out[str(name)] = float(value)
    return out


def reads_transcript(code: str) -> bool:
    """Whether grade() may look at its first argument, the transcript; False only when it provably cannot.

    A grader that checks files alone (21 of QwenClawBench's 34 do) is handed an
    empty transcript, so the runner does not read the rollout's calls back for
    it. Provably: the module binds `grade` once, as an undecorated top-level
    `def` with a named first parameter, and nothing in that def names the
    parameter, and nothing in the module names what reaches arguments unnamed
    (`eval`, `locals`, `sys`, ...). Anything else, a syntax error included,
    counts as reading it (the child reports the error).
    """
    try:
        module = ast.parse(code)
    except SyntaxError:
        return True
    bindings = [node for node in ast.walk(module) if _binds_grade(node)]
    if len(bindings) != 1 or not isinstance(bindings[0], ast.FunctionDef) or bindings[0] not in module.body:
        return True
    grade = bindings[0]
    if grade.decorator_list or not (grade.args.posonlyargs or grade.args.args):
        return True
    first = (grade.args.posonlyargs or grade.args.args)[0].arg
    named = {node.id for node in ast.walk(grade) if isinstance(node, ast.Name)}
    reached = {node.id for node in ast.walk(module) if isinstance(node, ast.Name)}
    for node in ast.walk(module):  # the modules imported, as `sys` in `from sys import _getframe`
        if isinstance(node, ast.Import):
            reached |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            reached.add(node.module.split(".")[0])
    return first in named or bool(reached & _INTROSPECTION)


def _binds_grade(node: ast.AST) -> bool:
    """Whether `node` (re)binds the name `grade`: a def, a class, an assignment, an import, a `global`."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == "grade"
    if isinstance(node, ast.Name):
        return node.id == "grade" and isinstance(node.ctx, (ast.Store, ast.Del))
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name) == "grade" for alias in node.names)
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return "grade" in node.names
    return False
