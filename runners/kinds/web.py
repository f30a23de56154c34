"""Web tasks: a browser agent works self-hosted web apps served inside the rollout's sandbox.

The offline equivalent of WebVoyager and Online-Mind2Web, in the style of
WebArena's self-hosted sites. A web benchmark is a folder holding
`apps.toml` and `tasks/*.toml` (the project's own is `benchmarks/web/`):

    # apps.toml: each app, the script that serves it and its fixed port
    [shop]
    script = "apps/shop.py"       # run as `python3 SCRIPT --port PORT`; relative to apps.toml
    port = 8101

    # tasks/<id>.toml
    id = "shop-cheapest-kettle"
    type = "information"           # information (answer checked) | transaction (final state checked)
    apps = ["shop"]                # the apps served for this task
    prompt = "On the shop at http://127.0.0.1:8101/ ..."
    timeout_seconds = 600          # optional, as for every task
    [[checks]]                     # per-check scores in [0, 1]; the reward is their mean
    name = "names the cheapest kettle in stock"
    answer_includes = "min((p for p in shop['products'] if ...), key=lambda p: p['price'])['name']"
    [[checks]]
    name = "no order placed"
    expect = "len(shop['orders']) == 2"

Checks are evaluated by `web_checks.py` (what they see, how answers
match). Every app serves `GET /__forge/health` and `GET /__forge/state`,
which no page links to: the sandbox collects the state after the harness
exits, and only the grader reads it. Fixed ports never clash across
parallel rollouts: each rollout's apps run in its own network namespace.
"""

from __future__ import annotations

import json
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from forgerl.harnesses.browser import PLAYWRIGHT_MCP
from forgerl.schema.messages import Message

from ..grading import GradeInput, GradingError, grade_workspace
from ..services import Service
from ..tasks import DEFAULT_TIMEOUT_S, Task, TaskError
from .spec import Seconds, Spec, Text, checked

READS = "a web benchmark (apps.toml + tasks/*.toml)"
APPS_FILE = "apps.toml"
CHECK_KINDS = ("answer_includes", "expect")
GRADER = "from forgerl.runners.kinds.web_checks import grade\n"
STATE_PATH = "/__forge/state"
HEALTH_PATH = "/__forge/health"


@dataclass(frozen=True)
class WebApp:
    """One app of the benchmark, served on a fixed port inside the rollout's network namespace."""

    name: str
    script: Path
    port: int

    def service(self) -> Service:
        """The app as a sandbox service: the runner's Python runs its script (the apps need only its standard
        library); healthy at `/__forge/health`; `/__forge/state` collected after the harness."""
        return Service(self.name, (sys.executable, str(self.script), "--port", str(self.port)), self.port,
                       health_path=HEALTH_PATH, state_paths=(STATE_PATH,))


@dataclass(frozen=True)
class WebTask(Task):
    """A task over web apps, graded by its checks against the final answer, the apps' state and the trajectory."""

    apps: tuple[WebApp, ...] = ()
    task_type: str = "information"
    checks: tuple[dict, ...] = ()  # {"name", "answer_includes" | "expect"}

    benchmark: ClassVar[str] = "forgerl-web"
    offline_ungradable: ClassVar[str] = "its checks read the apps' state after the run"

    def score(self, run: GradeInput) -> dict[str, float]:
        states = {app.name: (run.service_state.get(app.name) or {}).get(STATE_PATH) for app in self.apps}
        missing = [f"{name} ({state['error']})" if isinstance(state, dict) and "error" in state else name
                   for name, state in states.items() if not isinstance(state, dict) or "error" in state]
        if missing:
            raise GradingError(f"no state was collected from the app(s) {', '.join(missing)}")
        turns = [browser_actions(output) for output in run.turns]
        payload = {"checks": list(self.checks), "answer": run.final_answer, "state": states,
                   "actions": [action for actions in turns for action in actions], "steps": sum(map(bool, turns))}
        return grade_workspace(self, payload, run.workspace)


