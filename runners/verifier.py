"""A verifier run in the rollout's own jail after the agent, with its own timeout, and the reward it writes.

Harbor-style tasks grade by running a script (`tests/test.sh`) where the agent
ran, which writes `/logs/verifier/reward.txt` (one number) or `reward.json`
(`{name: number}`). Harbor itself mounts `/logs/verifier` for the agent too,
so an agent can write the reward before the verifier does and, if the
verifier then writes none, that reward stands (reward preemption). Here:

* the tests are read before the agent starts and written to a fresh `/tests`
  only after it (the agent cannot see or change them);
* when the agent exits or runs out of time, PID 1 of the rollout's PID
  namespace kills every other process in it, so nothing of the agent's is
  left to write later (a task's services live in the namespace above it,
  `jail._with_services`, and stay up for the verifier);
* `/logs/verifier` is then a new empty directory of this rollout's,
  bound over whatever the agent saw there (`fresh_dir`: a planted file,
  directory or symlink is removed first), and the verifier runs;
* the stage's status is written last, with a nonce only the runner and
  PID 1 know, so a status file planted by the agent is not taken.

`run_stage` runs in PID 1 (`jail.py`); `Layout` is what the runner asks
for, `read_verdict` what it reads back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .mountns import bind, fresh_dir

LOGS_VERIFIER = "/logs/verifier"
TESTS = "/tests"
STAGE_GRACE_S = 30.0  # the runner's wall clock for the jail: agent + verifier + this
OUTPUT_TAIL = 2000  # characters of the verifier's output kept in the outcome


@dataclass
class VerifierStage:
    """What PID 1 runs after the agent (sent through the fork server as JSON)."""

    argv: list[str]
    timeout_s: float
    cwd: str  # inside the namespace
    env: dict[str, str]
    tests_source: str  # the task's tests folder, read before the agent starts
    tests_dir: str  # this rollout's folder bound at /tests
    logs_dir: str  # this rollout's folder bound at /logs/verifier
    status_path: str
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class Layout:
    """A rollout's fixed-path filesystem (`mountns.enter_root`) and its post-agent verifier, if any."""

    root: str  # an empty folder of the rollout's: the new root's tmpfs is mounted here
    workdir: str  # the agent's working directory inside (the rollout's workspace is bound there)
    binds: list[tuple[str, str]]  # (target inside, source folder of this rollout)
    verifier: VerifierStage | None = None
    env: dict[str, str] = field(default_factory=dict)  # what the task's environment sets (Dockerfile ENV)
    notes: dict = field(default_factory=dict)  # for the outcome's `extra`: what was and was not honoured
    writable: list[str] | None = None  # set: the machine's other folders are read-only (`mountns.enter_root`)
    home: str = ""  # set: the rollout's HOME folder is bound here, and is the harness's HOME (a fixed path)

    def wall_clock_s(self, agent_s: float) -> float:
        """The runner's limit for the whole jail: the agent's time, the verifier's, and a grace."""
        return agent_s + (self.verifier.timeout_s + STAGE_GRACE_S if self.verifier else 0.0)

    def verdict(self) -> Verdict | None:
        """What the verifier stage reported, once the jail is gone (OSError: it never did)."""
        return read_verdict(self.verifier) if self.verifier else None

    def outcome_notes(self, verdict: Verdict | None) -> dict:
        """What the outcome's `extra` records of this layout: its notes, and how the verifier ended."""
        if verdict is None:
            return dict(self.notes)
        return {**self.notes, "verifier": {"returncode": verdict.verifier_returncode,
                                           "timed_out": verdict.verifier_timed_out, "error": verdict.error,
                                           "output_tail": verdict.output_tail}}

    def jail_fields(self) -> dict:
        """The JailSpec fields this layout sets."""
        return {"root": self.root, "binds": [list(b) for b in self.binds], "writable": self.writable,
                "verifier": asdict(self.verifier) if self.verifier else None}


@dataclass(frozen=True)
class Verdict:
    """What the verifier stage left: the rewards it wrote, and how the agent and the verifier ended."""

    rewards: dict[str, float] | None  # None: the verifier wrote no (usable) reward
    agent_timed_out: bool
    verifier_returncode: int | None
    verifier_timed_out: bool
    error: str | None = None  # why there is no reward
    output_tail: str | None = None  # the end of what the verifier printed (`test-stdout.txt`, as Harbor names it)


# --------------------------------------------------------------------- in PID 1 of the jail


