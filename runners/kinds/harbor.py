"""Harbor task directories: the layout SkyRL, TRL, Tinker, verifiers and OpenEnv exchange.

    my-task/
      task.toml            [agent] timeout_sec; [verifier] timeout_sec, env;
                           [environment] docker_image, cpus, memory_mb (or memory = "2G"), allow_internet, ...
      instruction.md       the prompt
      environment/         Dockerfile (+ what it copies) or, with docker_image, nothing needed
      tests/test.sh        the verifier: writes /logs/verifier/reward.txt (a number) or reward.json ({name: number})
      solution/solve.sh    optional reference solution

    [[forgerl.services]]   forgerl's extension (a table Harbor does not define): a process the agent and
    name = "tally"         the verifier reach on a fixed loopback port, run from the task folder (`python3` is the
    command = ["python3", "services/tally.py", "--port", "9301"]     runner's interpreter); optional
    port = 9301            health_path (default "/"), reset_path, state_paths (read into the outcome at the end)
    health_path = "/health"

`task.toml` is checked against the fields of Harbor's own `TaskConfig`
(`harbor.models.task.config`, mirrored in `TaskConfig` here: Harbor itself
needs Python >= 3.12 and pulls in litellm and supabase, so it is not a
dependency), with Harbor's coercions, plus `[forgerl]`; a key Harbor does
not define is refused, naming it. Its fields mean what they mean in Harbor:
an unset agent timeout is forgerl's default, the verifier's is 600 s, memory
2048 MiB; the fields forgerl does not act on (storage, gpus, healthcheck,
network_mode, ...) are accepted and not used.

The agent runs, then `bash /tests/test.sh` in the same jail with the
verifier's own timeout (`runners/verifier.py`, which also says why the agent
cannot write the reward ahead of the verifier); the task's services
(`runners/services.py`), started before the agent, stay up through the
verifier, which may read their state. Scores are every numeric key
of the reward (`reward.txt` is `{"reward": x}`); the reward is the `reward`
key, else the mean of the keys; a trial passes at reward 1.0. A verifier that
times out or writes no reward scores 0 (Harbor records no reward, which its
means count as 0), with the reason in the outcome.

**Local runner**: no image is built. The task runs with this machine's tools
(`environment: host` in the outcome). From `environment/Dockerfile` it
honours `WORKDIR` (the agent's working directory, default `/app`), `COPY`/
`ADD` of build-context files into it (copied into the workspace) and `ENV`;
every other step is listed in the outcome as not honoured. `/app` (the
workspace), `/tests` and `/logs/verifier` are the rollout's own, in a mount
namespace (`runners/mountns.py`).

**Kubernetes runner**: the pod runs the task's image, `docker_image`, or the
image built from `environment/`, named by `built_image` (see
runners/README.md#harbor-tasks for building and pushing it).
"""

from __future__ import annotations

import glob
import hashlib
import os
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..grading import GradeInput, GradingError, Reward
from ..services import Service
from ..tasks import DEFAULT_TIMEOUT_S, Task, TaskError, WorkspaceFile
from ..verifier import LOGS_VERIFIER, TESTS, Layout, VerifierStage
from .spec import Spec, Text, checked

READS = "Harbor task folders (task.toml + instruction.md)"
DEFAULT_WORKDIR = "/app"
VERIFIER_TIMEOUT_S = 600.0  # Harbor's VerifierConfig default
MEMORY_MB = 2048  # Harbor's EnvironmentConfig default
VERIFIER_ENV = ("PATH", "LANG", "LC_ALL", "TZ")  # what the verifier inherits from the runner's environment


def _is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file() and (path / "instruction.md").is_file()


def matches(path: Path) -> bool:
    """A Harbor task directory, or a folder of them."""
    return path.is_dir() and (_is_task_dir(path) or any(_is_task_dir(p) for p in path.iterdir() if p.is_dir()))


def load(path: Path) -> list[Task]:
    if _is_task_dir(path):
        return [load_task(path)]
    return [load_task(p) for p in sorted(path.iterdir()) if _is_task_dir(p)]


