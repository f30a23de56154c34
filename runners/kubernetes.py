"""`KubernetesRunner`: one Pod per rollout, with the official `kubernetes` client.

Each rollout becomes a Pod made from `pod-template.yaml` (package data beside
this module, or your own template): the runner sets its name, labels, image,
the FORGE_* environment (task, session, the recorder's URL), resources from
the task's limits and an `activeDeadlineSeconds`. A task with services or a
verifier gets `CAP_SYS_ADMIN` for the jail's namespaces. The judge's and the
simulated user's keys never enter the rollout's container, where the harness
runs as the same user as the pod entry: the template's `model-keys` sidecar
holds them (from a Secret it maps) and forwards the pod's calls to those
APIs (`model_keys.py`); the rollout's container gets its loopback URLs.
With a `recorder_secret` (forge-run's default: the recorder holds the
model-API keys) the runner registers each rollout with the recorder over its
authenticated control endpoints and puts only the rollout's token in the
harness's key variable, dropping every model-key variable the template maps;
it revokes the token once the pod is done. The pod presents the same token
at its session's flush barrier, and holds no secret. The pod runs `python -m
forgerl.runners.pod`, which runs the rollout as the local runner does
(`attempt.run_attempt`: workspace, services, harness, verifier, grading) and
reports its scores and notes in the termination message. The runner watches the pod to the end,
reads that message and the logs, deletes the pod on every path, and writes the
outcome.

Infra failures -- the API server refusing or unreachable, a pod that cannot
start (image pull, config), a pod that fails or is evicted without a result,
a pod that does not finish by its deadline -- are retried (`retries` times,
each as a new pod with a new session) and then recorded as `infra_error`,
never scored. A harness that fails or times out inside a healthy pod is a
graded outcome and keeps its reward. A pod that reports a recorder failure
stops the run (`RecorderFailure`, as with the local runner).
"""

from __future__ import annotations

import copy
import json
import re
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import urllib3
import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from forgerl.errors import UserError
from forgerl.harnesses import Harness, Key
from forgerl.recorder.credentials import DEFAULT_KEY_ENV
from forgerl.recorder.writer_process import RecorderFailure

from .grading import Judge
from .model_keys import CONTAINER as MODEL_KEYS, DEFAULT_PORT, PORT_VARIABLE, ROUTES, loopback_url
from .pod import NOTES_CUT, RECORDER_FAILURE, RESULT_KEYS, logged_result
from .rollout import BatchRunner, InfraError, Outcome, Rollout, now
from .serve import rollout_keys
from .simulated_user import UserModel

TEMPLATE = resources.files(__package__) / "pod-template.yaml"  # package data: read where forgerl is installed
DEADLINE_GRACE_S = 300  # pod start-up, workspace, grading: on top of the task's own timeout
WATCH_POLL_S = 5
RETRY_BACKOFF_S = 1.0
LOG_TAIL_BYTES = 8000
STUCK_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "CrashLoopBackOff")
LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")
FORGERL_BUNDLE = "/opt/forgerl"  # in the rollout image: a self-contained forgerl (deploy/README.md)
FORGERL_MOUNT = "/forgerl"  # where a task's own image finds it


def label(value: str) -> str:
    """A valid label value (<= 63 chars, alphanumeric ends)."""
    return LABEL_VALUE.sub("-", value)[:63].strip("-_.") or "x"


def load_template(path: Path | Traversable = TEMPLATE) -> dict:
    try:
        template = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"pod template {path}: {e}".splitlines()[0]) from None
    if not isinstance(template, dict) or template.get("kind") != "Pod" or not template.get("spec", {}).get("containers"):
        raise ValueError(f"pod template {path}: expected a Pod manifest with at least one container")
    return template


def api_client(host: str = "", kubeconfig: str = "") -> client.ApiClient:
    """A client for `host` (an API server URL), else kubeconfig / in-cluster configuration."""
    from kubernetes import config
    if host:
        configuration = client.Configuration()
        configuration.host = host
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig or None)
    return client.ApiClient()


@dataclass
class PodReport:
    phase: str
    message: str | None
    reason: str | None
    exit_code: int | None