def snapshot(folder: str) -> list[tuple[str, int, bytes]]:
    """Every file under `folder` (relative path, mode, bytes): read before the agent can touch them."""
    files = []
    for here, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(here, name)
            with open(path, "rb") as f:
                files.append((os.path.relpath(path, folder), os.stat(path).st_mode & 0o777, f.read()))
    return files


def _restore(files: list[tuple[str, int, bytes]], folder: str) -> None:
    for rel, mode, data in files:
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)


def kill_namespace() -> None:
    """From PID 1 of a PID namespace: kill every other process in it, and reap them."""
    if os.getpid() != 1:  # kill(-1) anywhere else would reach every process this user may signal
        raise RuntimeError("kill_namespace called outside the init of a PID namespace")
    try:
        os.kill(-1, signal.SIGKILL)  # in a PID namespace's init: everyone in it but itself
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def run_stage(stage: VerifierStage, tests: list[tuple[str, int, bytes]], agent_timed_out: bool) -> None:
    """After the agent: kill what is left of it, fresh /logs/verifier and /tests, run the verifier, say how."""
    kill_namespace()
    for folder, target in ((stage.logs_dir, LOGS_VERIFIER), (stage.tests_dir, TESTS)):
        fresh_dir(folder)
        os.chmod(folder, 0o777)
        bind(folder, target)
    _restore(tests, TESTS)
    start, returncode, timed_out = time.monotonic(), None, False
    with open(os.path.join(LOGS_VERIFIER, "test-stdout.txt"), "wb") as out:
        try:
            child = subprocess.Popen(stage.argv, cwd=stage.cwd, env=stage.env, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT)
            try:
                returncode = child.wait(stage.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
        except OSError as e:
            out.write(f"forgerl: cannot start the verifier: {e}\n".encode())
    kill_namespace()  # the verifier's own left-overs (and a timed-out verifier)
    status = {"nonce": stage.nonce, "agent_timed_out": agent_timed_out, "verifier_returncode": returncode,
              "verifier_timed_out": timed_out, "verifier_seconds": round(time.monotonic() - start, 3)}
    fresh_dir(stage.status_path)  # whatever the agent planted at this path goes
    with open(os.path.join(stage.status_path, "status.json"), "w") as f:
        json.dump(status, f)


# --------------------------------------------------------------------- the runner's side


class NoReward(Exception):
    """The verifier left no usable reward; the message says why (the outcome's error)."""


def parse_rewards(logs_dir: Path) -> dict[str, float]:
    """Harbor's rule: `reward.json` (its numeric keys; `reward.txt` adds `reward` if the JSON has none), else
    `reward.txt` as `{"reward": x}`. NoReward if neither holds a reward."""
    json_path, text_path = logs_dir / "reward.json", logs_dir / "reward.txt"
    rewards: dict[str, float] = {}
    if json_path.is_file():
        try:
            parsed = json.loads(json_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise NoReward("reward.json is not JSON") from None
        if not isinstance(parsed, dict):
            raise NoReward("reward.json is not an object")
        rewards = {str(k): float(v) for k, v in parsed.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if "reward" not in rewards and text_path.is_file():
        try:
            rewards["reward"] = float(text_path.read_text().strip())
        except ValueError:  # float() of what the verifier wrote
            if not rewards:
                raise NoReward(f"reward.txt holds {text_path.read_text()[:40]!r}, not a number") from None
    if not rewards:
        raise NoReward("the verifier wrote no reward (/logs/verifier/reward.txt or reward.json)")
    return rewards


def read_verdict(stage: VerifierStage) -> Verdict:
    """The stage's result, once the jail has exited; OSError if the stage never reported (its own failure)."""
    try:
        status = json.loads((Path(stage.status_path) / "status.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        status = {}
    if status.get("nonce") != stage.nonce:
        raise OSError("the verifier stage did not report (the jail died before or during it)")
    timed_out = status["verifier_timed_out"]
    rewards, error = None, None
    if timed_out:
        error = f"the verifier ran past its {stage.timeout_s:.0f} s"
    else:
        try:
            rewards = parse_rewards(Path(stage.logs_dir))
        except NoReward as e:
            error = str(e)
    try:
        output = (Path(stage.logs_dir) / "test-stdout.txt").read_text(errors="replace")[-OUTPUT_TAIL:] or None
    except OSError:
        output = None
    return Verdict(rewards, status["agent_timed_out"], status["verifier_returncode"], timed_out, error, output)
