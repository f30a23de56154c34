"""The registry: every harness module of this package, and each table derived from their specs.

A harness module is any module here that defines `HARNESS` (one `Harness`);
they are found with `pkgutil`, so adding a harness is adding its module. The
tables other folders read (launchers, fingerprints, tool kinds, plan and
subagent tools, `--help` lists, the README's table, the pins) are built
from the specs here and nowhere else.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from pathlib import Path

from .launch import Launch, harness_env
from .spec import Fingerprints, Harness, HarnessError, Key, NotApplicable, Pin, PlanTools


def _discover() -> dict[str, Harness]:
    package = __name__.rpartition(".")[0]
    found: dict[str, Harness] = {}
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        harness = getattr(importlib.import_module(f"{package}.{info.name}"), "HARNESS", None)
        if isinstance(harness, Harness):
            if harness.name in found:
                raise RuntimeError(f"two harness modules name {harness.name!r}")
            found[harness.name] = harness
    return found


HARNESSES: dict[str, Harness] = _discover()
"""`--harness` name -> spec, in name order."""


def get_harness(name: str) -> Harness:
    try:
        return HARNESSES[name]
    except KeyError:
        raise HarnessError(f"unknown harness {name!r}; known: {', '.join(HARNESSES)}") from None


def _applies(value: object) -> bool:
    return not isinstance(value, NotApplicable)


# -- how `forge-record run` aims a command ----------------------------------------------------------------------

LAUNCHERS: dict[str, Harness] = {command: h for h in HARNESSES.values() if _applies(h.commands)
                                 for command in h.commands}
"""The file names `forge-record run -- CMD` knows (a CLI, or the script a Python interpreter runs) -> harness."""


def command_name(argv: list[str]) -> str:
    """The file name that names `argv`'s program: its own, or for `python [-opts] SCRIPT ...` the script's."""
    name = Path(argv[0]).name
    if name.startswith("python"):
        script = next((a for a in argv[1:] if not a.startswith("-")), "")
        return Path(script).name
    return name


def launch(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    """`argv` aimed at the session: its harness's launcher, else the SDK base-URL variables."""
    harness = LAUNCHERS.get(command_name(argv))
    if harness is None:
        return Launch(list(argv), harness_env(base_url, session))
    return harness.launch(argv, base_url, session, scratch)


# -- identification ----------------------------------------------------------------------------------------------

def _check_order(harnesses: Iterable[Harness]) -> list[tuple[str, Fingerprints]]:
    """Fingerprints in the order they are tried: name order, except that a harness whose calls also match
    another's fingerprints (`precedes`) comes before it."""
    specs = {h.name: h.fingerprints for h in harnesses if isinstance(h.fingerprints, Fingerprints)}
    order: list[tuple[str, Fingerprints]] = []
    left = dict(specs)
    while left:
        ready = [n for n in left if not any(n in f.precedes for m, f in left.items() if m != n)]
        if not ready:
            raise RuntimeError(f"harness fingerprints precede each other in a cycle: {sorted(left)}")
        order.append((ready[0], left.pop(ready[0])))
    return order


FINGERPRINTS: tuple[tuple[str, Fingerprints], ...] = tuple(_check_order(HARNESSES.values()))


# -- what the analysis and the thread segmenter read ---------------------------------------------------------------

SUBAGENT_TOOLS: frozenset[str] = frozenset(
    tool for h in HARNESSES.values() if _applies(h.subagent_tools) for tool in h.subagent_tools)
"""Tools that start a subagent, in any harness (the segmenter's `subagent` edges, the analysis' `subagent` kind)."""


def _tool_kinds() -> dict[str, str]:
    kinds: dict[str, str] = {}
    for h in HARNESSES.values():
        own = dict(h.tool_kinds) if _applies(h.tool_kinds) else {}
        own |= {tool: "subagent" for tool in (h.subagent_tools if _applies(h.subagent_tools) else ())}
        for tool, kind in own.items():
            if kinds.setdefault(tool, kind) != kind:
                raise RuntimeError(f"tool {tool!r} is {kinds[tool]} in one harness and {kind} in {h.name}")
    return kinds


TOOL_KINDS: dict[str, str] = _tool_kinds()
"""Tool name as the model sees it -> kind, over every harness (a name two harnesses share has one kind)."""

_PLANS = [h.plan_tools for h in HARNESSES.values() if isinstance(h.plan_tools, PlanTools)]
PLAN_SNAPSHOTS: dict[str, str] = {tool: path for p in _PLANS for tool, path in p.snapshots.items()}
PLAN_CREATE: tuple[str, ...] = tuple(dict.fromkeys(tool for p in _PLANS for tool in p.create))
PLAN_UPDATE: dict[str, str | None] = {tool: path for p in _PLANS for tool, path in p.update.items()}


# -- what the verbs and the docs show ------------------------------------------------------------------------------

def _line(value: object) -> str:
    return value.reason if isinstance(value, NotApplicable) else str(value)


def mcp_help() -> str:
    """`forge-run --help`: how each harness is given a task's MCP servers."""
    return "\n".join(f"  {name}: {_line(h.mcp_wiring)}" for name, h in HARNESSES.items())


def resume_help() -> str:
    """`forge-run --help`: how each harness continues its session for a simulated user's reply."""
    return "\n".join(f"  {name}: {_line(h.resumes)}" for name, h in HARNESSES.items())


def recorded_commands() -> str:
    """`forge-record run --help`: the commands it aims at the recorder, with the harness each is."""
    return ", ".join(f"{command} ({h.name})" for command, h in LAUNCHERS.items())


def pins(registry: str | None = None) -> list[Pin]:
    """The pinned installs (of one registry: npm, pypi, cargo), in harness name order."""
    return [h.pin for h in HARNESSES.values()
            if isinstance(h.pin, Pin) and (registry is None or h.pin.registry == registry)]


def readme_table() -> str:
    """The README's harness table (markdown), one row a harness; `tests/test_harness_registry.py` keeps the
    README's copy equal to it."""
    rows = ["| harness (`--harness`) | pin | runtime | API | key | `forge-record run --` | final answer / own "
            "transcript | plan / subagent tools |", "|---|---|---|---|---|---|---|---|"]
    for name, h in HARNESSES.items():
        pin = h.pin if isinstance(h.pin, Pin) else None
        where = f"{pin.registry} `{pin}`" + (f" ({pin.installer})" if pin.installer else " (not installable here)")
        runtime = (f"{h.runtime.name} >= {'.'.join(map(str, h.runtime.minimum))}" if _applies(h.runtime)
                   else h.runtime.reason)
        key = (f"`{h.key.env}` as `{h.key.header}" + (f": {h.key.scheme}" if h.key.scheme else "") + "`"
               if isinstance(h.key, Key) else "—")
        plans = h.plan_tools
        plan = ", ".join([*plans.snapshots, *plans.create, *plans.update]) if isinstance(plans, PlanTools) else "—"
        subagents = ", ".join(sorted(h.subagent_tools)) if _applies(h.subagent_tools) else "—"
        commands = ", ".join(f"`{c}`" for c in h.commands) if _applies(h.commands) else "—"
        answer = _line(h.final_answer_from)
        transcript = h.transcript if isinstance(h.transcript, str) else "—"
        rows.append(f"| `{name}` | {where} | {runtime} | {h.api} | {key} | {commands} | {answer} / {transcript} "
                    f"| {plan or '—'} / {subagents} |")
    return "\n".join(rows)
