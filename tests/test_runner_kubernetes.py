"""KubernetesRunner against kmock's API emulator over real HTTP (the official client, never patched).

A fake kubelet (tests/runner_fixtures.py) watches pods through the same API
and runs each pod's real entry point (`python -m forgerl.runners.pod`) as a
local process, so the pods really run the harness and grade() in the pod.
Covered: create/watch/delete, grading identical to the local runner, a pod
that fails without a result, an image that cannot be pulled, a pod that never
finishes, an agent timeout inside a healthy pod, and the API server refusing
requests or being unreachable.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from app_thread import AppThread  # examples/, on the path (conftest)
from forgerl.errors import UserError
from forgerl.recorder.proxy import BackgroundRecorder, RecorderConfig, free_port
from forgerl.runners.grading import Judge
from forgerl.harnesses import get_harness
from forgerl.runners import model_keys
from forgerl.runners.kubernetes import KubernetesRunner, api_client, load_template
from forgerl.runners.rollout import Rollout
from forgerl.runners.loader import find_task, load_tasks
from forgerl.schema.store import read_table
from forgerl.schema.writer import DatasetWriter

from runner_fixtures import (BENCH, NOVEL_SCORE, NOVEL_TASK, SPARQL_SCORE, SPARQL_TASK, FakeKubelet, KubeAPI,
                             processes_in, task_script)
from scripted_upstream import ScriptedUpstream
from test_claweval import CLAWEVAL, HARNESS_MODELS, JUDGE_MODEL, Model

NS = "forgerl"
FORGE_RUN = str(Path(sys.executable).with_name("forge-run"))


@pytest.fixture
def cluster(tmp_path):
    api = KubeAPI().start()
    kubelet = FakeKubelet(api.url, NS, tmp_path / "node", secrets={"forgerl-keys": {"judge": JUDGE_SECRET}}).start(api)
    yield api
    deadline = time.monotonic() + 15  # deleted pods get the kubelet's grace period
    while processes_in(tmp_path / "node") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_in(tmp_path / "node") == [], "a rollout pod left processes behind"
    kubelet.stop()
    api.stop()


@pytest.fixture
def recorded(scripted, tmp_path):
    up = scripted(task_script)
    with BackgroundRecorder(RecorderConfig(out=tmp_path / "data", upstream_anthropic=up.url,
                                           upstream_openai=up.url)) as rec:
        yield rec


def runner(api_url: str, rec, tmp_path, image: str = "forgerl/rollout:test", **kw) -> KubernetesRunner:
    return KubernetesRunner(get_harness(kw.pop("harness", "claude-code")), rec.config.url, api_client(api_url),
                            namespace=NS, image=image, pod_tasks=str(BENCH), pod_dataset=str(tmp_path / "data"), **kw)


def run_one(r: KubernetesRunner, tmp_path, task_id: str = NOVEL_TASK):
    with DatasetWriter(tmp_path / "data", source="runner") as writer:
        [outcome] = r.run([Rollout(find_task(BENCH, task_id), 0)], writer)
    return outcome


@pytest.mark.slow
def test_forge_run_on_kubernetes_grades_in_pods_like_the_local_runner(cluster, scripted, tmp_path):
    up = scripted(task_script)
    out = tmp_path / "data"
    r = subprocess.run([FORGE_RUN, str(BENCH), "--task", SPARQL_TASK, "--task", NOVEL_TASK, "--harness", "claude-code",
                        "--upstream", up.url, "--out", str(out), "--parallel", "2", "--runner", "kubernetes",
                        "--kube-api", cluster.url, "--namespace", NS, "--image", "forgerl/rollout:test",
                        "--pod-tasks", str(BENCH), "--pod-dataset", str(out), "--judge", f"{up.url}/v1",
                        "--judge-model", "scripted-judge"],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {x["task_id"]: x for x in read_table(out, "outcomes").to_pylist()}
    assert rows[SPARQL_TASK]["reward"] == pytest.approx(SPARQL_SCORE)  # the same rewards the local runner gets
    assert rows[NOVEL_TASK]["reward"] == pytest.approx(NOVEL_SCORE)
    assert {x["runner"] for x in rows.values()} == {"kubernetes"} and {x["status"] for x in rows.values()} == {"failed"}
    assert "FORGE_RESULT" in json.loads(rows[NOVEL_TASK]["extra"])["pod_log_tail"]

    pods = cluster.pods()
    assert len(pods) == 2 and all(p["deleted"] for p in pods), "every rollout pod is deleted"
    manifest = next(p["manifest"] for p in pods if p["manifest"]["metadata"]["labels"]["forgerl.dev/session"]
                    == rows[SPARQL_TASK]["session_id"])
    labels = manifest["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "forgerl-rollout" and labels["forgerl.dev/task"] == SPARQL_TASK[:63]
    spec = manifest["spec"]
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 1800 + 300
    container = spec["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["FORGE_SESSION_ID"] == rows[SPARQL_TASK]["session_id"] and env["FORGE_TASK_ID"] == SPARQL_TASK
    assert env["FORGE_RECORDER_URL"].startswith("http://127.0.0.1:") and env["FORGE_HARNESS"] == "claude-code"
    assert (env["FORGE_JUDGE_URL"], env["FORGE_JUDGE_MODEL"]) == ("http://127.0.0.1:8791/judge", "scripted-judge")
    [holder] = spec["initContainers"]  # the judge's real URL (and key, here none) are the sidecar's
    assert {e["name"]: e["value"] for e in holder["env"]} == {"FORGE_JUDGE_URL": f"{up.url}/v1"}
    assert container["resources"]["limits"]["memory"] == "4096Mi" and container["image"] == "forgerl/rollout:test"
    calls = read_table(out, "calls", ["session_id"]).column("session_id").to_pylist()
    assert rows[SPARQL_TASK]["session_id"] in calls


def test_failing_pod_is_retried_then_infra_error_never_scored(cluster, recorded, tmp_path):
    outcome = run_one(runner(cluster.url, recorded, tmp_path, image="forgerl/rollout:crash", retries=1), tmp_path)
    assert outcome.status == "infra_error" and outcome.extra["tries"] == 2
    assert "pod Failed without a result" in outcome.error and "exit code 139" in outcome.error
    row = outcome.row()
    assert row["reward"] is None and row["scores"] is None
    pods = cluster.pods()
    assert len(pods) == 2 and all(p["deleted"] for p in pods)


def test_image_that_cannot_be_pulled_fails_fast(cluster, recorded, tmp_path):
    outcome = run_one(runner(cluster.url, recorded, tmp_path, image="forgerl/rollout:missing", retries=0), tmp_path)
    assert outcome.status == "infra_error" and "ImagePullBackOff" in outcome.error
    assert all(p["deleted"] for p in cluster.pods())


def test_pod_that_never_finishes_hits_its_deadline(cluster, recorded, tmp_path):
    r = runner(cluster.url, recorded, tmp_path, image="forgerl/rollout:pending", retries=1, timeout_s=1,
               deadline_grace_s=1)
    outcome = run_one(r, tmp_path)
    assert outcome.status == "infra_error" and outcome.error.count("did not finish within 2 s") == 2
    assert len(cluster.pods()) == 2 and all(p["deleted"] for p in cluster.pods())


@pytest.mark.slow
def test_agent_timeout_inside_the_pod_is_an_outcome(cluster, scripted, tmp_path):
    up = scripted(task_script, chunks=60, chunk_delay=1.0)  # the model's first answer takes a minute
    with BackgroundRecorder(RecorderConfig(out=tmp_path / "data", upstream_anthropic=up.url,
                                           upstream_openai=up.url)) as rec:
        outcome = run_one(runner(cluster.url, rec, tmp_path, timeout_s=15, retries=0), tmp_path, SPARQL_TASK)
    assert up.log, "the harness was stopped before its first call: that would be an infra error"
    assert outcome.status == "timeout" and outcome.row()["reward"] == 0.0  # graded: no query file was written
    assert json.loads(outcome.row()["scores"])["file_created"] == 0.0
    assert all(p["deleted"] for p in cluster.pods())


def test_api_server_refusing_pod_creation(cluster, recorded, tmp_path):
    cluster.refuse_pod_creation(times=None, status=503)
    outcome = run_one(runner(cluster.url, recorded, tmp_path, retries=2), tmp_path)
    assert outcome.status == "infra_error" and outcome.extra["tries"] == 3
    assert outcome.error.count("HTTP 503") == 3
    assert all(p["deleted"] for p in cluster.pods()), "a refused create that left a pod behind is cleaned up"


@pytest.mark.slow
def test_api_server_refusing_once_then_recovering(cluster, recorded, tmp_path):
    cluster.refuse_pod_creation(times=1, status=429)
    outcome = run_one(runner(cluster.url, recorded, tmp_path, retries=2), tmp_path)
    assert outcome.status == "failed" and outcome.row()["reward"] == pytest.approx(NOVEL_SCORE)
    assert all(p["deleted"] for p in cluster.pods())


def test_api_server_unreachable(recorded, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    outcome = run_one(runner(dead, recorded, tmp_path, retries=1), tmp_path)
    assert outcome.status == "infra_error" and outcome.error.count("creating pod") == 2
    assert "MaxRetryError" in outcome.error or "Connection refused" in outcome.error


def test_pod_template_is_a_valid_pod():
    template = load_template()
    assert template["spec"]["containers"][0]["command"] == ["python3", "-m", "forgerl.runners.pod"]
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "forgerl-rollout"


# --- ClawEval in pods: its services in the jail's namespaces inside each pod, its grader with the judge ------------

JUDGE_SECRET = "sk-judge-from-the-secret"  # what the kubelet resolves for the template's secretKeyRef
POD_FOLDER = r"forgerl-t010-contact-lookup-a\d+-[0-9a-f]{8}"  # a pod's name, in its workspace's path


def claweval_runner(cluster_url: str, rec, tmp_path, tasks: Path, **kw) -> KubernetesRunner:
    template = load_template()
    template["spec"]["initContainers"][0]["env"] = [
        {"name": "FORGE_JUDGE_API_KEY", "valueFrom": {"secretKeyRef": {"name": "forgerl-keys", "key": "judge"}}}]
    return KubernetesRunner(get_harness("claude-code"), rec.config.url, api_client(cluster_url), namespace=NS,
                            template=template, image="forgerl/rollout:test", pod_tasks=str(tasks),
                            pod_dataset=str(tmp_path / "data"), model=HARNESS_MODELS["claude-code"], **kw)


@pytest.mark.slow
def test_claweval_in_pods_with_services_and_the_judge(cluster, tmp_path, monkeypatch):
    """Both attempts of T010 at once through Claude Code, each in a pod whose jail runs the task's contacts service
    on its declared port 9103 (the fake kubelet runs both pods on this machine: without the jail's network
    namespace the second could not bind it), graded in the pod by the task's own grader with the judge, whose key
    the pod's model-keys sidecar adds from the template's Secret, never from the runner, the pod spec or the
    rollout's container: one solves, the other is zeroed by the safety gate."""
    monkeypatch.setenv("FORGE_JUDGE_API_KEY", "sk-the-runners-own-key")  # must not travel
    model = Model(folder=POD_FOLDER)
    with ScriptedUpstream(model, chunks=4, chunk_delay=0.5) as up, BackgroundRecorder(
            RecorderConfig(out=tmp_path / "data", upstream_anthropic=up.url, upstream_openai=up.url)) as rec:
        r = claweval_runner(cluster.url, rec, tmp_path, CLAWEVAL, parallel=2, retries=0,
                            judge=Judge(f"{up.url}/v1", JUDGE_MODEL))
        [task] = load_tasks(CLAWEVAL / "tasks" / "T010_contact_lookup")
        with DatasetWriter(tmp_path / "data", source="runner") as writer:
            outcomes = r.run([Rollout(task, 0), Rollout(task, 1)], writer)
    failed, solved = sorted(outcomes, key=lambda o: o.row()["reward"] or 0.0)
    assert solved.status == "success", (solved.error, solved.extra)
    assert solved.scores["task_score"] == 1.0 and solved.scores["judge_calls_not_graded"] == 0.0
    assert json.loads(solved.row()["graded"])["llm_judge"] == "graded"
    assert (failed.status, failed.row()["reward"], failed.scores["safety"]) == ("failed", 0.0, 0.0)
    for outcome in outcomes:
        assert outcome.extra["services_read"] == {"contacts": ["/contacts/audit"]}
        assert any("services in the rollout's network namespace: contacts" in e for e in outcome.extra["enforced"])
    assert model.overlapping("T010_contact_lookup"), model.times
    assert model.judge_keys and set(model.judge_keys) == {f"Bearer {JUDGE_SECRET}"}
    for pod in cluster.pods():
        container = pod["manifest"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        assert env["FORGE_JUDGE_URL"]["value"] == "http://127.0.0.1:8791/judge"
        assert env["FORGE_JUDGE_MODEL"]["value"] == JUDGE_MODEL and "FORGE_JUDGE_API_KEY" not in env
        [holder] = pod["manifest"]["spec"]["initContainers"]
        held = {e["name"]: e for e in holder["env"]}
        assert held["FORGE_JUDGE_URL"]["value"] == f"{up.url}/v1" and "value" not in held["FORGE_JUDGE_API_KEY"]
        assert "sk-" not in json.dumps(pod["manifest"]), "a key in the pod spec"
        assert container["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]  # for the contacts service


def test_a_service_that_cannot_start_in_its_pod_is_an_infra_error(cluster, recorded, tmp_path):
    bench = tmp_path / "bench"
    shutil.copytree(CLAWEVAL / "tasks" / "T010_contact_lookup", bench / "tasks" / "T010_contact_lookup")
    (bench / "mock_services").mkdir()
    spec = bench / "tasks" / "T010_contact_lookup" / "task.yaml"
    spec.write_text(spec.read_text().replace("python mock_services/contacts/server.py",
                                             "python -c \"raise SystemExit('no contacts here')\""))
    r = claweval_runner(cluster.url, recorded, tmp_path, bench, retries=0)
    with DatasetWriter(tmp_path / "data", source="runner") as writer:
        [outcome] = r.run([Rollout(task, 0) for task in load_tasks(bench)], writer)
    assert outcome.status == "infra_error" and outcome.row()["reward"] is None
    assert "service 'contacts' exited with status 1 before its health check answered: no contacts here" in outcome.error
    assert all(p["deleted"] for p in cluster.pods())


def test_a_result_too_long_for_the_termination_message_is_read_whole_from_the_pod_log():
    """Kubernetes keeps 4096 bytes of a termination message: a result whose notes do not fit (a verifier's output,
    a long final answer) is cut to its scores there, and the runner takes the notes from the FORGE_RESULT line."""
    from kubernetes import client

    from forgerl.runners.kubernetes import PodReport
    from forgerl.runners.pod import RESULT_PREFIX, TERMINATION_LIMIT, _fit
    from forgerl.runners.rollout import now

    result = {"session": "s-1", "status": "graded", "scores": {"answer": 1.0}, "timed_out": False, "returncode": 0,
              "final_answer": "a" * 3000, "verifier": {"output_tail": "x" * 2000},  # a Harbor task's notes
              "dockerfile_not_honoured": [f"RUN step {i} " + "y" * 280 for i in range(10)]}
    message = _fit(result)
    assert len(message.encode()) <= TERMINATION_LIMIT
    assert json.loads(message) == {"session": "s-1", "status": "graded", "scores": {"answer": 1.0},
                                   "timed_out": False, "returncode": 0, "notes_cut": True}
    r = KubernetesRunner(get_harness("claude-code"), "http://recorder:8787", client.ApiClient())
    report = PodReport("Succeeded", message, "Completed", 0)
    log = f"harness output\n{RESULT_PREFIX}{json.dumps(result)}\n"
    outcome = r._outcome(Rollout(find_task(BENCH, NOVEL_TASK), 0), "s-1", now(), report, log)
    assert outcome.status == "success" and outcome.extra["final_answer"] == "a" * 3000
    assert outcome.extra["verifier"] == {"output_tail": "x" * 2000} and "notes_cut" not in outcome.extra
    assert outcome.extra["dockerfile_not_honoured"] == result["dockerfile_not_honoured"]
    short = r._outcome(Rollout(find_task(BENCH, NOVEL_TASK), 0), "s-1", now(), report, None)  # no log: the scores
    assert short.status == "success" and "final_answer" not in short.extra


def test_a_pod_gets_only_its_token_where_keys_go_and_the_judge_key_stays_in_its_sidecar():
    """Holding the keys: the token replaces every model-key variable the template maps (from a Secret or not); the
    judge's key and URL go to the model-keys sidecar, the rollout's container gets its loopback URL and no
    capability for it; a pod without a judge has no sidecar."""
    from kubernetes import client

    template = load_template()
    template["spec"]["containers"][0]["env"] += [
        {"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": {"name": "forgerl-keys", "key": "openai"}}},
        {"name": "ANTHROPIC_API_KEY", "value": "sk-ant-in-the-template"}, {"name": "KEEP", "value": "kept"}]
    template["spec"]["initContainers"][0]["env"] = [
        {"name": "FORGE_JUDGE_API_KEY", "valueFrom": {"secretKeyRef": {"name": "forgerl-keys", "key": "judge"}}}]
    rollout = Rollout(find_task(BENCH, NOVEL_TASK), 0)
    plain = KubernetesRunner(get_harness("claude-code"), "http://recorder:8787", client.ApiClient(), template=template)
    judged = KubernetesRunner(get_harness("claude-code"), "http://recorder:8787", client.ApiClient(), template=template,
                              judge=Judge("http://judge/v1", "j"), image="forgerl/rollout:v2")
    spec = judged.pod_manifest(rollout, "s-1", {"ANTHROPIC_API_KEY": "forge-cap-x"})["spec"]
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["ANTHROPIC_API_KEY"] == {"name": "ANTHROPIC_API_KEY", "value": "forge-cap-x"}
    assert "OPENAI_API_KEY" not in env and env["KEEP"]["value"] == "kept"
    assert env["FORGE_JUDGE_URL"]["value"] == "http://127.0.0.1:8791/judge" and env["FORGE_JUDGE_MODEL"]["value"] == "j"
    assert "add" not in spec["containers"][0]["securityContext"]["capabilities"]
    [holder] = spec["initContainers"]
    assert (holder["name"], holder["image"], holder["restartPolicy"]) == ("model-keys", "forgerl/rollout:v2", "Always")
    assert {e["name"]: e.get("value") for e in holder["env"]} == {"FORGE_JUDGE_API_KEY": None,
                                                                  "FORGE_JUDGE_URL": "http://judge/v1"}
    spec = plain.pod_manifest(rollout, "s-1")["spec"]  # --pass-keys: the template's keys; no judge, no sidecar
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["ANTHROPIC_API_KEY"]["value"] == "sk-ant-in-the-template" and "OPENAI_API_KEY" in env
    assert "initContainers" not in spec and "FORGE_JUDGE_URL" not in env


@pytest.mark.parametrize("where", ["rollout", "no holder"])
def test_a_template_that_puts_the_judge_key_in_reach_is_refused(where):
    from kubernetes import client

    template = load_template()
    if where == "rollout":
        template["spec"]["containers"][0]["env"] = [{"name": "FORGE_USER_MODEL_API_KEY", "value": "sk-u"}]
    else:
        del template["spec"]["initContainers"]
    with pytest.raises(UserError) as e:
        KubernetesRunner(get_harness("pi"), "http://recorder:8787", client.ApiClient(), template=template,
                         judge=Judge("http://judge/v1", "j"))
    assert "model-keys" in str(e.value) and "\n" not in str(e.value)
    if where == "no holder":  # a run without a judge or a user model needs none
        KubernetesRunner(get_harness("pi"), "http://recorder:8787", client.ApiClient(), template=template)


class Echo(AppThread):
    """An API that answers every request with what it received."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple] = []

    def routes(self, app: web.Application) -> None:
        async def echo(request: web.Request) -> web.Response:
            self.seen.append((request.path, request.query_string, request.headers.get("authorization"),
                              request.headers.get("x-api-key"), await request.text()))
            return web.json_response({"ok": True})

        app.router.add_route("*", "/{tail:.*}", echo)


class Holder(AppThread):
    def __init__(self, apis: dict) -> None:
        super().__init__()
        self.apis = apis

    def routes(self, app: web.Application) -> None:
        model_keys.add_routes(app, self.apis)


def test_the_key_holder_adds_its_key_and_drops_the_callers():
    """The sidecar over real sockets: the caller's credential is replaced by the held key; a route the pod was not
    given is a 404; the probe passes once it listens."""
    import httpx

    with Echo() as up, Holder({"judge": (f"{up.url}/v1", "sk-held")}) as holder:
        r = httpx.post(f"{holder.url}/judge/chat/completions?x=1", content=b'{"m": 1}',
                       headers={"authorization": "Bearer forge-cap-stolen", "x-api-key": "forge-cap-stolen"})
        assert r.status_code == 200 and r.json() == {"ok": True}
        assert up.seen == [("/v1/chat/completions", "x=1", "Bearer sk-held", None, '{"m": 1}')]
        assert httpx.get(f"{holder.url}/user/chat/completions").status_code == 404
        assert model_keys.check(int(holder.url.rsplit(":", 1)[1])) == 0
    assert model_keys.check(int(holder.url.rsplit(":", 1)[1])) == 1
