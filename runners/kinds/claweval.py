"""ClawEval tasks (`tasks/<id>/task.yaml` + `grader.py` + `fixtures/`, with `mock_services/` beside `tasks/`).

A task is loaded with ClawEval's own `TaskDefinition` (the `claw_eval`
package, installed from the benchmark folder): a key its models do not define
(which they would drop silently) or a value of the wrong type is refused,
naming the file and the key, and its `grader.py` is compiled. A rollout of it

* copies its `sandbox_files` into the workspace at the same relative paths
  (where ClawEval's sandbox puts them, under `/workspace`), each found as
  ClawEval finds it: in the task's folder, else in the benchmark folder;
* starts its `services` (the FastAPI mock services, run from the benchmark
  folder) in the rollout's own network namespace (`runners/services.py`),
  waits on each health check (at least `MIN_READY_S`: a busy machine is not
  a failed task) and POSTs its reset endpoint; afterwards each service's
  `/audit` (beside its reset endpoint, as ClawEval's loop finds it) is read;
* gives the harness the task's `tools` as an MCP server named `claweval`
  (`claweval_mcp.py`) that calls the task's `tool_endpoints`;
* is graded by the task's own `grader.py` in a forked child
  (`claweval_grade.py`): `AbstractGrader.grade(messages, dispatches, task,
  audit_data, judge, ...)` on the recorded conversation, then
  `compute_task_score`. The outcome keeps the dimension scores beside the
  task score; a trial passes at task score >= 0.75 (`is_pass`).

Tasks that cannot run here load all the same and become `infra_error` with
the reason (never a 0): those whose services call the live web
(`mock_services/web_real*`), whose fixtures this copy lacks, or that need a
sandbox snapshot (`env_snapshot_*`), or that would need their services kept
across a simulated user's rounds. Tasks with a `user_agent` persona hold a
dialogue with a simulated user (`runners/simulated_user.py`) when forge-run
is given a user model, its `system_prompt_suffix` (the agent's instructions
for such a dialogue, which ClawEval appends to its system prompt) after the
prompt; without one they are skipped, and said so.

Accepted paths: the benchmark folder (holding `tasks/*/task.yaml`), one
task's folder, or its `task.yaml`.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

import yaml

from forgerl.harnesses import McpServer

from ..forkserver import ForkError, fork_call
from ..grading import GRADER_TIMEOUT_S, NOT_GRADED, GradeInput, GradingError, Reward
from ..services import Service
from ..simulated_user import Persona
from ..tasks import Task, TaskError, WorkspaceFile
from .spec import checked, compile_grader, refuse_unknown_keys

if TYPE_CHECKING:
    from claw_eval.models.task import ServiceDef, TaskDefinition

READS = "ClawEval tasks/*/task.yaml"
TASK_FILE = "task.yaml"
INSTALL_HINT = "pip install a copy of the ClawEval folder (`make test` installs ../shared/benchmarks/claweval)"
MIN_READY_S = 30.0
JUDGED_GRADE_TIMEOUT_S = 900  # a grader may ask the judge a dozen times
LIVE_WEB = "mock_services/web_real"
DIMENSIONS = ("completion", "robustness", "communication", "safety")
NOT_JUDGED = "judge_calls_not_graded"
# Keys ClawEval's own tasks carry that its models drop (T035zh, T068zh, ...): read by nothing, refused nowhere.
DROPPED_BY_CLAWEVAL = frozenset({"safety_checks[].field", "safety_checks[].value", "environment.sandbox_tools"})  # score key: judge calls answered 0 because no --judge was given


@dataclass(frozen=True)
class ClawEvalTask(Task):
    """One ClawEval task: its `TaskDefinition` and the benchmark folder its services run from."""

    definition: Any = None  # claw_eval.models.task.TaskDefinition (pydantic; the package is imported lazily)
    root: Path = Path()  # the benchmark folder: service commands and fixture paths are relative to it

    benchmark: ClassVar[str] = "ClawEval"
    pass_threshold: ClassVar[float] = 0.75  # claw_eval.models.scoring.is_pass's threshold
    missing_trials_fail: ClassVar[bool] = True  # score_summary.py pads each task's trials with 0
    offline_ungradable: ClassVar[str] = ("its grader reads the recorded session's tool dispatches and the services' "
                                         "audit data after the run")

    def pass_rule(self) -> str:
        return (f"{self.benchmark}: passes at task score >= {self.pass_threshold:g} (compute_task_score); missing "
                "trials count 0, as score_summary.py counts them; without --judge its LLM-judged parts score 0 "
                "(outcomes.graded says llm_judge: not graded)")

    def score(self, run: GradeInput) -> dict[str, float]:
        """The task's own grader on the recording: the dimension scores, `task_score`, and how many judge calls
        went ungraded."""
        args = {"task_file": str(self.path), "tasks_dir": str(self.root / "tasks"), "dataset": str(run.dataset),
                "session": run.session, "audit": self.audit_data(run.service_state),
                "judge": [run.judge.url, run.judge.model] if run.judge else None}
        timeout = JUDGED_GRADE_TIMEOUT_S if run.judge else GRADER_TIMEOUT_S
        try:
            answer = fork_call("forgerl.runners.kinds.claweval_grade:grade", args, str(run.workspace), timeout)
        except ForkError as e:
            raise GradingError(f"grader.py {e}") from None
        if not answer["ok"]:
            raise GradingError(f"grader.py failed: {answer['error']}")
        return answer["result"]

    def reward(self, scores: dict[str, float]) -> Reward:
        """The task score (`compute_task_score`); `graded` keeps the dimensions and says when the judge was not."""
        graded: dict = {d: scores[d] for d in DIMENSIONS if d in scores}
        graded["llm_judge"] = NOT_GRADED if scores.get(NOT_JUDGED) else "graded"
        return Reward(reward=scores["task_score"], graded=graded)

    def audit_data(self, service_state: dict) -> dict[str, dict]:
        """`audit_data` as ClawEval's trace holds it: each service's `/audit` answer by service name."""
        audit: dict[str, dict] = {}
        for service in self.services:
            for path in service.state_paths:
                answer = (service_state.get(service.name) or {}).get(path)
                if isinstance(answer, dict):
                    audit[service.name] = answer
        return audit


def _task_definition_class() -> type[TaskDefinition]:
    try:
        from claw_eval.models.task import TaskDefinition
    except ImportError:
        raise TaskError(f"ClawEval tasks need the claw_eval package: {INSTALL_HINT}") from None
    return TaskDefinition


def _task_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path] if path.name == TASK_FILE else []
    if (path / TASK_FILE).is_file():
        return [path / TASK_FILE]
    return sorted((path / "tasks").glob(f"*/{TASK_FILE}")) if (path / "tasks").is_dir() else []


def matches(path: Path) -> bool:
    """The benchmark folder, a task folder, or a `task.yaml`."""
    return bool(_task_files(path))


def _benchmark_root(task_dir: Path) -> Path:
    """The folder holding `tasks/` (and `mock_services/`): two levels above a task's own folder."""
    root = task_dir.parent.parent
    if task_dir.parent.name != "tasks" or not (root / "mock_services").is_dir():
        raise TaskError(f"{task_dir}: a ClawEval task folder must sit in <benchmark>/tasks/ beside mock_services/")
    return root