@dataclass(frozen=True)
class HarborTask(Task):
    """A Harbor task: the agent, then `tests/test.sh` in the same jail; scores from the reward it writes."""

    benchmark = "Harbor"
    pass_threshold = 1.0
    offline_ungradable = "its verifier (tests/test.sh) checks the environment the agent left"

    verifier_timeout_s: float = VERIFIER_TIMEOUT_S
    verifier_env: dict[str, str] = field(default_factory=dict)
    docker_image: str = ""
    cpus: int = 1
    allow_internet: bool = True
    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = field(default_factory=dict)  # Dockerfile ENV
    not_honoured: tuple[str, ...] = ()  # Dockerfile steps the local runner does not perform

    def score(self, run: GradeInput) -> dict[str, float]:
        verdict = run.verdict
        if verdict is None:  # a runner that ran no verifier stage: not the agent's fault
            raise GradingError(f"{self.id}: a Harbor task is graded by its verifier stage, which did not run")
        return verdict.rewards if verdict.rewards is not None else {"reward": 0.0}

    def reward(self, scores: dict[str, float]) -> Reward:
        value = scores["reward"] if "reward" in scores else sum(scores.values()) / len(scores) if scores else 0.0
        return Reward(reward=min(1.0, max(0.0, value)), graded={"verifier": {"weight": 1.0, "score": value}})

    def container_image(self, registry: str) -> str:
        return built_image(self, registry)

    def layout(self, rollout_dir: Path, workspace: Path, in_image: bool = False) -> Layout:
        """The workspace at the working directory (unless the image has it), a fresh /tests and /logs/verifier,
        the verifier after the agent."""
        for name in ("root", "tests", "logs-verifier", "logs-agent", "verifier-status"):
            (rollout_dir / name).mkdir()
        env = {k: os.environ[k] for k in VERIFIER_ENV if k in os.environ} | self.env | self.verifier_env
        stage = VerifierStage(argv=["bash", f"{TESTS}/test.sh"], timeout_s=self.verifier_timeout_s,
                              cwd=self.workdir, env=env, tests_source=str(self.path / "tests"),
                              tests_dir=str(rollout_dir / "tests"), logs_dir=str(rollout_dir / "logs-verifier"),
                              status_path=str(rollout_dir / "verifier-status"))
        binds = [("/logs/agent", str(rollout_dir / "logs-agent")),
                 (LOGS_VERIFIER, ""), (TESTS, "")]  # the verifier stage binds these after the agent
        if in_image:
            return Layout(root=str(rollout_dir / "root"), workdir=self.workdir, binds=binds, verifier=stage,
                          notes={"environment": "image"})
        notes = {"environment": "host", "dockerfile_not_honoured": list(self.not_honoured),
                 "docker_image_not_used": self.docker_image or None,
                 "network": "recorder only" + (" (the task allows the internet: not granted)"
                                               if self.allow_internet else "")}
        return Layout(root=str(rollout_dir / "root"), workdir=self.workdir, binds=[(self.workdir, str(workspace)),
                      *binds], verifier=stage, env=self.env, notes=notes, writable=[str(rollout_dir)])


class Lenient(BaseModel):
    """A table of Harbor's `TaskConfig`: its own (lax) coercions, but no key Harbor does not define."""

    model_config = ConfigDict(extra="forbid")


NetworkMode = Literal["public", "no-network", "allowlist"]


class Author(Lenient):
    name: str
    email: str | None = None


class PackageInfo(Lenient):
    name: str
    description: str = ""
    authors: list[Author] = []
    keywords: list[str] = []


class VerifierConfig(Lenient):
    timeout_sec: float = VERIFIER_TIMEOUT_S
    env: dict[str, str] = {}
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] = []


class AgentConfig(Lenient):
    timeout_sec: float | None = None
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] = []


class HealthcheckConfig(Lenient):
    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


