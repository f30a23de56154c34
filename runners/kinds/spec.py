"""A task file checked against its format's schema before anything starts: one line naming the file, the key and
what was expected.

Each kind declares its format as pydantic models over the parsed TOML or
YAML. `Spec` is the base of the formats forgerl defines (unknown keys
refused, values taken with the types the file gave them: `"4096"` is not a
number); a benchmark's own format (Harbor) keeps its own coercions and only
adds `extra="forbid"`. `refuse_unknown_keys` finds a key a benchmark's own, more
lenient, model (ClawEval's `TaskDefinition`) would drop silently.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ..tasks import TaskError

M = TypeVar("M", bound=BaseModel)


class Spec(BaseModel):
    """A forgerl task format: every key known, every value of its declared type."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _inside_workspace(dest: str) -> str:
    if not dest or Path(dest).is_absolute() or ".." in Path(dest).parts:
        raise ValueError("a relative path inside the workspace")
    return dest


WorkspacePath = Annotated[str, AfterValidator(_inside_workspace)]
Text = Annotated[str, Field(min_length=1)]
Seconds = Annotated[float, Field(gt=0)]


class WorkspaceFileSpec(Spec):
    """A `workspace_files` entry: `source` (where the kind says) copied to `dest` in the workspace."""

    source: Text
    dest: WorkspacePath


def _key_path(loc: tuple[str | int, ...]) -> str:
    """`('workspace_files', 0, 'dest')` as `workspace_files[0].dest`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "(top level)"


def _inner(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """The model a field holds: itself ("model"), as a list's items ("list") or as a dict's values ("dict")."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _inner(args[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "model", annotation
    if origin in (Union, types.UnionType):
        return next(filter(None, map(_inner, args)), None)
    item = _inner(args[-1]) if origin in (list, dict) and args else None
    return (origin.__name__, item[1]) if item and item[0] == "model" else None


def _nested(annotation: Any, key: str, value: object) -> list[tuple[tuple, type[BaseModel], object]]:
    """(where, model, value) for each model value inside one field's value."""
    inner = _inner(annotation)
    if inner is None:
        return []
    shape, model = inner
    if shape == "model":
        return [((key,), model, value)]
    if shape == "list" and isinstance(value, list):
        return [((key, i), model, v) for i, v in enumerate(value)]
    if shape == "dict" and isinstance(value, dict):
        return [((key, k), model, v) for k, v in value.items()]
    return []


def _known_keys(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def _pattern(loc: tuple) -> str:
    """A key path with every list index as `[]`: `safety_checks[].field`."""
    return re.sub(r"\[\d+\]", "[]", _key_path(loc))


def _unknown_key(model: type[BaseModel], data: object, tolerated: frozenset[str] = frozenset(),
                loc: tuple = ()) -> tuple[tuple, list[str]] | None:
    """The first key in `data` (nested included) that `model` does not declare and that is not `tolerated` (key
    paths as `_pattern` writes them), and the keys `model` declares there."""
    if not isinstance(data, dict) or model.model_config.get("extra") == "allow":
        return None
    fields = {field.alias or name: field for name, field in model.model_fields.items()}
    for key, value in data.items():
        if key not in fields:
            if _pattern((*loc, key)) in tolerated:
                continue
            return (*loc, key), _known_keys(model)
        for where, inner, item in _nested(fields[key].annotation, key, value):
            found = _unknown_key(inner, item, tolerated, (*loc, *where))
            if found:
                return found
    return None


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model that holds the key at `loc` (for naming the keys it allows)."""
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        inner = _inner(field.annotation) if field else None
        if inner is None:
            return None
        model = inner[1]
    return model


def _problem(error: dict, model: type[BaseModel], at: tuple) -> str:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    key = _key_path((*at, *loc))
    if error["type"] == "extra_forbidden":
        holder = _model_at(model, loc[:-1])
        allowed = f" (expected one of: {', '.join(_known_keys(holder))})" if holder else ""
        return f"unknown key {key!r}{allowed}"
    if error["type"] == "missing":
        return f"missing key {key!r}"
    expected = error["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
    return f"{key} = {error['input']!r}: expected {expected}"


def checked(model: type[M], data: object, where: Path, at: tuple = ()) -> M:
    """`data` (the table at key path `at` of the file) as `model`, or a TaskError naming the file `where`, the
    first wrong key and what it should be."""
    if not isinstance(data, dict):
        raise TaskError(f"{where}: {_key_path(at)}: expected a table of keys, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise TaskError(f"{where}: {_problem(errors[0], model, at)}{more}") from None


def refuse_unknown_keys(model: type[BaseModel], data: object, where: Path,
                        tolerated: frozenset[str] = frozenset()) -> None:
    """A TaskError for the first key `model` would silently drop (but the `tolerated` ones)."""
    found = _unknown_key(model, data, tolerated)
    if found:
        loc, allowed = found
        raise TaskError(f"{where}: unknown key {_key_path(loc)!r} (expected one of: {', '.join(allowed)})")


def compile_grader(code: str, where: Path, first_line: int = 1, what: str = "grader") -> None:
    """A TaskError naming the file and line of a syntax error in grader code that starts at `first_line`."""
    try:
        compile(code, str(where), "exec")
    except SyntaxError as e:
        line = first_line + (e.lineno or 1) - 1
        raise TaskError(f"{where}:{line}: {what} does not compile: {e.msg}") from None