def _service(svc: ServiceDef, root: Path, where: Path) -> Service:
    """A ClawEval `ServiceDef` as a sandbox service: run from the benchmark folder, `python` being ours."""
    argv = shlex.split(svc.command)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    health = urlsplit(svc.health_check)
    if health.hostname not in ("localhost", "127.0.0.1") or health.port != svc.port:
        raise TaskError(f"{where}: service {svc.name!r} health check {svc.health_check} is not on its port {svc.port}")
    reset = urlsplit(svc.reset_endpoint).path if svc.reset_endpoint else ""
    audit = reset.rsplit("/reset", 1)[0] + "/audit" if reset else ""
    return Service(name=svc.name, argv=tuple(argv), port=svc.port, cwd=str(root), env=dict(svc.env),
                   health_path=health.path or "/", health_method=svc.health_check_method.upper(),
                   ready_timeout_s=max(float(svc.ready_timeout), MIN_READY_S), reset_path=reset,
                   state_paths=(audit,) if audit else ())


def _unavailable(definition: TaskDefinition, files: tuple[WorkspaceFile, ...], task_dir: Path) -> str:
    """Why this task cannot run here ("" if it can)."""
    web = [s.name for s in definition.services if LIVE_WEB in s.command]
    if web:
        return f"needs the live web (service {', '.join(web)} runs {LIVE_WEB}*), which rollouts cannot reach"
    missing = [str(f.dest) for f in files if not f.source.exists()]
    if missing:
        return f"fixtures missing from this copy of ClawEval (expected in {task_dir}): {', '.join(missing)}"
    if definition.env_snapshot_files or definition.env_snapshot_commands:
        return "its grader reads a sandbox snapshot (env_snapshot_files/commands), which forge-run does not take"
    if definition.user_agent.enabled and definition.services:
        return ("its simulated user's rounds each run the harness afresh, and its services would not keep their "
                "state between rounds")
    return ""