class McpServerConfig(Lenient):
    name: str
    transport: str = "sse"
    url: str | None = None
    command: str | None = None
    args: list[str] = []


def size_mb(size: str) -> int:
    """Harbor's deprecated sizes: "2G", "512M", "1024K" (ValueError: not one)."""
    text = size.strip().upper()
    units = {"G": 1024, "M": 1, "K": 1 / 1024}
    try:
        return int(float(text[:-1]) * units[text[-1]])
    except (KeyError, IndexError, ValueError):  # no unit, an unknown one, or float() of what is not a number
        raise ValueError("a size like '2G' or '512M'") from None


def _a_size(text: str) -> str:
    size_mb(text)
    return text


Size = Annotated[str, AfterValidator(_a_size)]


class EnvironmentConfig(Lenient):
    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    cpus: int = 1
    memory_mb: int = MEMORY_MB
    storage_mb: int = 10240
    gpus: int = 0
    gpu_types: list[str] | None = None
    allow_internet: bool = True
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] = []
    mcp_servers: list[McpServerConfig] = []
    env: dict[str, str] = {}
    skills_dir: str | None = None
    healthcheck: HealthcheckConfig | None = None
    memory: Size | None = None  # deprecated: "2G"; wins over memory_mb, as in Harbor
    storage: Size | None = None  # deprecated: "10G"


class SolutionConfig(Lenient):
    env: dict[str, str] = {}


class ServiceSpec(Spec):
    """A `[[forgerl.services]]` table."""

    name: Text
    command: Annotated[list[str], Field(min_length=1)]
    port: Annotated[int, Field(gt=0, lt=65536)]
    health_path: str = "/"
    reset_path: str = ""
    state_paths: list[str] = []


class ForgerlExtension(Spec):
    services: list[ServiceSpec] = []


class TaskConfig(Lenient):
    """`task.toml` as Harbor's `harbor.models.task.config.TaskConfig` reads it, with forgerl's `[forgerl]` table."""

    version: str = "1.0"  # Harbor renames it schema_version
    schema_version: str = "1.1"
    task: PackageInfo | None = None
    metadata: dict[str, Any] = {}
    verifier: VerifierConfig = VerifierConfig()
    agent: AgentConfig = AgentConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    solution: SolutionConfig = SolutionConfig()
    source: str | None = None
    forgerl: ForgerlExtension = ForgerlExtension()


def _services(config: TaskConfig, task_dir: Path) -> tuple[Service, ...]:
    """The `[[forgerl.services]]` tables: processes run from the task folder on fixed loopback ports."""
    services = []
    for spec in config.forgerl.services:
        argv = list(spec.command)
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        services.append(Service(spec.name, tuple(argv), spec.port, cwd=str(task_dir.resolve()),
                                health_path=spec.health_path, reset_path=spec.reset_path,
                                state_paths=tuple(spec.state_paths)))
    return tuple(services)


def load_task(task_dir: Path) -> HarborTask:
    """One Harbor task directory, faithfully: the fields Harbor reads, with Harbor's defaults."""
    where = task_dir / "task.toml"
    try:
        config = checked(TaskConfig, tomllib.loads(where.read_text(encoding="utf-8")), where)
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{where}: {e}") from None
    environment = config.environment
    if not (task_dir / "tests" / "test.sh").is_file():
        raise TaskError(f"{task_dir}: no tests/test.sh (the verifier Harbor runs)")
    prompt = (task_dir / "instruction.md").read_text(encoding="utf-8").strip()
    if not prompt:
        raise TaskError(f"{task_dir}: instruction.md is empty")
    dockerfile = task_dir / "environment" / "Dockerfile"
    image = Dockerfile.read(dockerfile) if dockerfile.is_file() else Dockerfile()
    if not dockerfile.is_file() and not environment.docker_image:
        raise TaskError(f"{task_dir}: neither environment/Dockerfile nor [environment] docker_image")
    return HarborTask(
        id=task_dir.name, prompt=prompt, grader="", path=task_dir, files=image.files(task_dir / "environment"),
        timeout_s=config.agent.timeout_sec or DEFAULT_TIMEOUT_S, weights={"verifier": 1.0},
        grading_type="verifier", memory_mb=size_mb(environment.memory) if environment.memory else environment.memory_mb,
        verifier_timeout_s=config.verifier.timeout_sec, verifier_env=dict(config.verifier.env),
        docker_image=environment.docker_image or "", cpus=environment.cpus,
        allow_internet=environment.allow_internet, workdir=image.workdir, env=image.env,
        not_honoured=tuple(image.skipped), services=_services(config, task_dir))