@dataclass
class KubernetesRunner(BatchRunner):
    harness: Harness
    recorder_url: str  # as reachable from pods (the recorder Service)
    api: client.ApiClient
    namespace: str = "forgerl"
    template: dict = field(default_factory=load_template)
    image: str = ""
    pod_tasks: str = "/tasks"  # FORGE_TASKS as mounted in pods
    pod_dataset: str = "/data"  # FORGE_DATASET as mounted in pods
    parallel: int = 1
    retries: int = 2
    model: str = ""
    timeout_s: float | None = None
    deadline_grace_s: float = DEADLINE_GRACE_S
    name: str = "kubernetes"
    image_registry: str = ""  # where images built from Harbor tasks' environment/ are pushed
    judge: Judge | None = None  # its URL goes to the pod's model-keys sidecar, whose key comes from a Secret
    user: UserModel | None = None  # the simulated user, played from the pods through the same sidecar
    recorder_secret: str = ""  # the recorder holds the keys: each pod's harness gets a token (`rollout_keys`)

    retry_backoff_s: float = RETRY_BACKOFF_S

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        check_key_holder(self.template, needed=bool(self.judge or self.user))

    # one pod -----------------------------------------------------------

    def pod_manifest(self, rollout: Rollout, session: str, keys: dict[str, str] | None = None) -> dict:
        """The pod for one rollout; `keys`: the harness's token in its key variable (`rollout_keys`), which
        replaces every model-API key variable the template sets."""
        task = rollout.task
        timeout = self.timeout_s or task.timeout_s
        pod = copy.deepcopy(self.template)
        meta = pod.setdefault("metadata", {})
        meta["name"] = label(f"forgerl-{session}").lower().replace("_", "-").replace(".", "-")
        meta["namespace"] = self.namespace
        meta["labels"] = {**meta.get("labels", {}), "forgerl.dev/session": label(session),
                          "forgerl.dev/task": label(task.id), "forgerl.dev/attempt": str(rollout.attempt),
                          "forgerl.dev/harness": label(self.harness.name)}
        spec = pod["spec"]
        spec["restartPolicy"] = "Never"
        spec["activeDeadlineSeconds"] = int(timeout + self.deadline_grace_s)
        container = spec["containers"][0]
        if self.image:
            container["image"] = self.image
        forgerl_image = container["image"]
        task_image = task.container_image(self.image_registry)
        if task_image:
            in_task_image(spec, container, task_image)
        forge_env = {"FORGE_TASKS": self.pod_tasks, "FORGE_TASK_ID": task.id, "FORGE_ATTEMPT": str(rollout.attempt),
                     "FORGE_HARNESS": self.harness.name, "FORGE_SESSION_ID": session,
                     "FORGE_RECORDER_URL": self.recorder_url, "FORGE_DATASET": self.pod_dataset,
                     "FORGE_MODEL": self.model, "FORGE_TIMEOUT_S": str(timeout)}
        forge_env |= self._model_apis(spec, forgerl_image, bool(task.persona))
        if keys:
            forge_env |= keys
        if task.services:  # the jail's own namespaces inside the pod
            allow_namespaces(container)
        dropped = {*forge_env, *(model_key_variables(self.harness) if keys else ())}
        env = [e for e in container.get("env", []) if e.get("name") not in dropped]
        container["env"] = env + [{"name": k, "value": v} for k, v in forge_env.items()]
        limits = {"cpu": str(max(1, task.cpu_s // max(1, int(timeout)))), "memory": f"{task.memory_mb}Mi"}
        container["resources"] = {"limits": limits, "requests": dict(limits)}
        return pod

    def _model_apis(self, spec: dict, image: str, persona: bool) -> dict[str, str]:
        """The judge's and the user model's URLs and models for the rollout's container: loopback URLs of the
        `model-keys` sidecar, which gets the real ones (and holds the keys) and runs in forgerl's image. A rollout
        with neither has no sidecar."""
        apis = {"judge": (self.judge.url, self.judge.model)} if self.judge else {}
        if self.user and persona:
            apis["user"] = (self.user.url, self.user.model)
        holder = next((c for c in spec.get("initContainers", []) if c.get("name") == MODEL_KEYS), None)
        if holder is None:
            return {}
        if not apis:
            spec["initContainers"].remove(holder)
            if not spec["initContainers"]:
                del spec["initContainers"]
            return {}
        holder["image"] = image
        env = {e["name"]: e for e in holder.get("env") or []}
        port = int(env.get(PORT_VARIABLE, {}).get("value") or DEFAULT_PORT)
        env |= {ROUTES[route][0]: {"name": ROUTES[route][0], "value": url} for route, (url, _) in apis.items()}
        holder["env"] = list(env.values())
        names = {"judge": "FORGE_JUDGE_MODEL", "user": "FORGE_USER_MODEL_NAME"}
        return {k: v for route, (_, model) in apis.items()
                for k, v in ((ROUTES[route][0], loopback_url(route, port)), (names[route], model))}

    def attempt(self, rollout: Rollout, session: str) -> Outcome:
        t_start = now()
        deadline_s = (self.timeout_s or rollout.task.timeout_s) + self.deadline_grace_s
        with rollout_keys(self.harness, self.recorder_url, self.recorder_secret, session, deadline_s) as keys:
            pod = self.pod_manifest(rollout, session, keys)
            name = pod["metadata"]["name"]
            try:
                self.core.create_namespaced_pod(self.namespace, pod)
            except (ApiException, urllib3.exceptions.HTTPError) as e:
                self._delete(name, quiet=True)  # a refused or timed-out create may still have made the pod
                raise InfraError(f"creating pod {name}: {_api_error(e)}") from None
            try:
                report = self._wait(name, pod["spec"]["activeDeadlineSeconds"])
                logs = self._logs(name)
            finally:
                self._delete(name)
        return self._outcome(rollout, session, t_start, report, logs)

    def _wait(self, name: str, deadline_s: float) -> PodReport:
        """Watch the pod until it terminates; InfraError if it cannot start or outlives its deadline."""
        deadline = time.monotonic() + deadline_s
        while (left := deadline - time.monotonic()) > 0:
            w = watch.Watch()
            try:
                for event in w.stream(self.core.list_namespaced_pod, self.namespace,
                                      field_selector=f"metadata.name={name}",
                                      _request_timeout=min(left, WATCH_POLL_S)):
                    pod = event["object"]
                    if pod.metadata.name != name:  # servers that ignore the field selector
                        continue
                    if event["type"] == "DELETED":
                        raise InfraError(f"pod {name} was deleted before it finished")
                    report = _report(pod)
                    if report is not None:
                        return report
                    if deadline - time.monotonic() <= 0:
                        break
            except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError, TimeoutError):
                continue  # no event within the poll interval: check the deadline, watch again
            except (ApiException, urllib3.exceptions.HTTPError) as e:
                raise InfraError(f"watching pod {name}: {_api_error(e)}") from None
            finally:
                w.stop()
        raise InfraError(f"pod {name} did not finish within {deadline_s:.0f} s")

    def _logs(self, name: str) -> str | None:
        try:
            return self.core.read_namespaced_pod_log(name, self.namespace, _request_timeout=WATCH_POLL_S)
        except (ApiException, urllib3.exceptions.HTTPError):
            return None  # logs are a nicety; the result is in the termination message

    def _delete(self, name: str, quiet: bool = False) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except (ApiException, urllib3.exceptions.HTTPError) as e:
            if not quiet and getattr(e, "status", None) != 404:
                print(f"forge-run: could not delete pod {name} (the janitor will): {_api_error(e)}",
                      file=sys.stderr, flush=True)

    def _outcome(self, rollout: Rollout, session: str, t_start, report: PodReport, logs: str | None) -> Outcome:
        try:
            result = json.loads(report.message or "")
        except json.JSONDecodeError:
            result = None
        if not isinstance(result, dict) or result.get("session") != session:
            raise InfraError(f"pod {report.phase} without a result (reason {report.reason}, "
                             f"exit code {report.exit_code})")
        if result["status"] == RECORDER_FAILURE:
            raise RecorderFailure(result.get("error") or "the recorder failed")
        if result["status"] != "graded":
            raise InfraError(result.get("error") or "the pod reported an infra error")
        if result.get(NOTES_CUT):  # the notes did not fit the termination message: the log line has them all
            result = logged_result(logs, session) or result
        extra = {**{k: v for k, v in result.items() if k not in (*RESULT_KEYS, NOTES_CUT)},
                 "pod_log_tail": (logs or "")[-LOG_TAIL_BYTES:] or None}
        return Outcome.graded(rollout, session, self.harness.name, self.name, t_start, result["scores"],
                              bool(result.get("timed_out")), result.get("returncode"), model=self.model, extra=extra)


def check_key_holder(template: dict, needed: bool) -> None:
    """UserError for a template that maps the judge's or the user model's key into the rollout's container (whose
    harness could read it), or that has no `model-keys` sidecar to hold them when a run needs one."""
    keys = {key for _, key in ROUTES.values()}
    for container in template["spec"]["containers"]:
        mapped = sorted(keys & {e.get("name") for e in container.get("env") or []})
        if mapped:
            raise UserError(f"the pod template maps {', '.join(mapped)} into container {container.get('name')!r}, "
                            f"where the harness could read it: map it in the {MODEL_KEYS!r} init container instead")
    if needed and not any(c.get("name") == MODEL_KEYS for c in template["spec"].get("initContainers") or []):
        raise UserError(f"--judge and --user-model need the pod template's {MODEL_KEYS!r} init container (the "
                        "keys' holder; see runners/pod-template.yaml)")


def model_key_variables(harness: Harness) -> set[str]:
    """The variables a model-API key can sit in: every API's default, and the harness's own."""
    return {*DEFAULT_KEY_ENV.values(), *([harness.key.env] if isinstance(harness.key, Key) else [])}


def in_task_image(spec: dict, container: dict, image: str) -> None:
    """Run the pod entry in the task's own image (a Harbor task's): an init container copies the rollout image's
    self-contained forgerl (`FORGERL_BUNDLE`: its own Python, forgerl, the harness CLIs) into a volume the task's
    container runs it from; the jail's namespaces (a fresh /tests and /logs/verifier) need `allow_namespaces`."""
    spec.setdefault("initContainers", []).append({
        "name": "forgerl", "image": container["image"], "command": ["cp", "-a", f"{FORGERL_BUNDLE}/.", FORGERL_MOUNT],
        "volumeMounts": [{"name": "forgerl", "mountPath": FORGERL_MOUNT}]})
    spec.setdefault("volumes", []).append({"name": "forgerl", "emptyDir": {}})
    container["image"] = image
    container["command"] = [f"{FORGERL_MOUNT}/bin/python3", "-m", "forgerl.runners.pod"]
    container.setdefault("volumeMounts", []).append({"name": "forgerl", "mountPath": FORGERL_MOUNT, "readOnly": True})
    allow_namespaces(container)


def allow_namespaces(container: dict) -> None:
    """Let the pod's jail make its namespaces (a Harbor task's mounts and verifier, a task's services): the
    container gets CAP_SYS_ADMIN (a runtime's AppArmor profile may also have to allow `mount`)."""
    capabilities = container.setdefault("securityContext", {}).setdefault("capabilities", {})
    capabilities["add"] = sorted({*capabilities.get("add", []), "SYS_ADMIN"})


def _report(pod: client.V1Pod) -> PodReport | None:
    """A terminated pod's report; None while it is still pending or running; InfraError if it is stuck."""
    status = pod.status
    phase = status.phase if status else None
    states = [cs.state for cs in (status.container_statuses or [])] if status else []
    for state in states:
        if state and state.waiting and state.waiting.reason in STUCK_REASONS:
            raise InfraError(f"pod cannot start: {state.waiting.reason}: {state.waiting.message or ''}".rstrip(": "))
    if phase not in ("Succeeded", "Failed"):
        return None
    terminated = next((s.terminated for s in states if s and s.terminated), None)
    return PodReport(phase=phase, message=terminated.message if terminated else None,
                     reason=(terminated.reason if terminated else None) or status.reason,
                     exit_code=terminated.exit_code if terminated else None)


def _api_error(e: Exception) -> str:
    if isinstance(e, ApiException):
        try:
            message = json.loads(e.body or "{}").get("message")
        except (json.JSONDecodeError, AttributeError):
            message = None
        return f"HTTP {e.status} {e.reason}" + (f": {message[:200]}" if message else "")
    return f"{type(e).__name__}: {e}"
