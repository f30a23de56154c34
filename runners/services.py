"""Services a task needs beside its harness (mock APIs, web apps), run inside the rollout's own network namespace.

PID 1 of the jail (`jail.py`) starts a task's services before the harness, in
the rollout's network namespace, so the fixed ports a task declares never
clash between parallel rollouts; it waits on each health check, POSTs the
reset endpoint where one is declared, and only then lets the harness start.
After the harness (and a verifier, if any) it GETs each service's state
endpoints (audit logs, app state) and writes what they answered to the
rollout's state file before the services are stopped:

    {"services": {NAME: {PATH: <the JSON it answered>}}, "state_errors": {NAME: {PATH: "why not"}},
     "agent_timed_out": true}   # the last two only when so

With services, PID 1 keeps the harness's clock (`JailSpec.harness_timeout_s`):
an agent past its time is stopped there, and the state is still read. The
harness (and a verifier) run in a PID namespace nested in PID 1's, so every
process the agent leaves is gone before the state is read, and none can
pass as a service.

A service that cannot start (exits, or misses its health check) ends the
rollout before the harness runs, with `{"error": "..."}` in the state file:
the runner reports it as an infra error, never a score. Each rollout gets
fresh service processes, so no state carries over between attempts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HEALTH_POLL_S = 0.1
STATE_TIMEOUT_S = 10.0
STOP_GRACE_S = 2.0
WALL_CLOCK_GRACE_S = 60.0  # beyond the agent's time, for PID 1 to stop it, read the state and stop the services
LOG_TAIL = 1500
# What a service inherits from the runner's environment; its own `env` comes on top.
SERVICE_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")


class ServiceError(OSError):
    """A service that did not come up: the rollout cannot run (an infra error)."""


@dataclass(frozen=True)
class Service:
    """One process a task needs running on a fixed loopback port while its harness runs."""

    name: str
    argv: tuple[str, ...]
    port: int
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/"
    health_method: str = "GET"  # healthy at any answer below 500
    ready_timeout_s: float = 10.0
    reset_path: str = ""  # POSTed once healthy
    state_paths: tuple[str, ...] = ()  # GET after the harness; their JSON answers go to the state file

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> Service:
        return cls(**{**raw, "argv": tuple(raw["argv"]), "state_paths": tuple(raw["state_paths"])})


def _request(method: str, url: str, timeout: float) -> tuple[int, bytes]:
    import urllib.error  # here, not above: every rollout's jail imports this module (forked from a warm
    import urllib.request  # server), and urllib with ssl was a third of that server's memory, copied per fork

    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through HTTP_PROXY
    req = urllib.request.Request(url, method=method, headers={"X-Health-Check": "1"},
                                 data=b"" if method == "POST" else None)
    try:
        with no_proxy.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _healthy(service: Service) -> bool:
    try:
        return _request(service.health_method, service.url(service.health_path), 2.0)[0] < 500
    except OSError:
        return False


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL:].strip()
    except OSError:
        return ""


class RunningServices:
    """A task's services, started in this process's network namespace (PID 1 of a rollout's jail)."""

    def __init__(self, services: list[Service], log_dir: Path):
        self.services = services
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        """Start all, then wait for each to be healthy and reset it; ServiceError (all stopped) if one is not."""
        try:
            for service in self.services:
                self.procs.append(self._spawn(service))
            for service, proc in zip(self.services, self.procs):
                self._wait_healthy(service, proc)
                if service.reset_path:
                    _request("POST", service.url(service.reset_path), STATE_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def _log(self, service: Service) -> Path:
        return self.log_dir / f"service-{service.name}.log"

    def _spawn(self, service: Service) -> subprocess.Popen:
        env = {k: os.environ[k] for k in SERVICE_ENV if k in os.environ}
        env |= {"PYTHONDONTWRITEBYTECODE": "1", **service.env}
        with open(self._log(service), "wb") as log:
            try:
                # A session of its own: a signal for the harness's process group never reaches it early.
                return subprocess.Popen(list(service.argv), cwd=service.cwd or None, env=env,
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
            except OSError as e:
                raise ServiceError(f"service {service.name!r} cannot start {service.argv[0]}: {e}") from None

    def _wait_healthy(self, service: Service, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + service.ready_timeout_s
        while not _healthy(service):
            if proc.poll() is not None:
                raise ServiceError(f"service {service.name!r} exited with status {proc.returncode} before its "
                                   f"health check answered: {_tail(self._log(service))}")
            if time.monotonic() > deadline:
                raise ServiceError(f"service {service.name!r} did not answer {service.health_method} "
                                   f"{service.url(service.health_path)} within {service.ready_timeout_s:.0f} s: "
                                   f"{_tail(self._log(service))}")
            time.sleep(HEALTH_POLL_S)

    def state(self) -> dict[str, dict]:
        """Each service's state endpoints as they answer now: {"services": {name: {path: JSON}}} for those that
        answered JSON, and {"state_errors": {name: {path: why}}} for those that did not."""
        answers: dict[str, dict] = {s.name: {} for s in self.services}
        errors: dict[str, dict] = {}
        for service in self.services:
            for path in service.state_paths:
                try:
                    status, body = _request("GET", service.url(path), STATE_TIMEOUT_S)
                    if status >= 400:
                        raise ValueError(f"HTTP {status}")
                    answers[service.name][path] = json.loads(body)
                except (OSError, ValueError) as e:
                    errors.setdefault(service.name, {})[path] = f"{type(e).__name__}: {e}"
        return {"services": answers, **({"state_errors": errors} if errors else {})}

    def stop(self) -> None:
        for proc in self.procs:
            _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = []


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


class ServiceStage:
    """The jail's services stage, around the harness: start, and afterwards collect state and stop.

    The state file is opened at once, so it can still be written after a
    mount namespace has hidden the rollout's temp dir.
    """

    def __init__(self, raw: list[dict], state_file: str):
        self.state = open(state_file, "w")  # noqa: SIM115 - held across the harness run, closed in finish()
        self.running = RunningServices([Service.from_json(s) for s in raw], Path(state_file).parent)

    def start(self) -> bool:
        """Whether every service came up (if not, the reason is in the state file and none is left running)."""
        try:
            self.running.start()
        except ServiceError as e:
            self._write({"error": str(e)})
            return False
        return True

    def finish(self, agent_timed_out: bool = False) -> None:
        try:
            self._write({**self.running.state(), **({"agent_timed_out": True} if agent_timed_out else {})})
        finally:
            self.running.stop()

    def _write(self, data: dict) -> None:
        with self.state:
            json.dump(data, self.state, ensure_ascii=False)


def service_notes(state: dict) -> dict:
    """What an outcome's `extra` says about the services: the state endpoints read, and those that failed."""
    notes = {"services_read": {name: sorted(answers) for name, answers in state.get("services", {}).items()}}
    return notes | ({"services_unread": state["state_errors"]} if "state_errors" in state else {}) if state else {}


def read_state(path: Path) -> dict:
    """The rollout's state file: {"services": ..., "state_errors": ...}, {"error": ...}, or {} (no services, or
    none written: the jail was killed first)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    return json.loads(text) if text else {}