@dataclass
class Dockerfile:
    """What the local runner can honour of a task's Dockerfile, and the steps it cannot."""

    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[str, str, bool]] = field(default_factory=list)  # (context source, dest, into a folder)
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        image = cls()
        for step in _steps(path.read_text(encoding="utf-8")):
            instruction, _, rest = step.partition(" ")
            handled = {"WORKDIR": image._workdir, "ENV": image._env, "COPY": image._copy, "ADD": image._copy}
            if not handled.get(instruction.upper(), lambda _: False)(rest.strip()):
                image.skipped.append(step[:300])
        return image

    def _workdir(self, rest: str) -> bool:
        self.workdir = str(PurePosixPath(self.workdir) / rest.strip('"'))
        return True

    def _env(self, rest: str) -> bool:
        words = shlex.split(rest)
        if words and "=" not in words[0]:  # ENV KEY value
            self.env[words[0]] = " ".join(words[1:])
        else:
            self.env.update(w.split("=", 1) for w in words if "=" in w)
        return True

    def _copy(self, rest: str) -> bool:
        """COPY/ADD of build-context files into the working directory; False (not honoured) for anything else."""
        words = shlex.split(rest)
        if not words or words[0].startswith("["):
            return False
        if any(w.startswith("--from") for w in words):
            return False
        words = [w for w in words if not w.startswith("--")]
        *sources, dest = words
        try:
            rel = PurePosixPath(os.path.normpath(PurePosixPath(self.workdir) / dest)).relative_to(self.workdir)
        except ValueError:
            return False
        if not sources or any("://" in s or ".." in PurePosixPath(s).parts for s in sources):
            return False
        into_folder = dest.endswith("/") or str(rel) == "." or len(sources) > 1
        self.copies += [(s, str(rel), into_folder) for s in sources]
        return True

    def files(self, context: Path) -> tuple[WorkspaceFile, ...]:
        """The honoured copies as workspace files (globs expanded; a folder's contents, as Docker copies them)."""
        out = []
        for source, dest, into_folder in self.copies:
            matches = sorted(glob.glob(str(context / source))) or [str(context / source)]
            for found in map(Path, matches):
                if found.is_dir():
                    out += [WorkspaceFile(p, str(PurePosixPath(dest) / p.name)) for p in sorted(found.iterdir())
                            if p.name != "Dockerfile"]
                else:
                    folder = into_folder or len(matches) > 1
                    out.append(WorkspaceFile(found, str(PurePosixPath(dest) / found.name) if folder else dest))
        return tuple(out)


def _steps(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    steps, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1].rstrip() + " "
            continue
        steps.append((current + stripped).strip())
        current = ""
    if current.strip():
        steps.append(current.strip())
    return steps


def built_image(task: HarborTask, registry: str) -> str:
    """The task's image: `docker_image`, else `REGISTRY/harbor-<id>:<hash of environment/>` (built from it)."""
    if task.docker_image:
        return task.docker_image
    if not registry:
        raise TaskError(f"{task.id}: no [environment] docker_image: name the registry its environment/ image is "
                        f"pushed to (forge-run --image-registry REG)")
    digest = hashlib.sha256()
    context = task.path / "environment"
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(context)).encode() + b"\0" + path.read_bytes())
    return f"{registry.rstrip('/')}/harbor-{task.id.lower()}:{digest.hexdigest()[:12]}"