def browser_actions(messages: list[Message]) -> list[dict]:
    """The actions in one model answer, in order: tool calls (Playwright MCP's `browser_click`, ...) and the
    items of browser-use's structured answers (`{"action": [{"click": {...}}, ...]}` in the assistant's text)."""
    actions: list[dict] = []
    for message in messages:
        if message.role != "assistant":
            continue
        for part in message.parts:
            if part.type == "tool_call":
                actions.append({"name": part.tool_name, "arguments": _json(part.arguments) or {}})
            elif part.type == "text" and isinstance(doc := _json(part.text), dict):
                for item in doc.get("action") or []:
                    if isinstance(item, dict) and len(item) == 1:
                        (name, arguments), = item.items()
                        actions.append({"name": name, "arguments": arguments})
    return actions


def _json(text: str | None) -> object:
    try:
        return json.loads(text or "")
    except json.JSONDecodeError:
        return None


def _benchmark_root(path: Path) -> Path | None:
    for folder in (path, path.parent, path.parent.parent):
        if (folder / APPS_FILE).is_file():
            return folder
    return None


def matches(path: Path) -> bool:
    """A web benchmark folder (`apps.toml` + `tasks/`), its `tasks/` folder, or one of its task files."""
    root = _benchmark_root(path)
    return root is not None and (path.is_dir() or (path.suffix == ".toml" and path.parent == root / "tasks"))


class AppSpec(Spec):
    """An app of `apps.toml`."""

    script: Text
    port: Annotated[int, Field(gt=0, lt=65536)]


class CheckSpec(Spec):
    """A `[[checks]]` table: a name and one expression, `answer_includes` or `expect`."""

    name: Text
    answer_includes: str | None = None
    expect: str | None = None

    @model_validator(mode="after")
    def _one_expression(self) -> CheckSpec:
        if (self.answer_includes is None) == (self.expect is None):
            raise ValueError(f"one of {' or '.join(CHECK_KINDS)}")
        return self


class WebTaskSpec(Spec):
    """A web task file, `tasks/<id>.toml`."""

    id: Text
    type: Literal["information", "transaction"] = "information"
    apps: Annotated[list[str], Field(min_length=1)]
    prompt: Text
    timeout_seconds: Seconds = DEFAULT_TIMEOUT_S
    checks: Annotated[list[CheckSpec], Field(min_length=1)]


def _toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TaskError(f"{path}: {e}") from None


def load_apps(root: Path) -> dict[str, WebApp]:
    apps = {}
    where = root / APPS_FILE
    for name, raw in _toml(where).items():
        spec = checked(AppSpec, raw, where, at=(name,))
        script = root / spec.script
        if not script.is_file():
            raise TaskError(f"{where}: app {name!r}: no such script {script}")
        apps[name] = WebApp(name, script.resolve(), spec.port)
    return apps


def _check(check: CheckSpec, where: Path) -> dict:
    """The check as the grading child takes it, its expression compiled now."""
    kind = "answer_includes" if check.answer_includes is not None else "expect"
    expression = getattr(check, kind)
    try:
        compile(expression, str(where), "eval")
    except SyntaxError as e:
        raise TaskError(f"{where}: check {check.name!r}: {kind} does not compile: {e.msg}") from None
    return {"name": check.name, kind: expression}


def load_one(path: Path, apps: dict[str, WebApp]) -> WebTask:
    spec = checked(WebTaskSpec, _toml(path), path)
    unknown = [a for a in spec.apps if a not in apps]
    if unknown:
        raise TaskError(f"{path}: unknown app(s) {', '.join(unknown)}; {APPS_FILE} has {', '.join(apps)}")
    chosen = tuple(apps[a] for a in spec.apps)
    return WebTask(id=spec.id, prompt=spec.prompt, grader=GRADER, path=path, timeout_s=spec.timeout_seconds,
                   services=tuple(app.service() for app in chosen), mcp_servers=(PLAYWRIGHT_MCP,),
                   apps=chosen, task_type=spec.type, checks=tuple(_check(c, path) for c in spec.checks))


def load(path: Path) -> list[Task]:
    root = _benchmark_root(path)
    apps = load_apps(root)
    files = [path] if path.is_file() else sorted((root / "tasks").glob("*.toml"))
    if not files:
        raise TaskError(f"{root}: no web tasks in {root / 'tasks'}")
    return [load_one(f, apps) for f in files]