def _persona(definition: TaskDefinition) -> tuple[str, Persona | None]:
    """The prompt the harness gets, and the task's simulated user (None: it has none)."""
    config, prompt = definition.user_agent, definition.prompt.text
    if not config.enabled:
        return prompt, None
    suffix = config.system_prompt_suffix.strip()
    return (f"{prompt}\n\n{suffix}" if suffix else prompt), Persona(config.persona, config.max_rounds, prompt)


def _definition(task_file: Path) -> TaskDefinition:
    """The task file read as ClawEval's `TaskDefinition.from_yaml` reads it, with no key its models do not define
    (pydantic would drop it silently) and every value of the type they declare."""
    definition_class = _task_definition_class()
    try:
        data = yaml.safe_load(task_file.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise TaskError(f"{task_file}: not YAML: {e}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise TaskError(f"{task_file}: expected a mapping of keys, got {type(data).__name__}")
    refuse_unknown_keys(definition_class, data, task_file, DROPPED_BY_CLAWEVAL)
    return checked(definition_class, {**data, "task_file": str(task_file.resolve())}, task_file)


def _fixture(rel: str, task_dir: Path, root: Path) -> WorkspaceFile:
    """A `sandbox_files` entry where ClawEval's sandbox finds it (`SandboxRunner._inject_file_list`): beside the
    task's own files, else relative to the benchmark folder (tasks sharing another task's fixtures); it lands at
    the same relative path in the workspace."""
    source = task_dir / rel
    return WorkspaceFile(source if source.exists() or not (root / rel).exists() else root / rel, rel)


def load_one(task_file: Path) -> ClawEvalTask:
    definition = _definition(task_file)
    task_dir = task_file.parent.resolve()
    root = _benchmark_root(task_dir)
    grader = task_dir / "grader.py"
    if grader.is_file():
        compile_grader(grader.read_text(encoding="utf-8"), grader)
    files = tuple(_fixture(rel, task_dir, root) for rel in definition.sandbox_files)
    mcp = McpServer("claweval", (sys.executable, "-m", "forgerl.runners.kinds.claweval_mcp", str(task_file.resolve())))
    prompt, persona = _persona(definition)
    return ClawEvalTask(id=definition.task_id, prompt=prompt, grader="", path=task_file.resolve(),
                        files=files, timeout_s=float(definition.environment.timeout_seconds),
                        services=tuple(_service(s, root, task_file) for s in definition.services),
                        mcp_servers=(mcp,) if definition.tools else (),
                        unavailable=_unavailable(definition, files, task_dir), persona=persona,
                        definition=definition, root=root)


def load(path: Path) -> list[Task]:
    return [load_one(f) for f in _task_files(path)]
