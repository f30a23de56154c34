"""OpenTelemetry GenAI export (issue 33): `forge-convert --to otel` and the recorder's live `--otlp`.

Fast: the example dataset exported offline; live export from a real
`forge-record serve` driven by the Anthropic SDK (content included) to a light
receiver on a socket (`otlp_receiver.py`), and to one that is down, answers
500 or answers too late; the exporter's idle end and drop count in process;
a runner ending its sessions' roots with their outcomes (a retried try's
without). Slow: `forge-run --otlp` with Claude Code on a real task and the RL
agent loop (a tiny policy, Codex CLI), each root carrying the outcome; and
(`mlflow_server.py`) a Claude Code session with a subagent exported live
to MLflow's tracking server, and a Gemini CLI session's offline export POSTed
to it, both read back with MLflow's client. Live spans equal the offline
export's, id for id and time for time, the root's outcome included.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import types
from pathlib import Path

import anthropic
import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from conftest import FORGE_RECORD, REPO, RecorderProcess, session_calls
from convert_harness_fixtures import CLAUDE_FLAGS, CLAUDE_RUNS, claude_script
from forgerl.harnesses import node_path
from harness_checks import ProxyTrap, needs
from test_harness_gemini_cli import steps
from mlflow_server import MlflowServer
from otlp_receiver import OtlpReceiver, parse_otlp_json, spans_of
from scripted_upstream import ScriptedUpstream, ToolCall, Turn, sequence

from forgerl.converters.cli import main as convert_main
from forgerl.recorder.otel import OPERATIONS, SessionTrace, ToolUses, writing_order
from forgerl.recorder.otlp import OtlpExporter
from forgerl.schema.records import call_messages
from forgerl.schema.sessions import session_rows
from forgerl.schema.store import read_table

EXAMPLE = REPO / "analysis" / "example"


def attrs(span: Span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out


def offline(dataset: Path, out: Path, *extra: str) -> list[Span]:
    assert convert_main([str(dataset), "--to", "otel", "--out", str(out), *extra]) == 0
    return spans_of([parse_otlp_json(line) for line in (out / "traces.jsonl").read_text().splitlines()])


def shape(spans: list[Span]) -> set[tuple]:
    """What must match between two exports of a trace: ids, parents, names, times, kinds."""
    return {(s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.start_time_unix_nano, s.end_time_unix_nano)
            for s in spans}


def test_offline_export_maps_the_example_dataset(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(EXAMPLE, data)
    spans = offline(data, tmp_path / "o")
    again = offline(data, tmp_path / "o2")
    assert shape(spans) == shape(again) and len(spans) == len(again)  # deterministic ids
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    calls = [c for c in pq.read_table(data / "calls").to_pylist() if c["api"] in OPERATIONS]  # model calls
    chats = {attrs(s)["forgerl.call.id"]: s for s in spans if attrs(s)["gen_ai.operation.name"] != "invoke_agent"
             and "forgerl.call.id" in attrs(s)}
    assert set(chats) == {c["call_id"] for c in calls}  # one span per call
    assert manifest["sessions"] == len({c["session_id"] for c in calls})
    by_id = {s.span_id: s for s in spans}
    for c in calls:
        a = attrs(chats[c["call_id"]])
        if c["input_tokens"] is not None:  # the convention counts cached tokens inside input
            assert a["gen_ai.usage.input_tokens"] == (c["input_tokens"] + (c["cache_read_tokens"] or 0)
                                                      + (c["cache_write_tokens"] or 0))
        assert a["gen_ai.conversation.id"] == c["session_id"]
        assert ("error.type" in a) == bool(c["error"] or (c["status"] or 0) >= 400 or not c["complete"])
        parent = by_id[chats[c["call_id"]].parent_span_id]  # every call hangs under an agent of its trace
        assert attrs(parent)["gen_ai.operation.name"] == "invoke_agent"
        assert parent.trace_id == chats[c["call_id"]].trace_id
    tools = [s for s in spans if s.name.startswith("execute_tool")]
    assert tools and all(s.start_time_unix_nano <= s.end_time_unix_nano for s in tools)
    roots = [s for s in spans if not s.parent_span_id]
    assert len(roots) == manifest["sessions"]
    rewarded = [s for s in roots if "forgerl.reward" in attrs(s)]
    assert rewarded and all(e.name == "gen_ai.evaluation.result" for s in rewarded for e in s.events)


def test_live_export_from_the_recorder_with_a_down_or_failing_collector(scripted, recorder, tmp_path):
    up = scripted(sequence(Turn(text="hello there"), Turn(text="again")))
    with OtlpReceiver() as good:
        rec = recorder(up.url, "--otlp", good.url, "--otel-content", out=tmp_path / "data")
        client = anthropic.Anthropic(base_url=rec.base("s1"), api_key="sk-ant-test")
        first = [{"role": "user", "content": "hi"}]
        said = client.messages.create(model="claude-x", max_tokens=10, system="Be brief.", messages=first)
        with client.messages.stream(model="claude-x", max_tokens=10, system="Be brief.", messages=[
                *first, {"role": "assistant", "content": said.content[0].text},
                {"role": "user", "content": "hi again"}]) as stream:
            stream.until_done()
        session_calls(tmp_path / "data", "s1", 2)
        log = rec.stop()
    assert "3 spans sent, 0 dropped" in log, log  # 2 calls, and the root at exit
    live = good.spans()
    assert sorted(s.name for s in live if s.parent_span_id) == ["chat claude-x", "chat claude-x"]
    assert [s.name.split(" ")[0] for s in live if not s.parent_span_id] == ["invoke_agent"]
    [streamed] = [attrs(s) for s in live if attrs(s).get("gen_ai.request.stream")]
    [plain] = [attrs(s) for s in live if attrs(s).get("gen_ai.request.stream") is False]
    assert streamed["gen_ai.response.time_to_first_chunk"] >= 0
    # content: each call's new messages only; instructions on the segment's first call
    assert json.loads(plain["gen_ai.input.messages"]) == [{"role": "user", "parts": [{"type": "text",
                                                                                       "content": "hi"}]}]
    assert json.loads(plain["gen_ai.system_instructions"]) == [{"type": "text", "content": "Be brief."}]
    assert json.loads(plain["gen_ai.output.messages"]) == [{"role": "assistant", "finish_reason": "end_turn",
                                                            "parts": [{"type": "text", "content": "hello there"}]}]
    assert json.loads(streamed["gen_ai.input.messages"]) == [{"role": "user", "parts": [{"type": "text",
                                                                                          "content": "hi again"}]}]
    assert "gen_ai.system_instructions" not in streamed
    assert shape(live) == shape(offline(tmp_path / "data", tmp_path / "o"))
    both = offline(tmp_path / "data", tmp_path / "oc", "--otel-content")  # the same attributes, content included
    assert {s.span_id: attrs(s) for s in live} == {s.span_id: attrs(s) for s in both}

    # nothing listening; a collector answering 500; one answering after the POST timeout (0.3 s)
    for case, status, delay in (("down", 200, 0.0), ("500", 500, 0.0), ("slow", 200, 1.0)):
        with OtlpReceiver(status, delay) as failing:
            if case == "down":
                failing.server.shutdown()
                failing.server.server_close()
            data = tmp_path / f"data-{case}"
            rec = RecorderProcess(data, up.url, "--otlp", failing.url, env={"OTEL_EXPORTER_OTLP_TIMEOUT": "300"})
            try:
                rec.start()
                client = anthropic.Anthropic(base_url=rec.base("s2"), api_key="sk-ant-test")
                t0 = time.monotonic()
                client.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
                assert time.monotonic() - t0 < 5
                assert len(session_calls(data, "s2", 1)) == 1  # the recording is untouched
            finally:
                t0 = time.monotonic()
                log = rec.stop()
            assert time.monotonic() - t0 < 15
        assert "0 spans sent, 2 dropped" in log, (case, log)


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


def record(tmp_path: Path, session: str, script, cmd: list[str], env: dict[str, str], *extra: str) -> Path:
    """`forge-record run [extra] -- cmd` against `script`, every proxy variable at a trap; the dataset."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(exist_ok=True)
    home.mkdir()
    with ProxyTrap() as trap, ScriptedUpstream(script) as up:
        r = subprocess.run([FORGE_RECORD, "run", "--out", str(tmp_path / "data"), "--session", session, "--upstream",
                            up.url, *extra, "--", *cmd], cwd=work, capture_output=True, text=True, timeout=240,
                           env={**os.environ, "HOME": str(home), "PWD": str(work), **env, **trap.env()},
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr[-2000:]
    if extra:
        assert ", 0 dropped" in r.stderr, r.stderr[-2000:]
    return tmp_path / "data"


def mlflow_shape(trace: dict) -> set[tuple]:
    """`shape` of a trace as MLflow's client read it back (hex ids; MLflow prefixes the trace id with `tr-`)."""
    return {(trace["trace_id"].removeprefix("tr-"), s["span_id"], s["parent_id"] or "", s["name"], s["start_ns"],
             s["end_ns"]) for s in trace["spans"]}


def hex_shape(spans: list[Span]) -> set[tuple]:
    return {(s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name, s.start_time_unix_nano,
             s.end_time_unix_nano) for s in spans}


@pytest.mark.slow
def test_claude_code_subagent_live_into_mlflow(tmp_path, mlflow):
    """Live export from a real recorder to MLflow's tracking server, its experiment header from the standard
    variable; MLflow's client reads back the calls, tokens, tool spans and parent links, and the offline export
    of the same dataset has the very same spans."""
    experiment = mlflow.experiment("claude-code-live")
    data = record(tmp_path, "cc", claude_script, [str(needs("claude")), *CLAUDE_RUNS[0], *CLAUDE_FLAGS], {
        "ANTHROPIC_API_KEY": "sk-ant-api03-oteltestoteltest", "IS_SANDBOX": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "OTEL_EXPORTER_OTLP_HEADERS": f"x-mlflow-experiment-id={experiment},authorization=Bearer%20t0ken"},
                  "--otlp", mlflow.url)
    [trace] = mlflow.traces(experiment)
    assert mlflow_shape(trace) == hex_shape(offline(data, tmp_path / "o"))

    spans = {s["span_id"]: s for s in trace["spans"]}
    [root] = [s for s in spans.values() if not s["parent_id"]]
    assert (root["name"], root["type"]) == ("invoke_agent claude-code", "AGENT")
    [sub] = [s for s in spans.values() if s["name"] == "invoke_agent claude-code subagent"]
    agent_tool = spans[sub["parent_id"]]  # the subagent runs inside the Agent tool's execution
    assert (agent_tool["name"], agent_tool["type"], agent_tool["parent_id"]) == ("execute_tool Agent", "TOOL",
                                                                                 root["span_id"])
    assert agent_tool["start_ns"] <= sub["start_ns"] <= sub["end_ns"] <= agent_tool["end_ns"]
    calls = [s for s in spans.values() if s["type"] == "CHAT_MODEL"]
    assert {spans[s["parent_id"]]["name"] for s in calls} == {root["name"], sub["name"]}
    assert all(s["attributes"]["gen_ai.provider.name"] == "anthropic" and s["attributes"]["gen_ai.usage.output_tokens"]
               > 0 for s in calls)
    rows = session_calls(data, "cc", len(calls))
    assert trace["token_usage"]["output_tokens"] == sum(r["output_tokens"] for r in rows if r["api"] == "anthropic")


@pytest.mark.slow
def test_gemini_cli_offline_export_into_mlflow(tmp_path, mlflow):
    """A `forge-convert --to otel` line POSTed as OTLP/JSON to MLflow. The Gemini API names no tool call: each is
    matched to its result by the tool's name."""
    proof = tmp_path / "work" / "proof.txt"
    proof.parent.mkdir()
    script = steps(ToolCall("write_file", {"file_path": str(proof), "content": "forgerl proof"}), answer="Written.")
    data = record(tmp_path, "gm", script, [str(needs("gemini")), "--yolo", "--output-format", "json", "-m",
                                           "gemini-2.5-pro", "-p", "Write proof.txt."],
                  {"GEMINI_API_KEY": "AIzaSyForgeGeminiTestKeyGeminiTest12", "PATH": node_path()})
    spans = offline(data, tmp_path / "o")
    experiment = mlflow.experiment("gemini-cli-offline")
    [line] = (tmp_path / "o" / "traces.jsonl").read_text().splitlines()
    assert mlflow.post_json(line, experiment) == 200
    [trace] = mlflow.traces(experiment)
    assert mlflow_shape(trace) == hex_shape(spans)
    by_name = {s["name"]: s for s in trace["spans"]}
    calls = [s for s in trace["spans"] if s["name"].startswith("generate_content")]
    assert len(calls) == 2 and all(s["attributes"]["gen_ai.provider.name"] == "gcp.gen_ai"
                                   and s["attributes"]["gen_ai.request.stream"] for s in calls)
    calls.sort(key=lambda s: s["start_ns"])
    tool = by_name["execute_tool write_file"]
    assert calls[0]["end_ns"] == tool["start_ns"] and tool["end_ns"] == calls[1]["start_ns"]
    assert tool["type"] == "TOOL" and proof.read_text() == "forgerl proof"
    assert by_name["invoke_agent gemini-cli"]["parent_id"] is None


def test_exporter_ends_idle_sessions_once_and_counts_a_full_queue():
    """In process, with the example dataset's rows: a session idle past `idle_s` has its root sent once, and a
    call arriving after that joins the same trace; spans that find the queue full are counted as dropped."""
    rows = [r for r in sorted(pq.read_table(EXAMPLE / "calls").to_pylist(), key=writing_order)
            if r["session_id"] == "cc-subagent-a1"]
    assert len(rows) > 2
    no_messages = types.SimpleNamespace(exchange=None)
    with OtlpReceiver() as receiver:
        exporter = OtlpExporter(receiver.url, idle_s=0.2)
        for row in rows[:-1]:
            exporter.call(row, no_messages, "claude-code")
        deadline = time.monotonic() + 10
        while not any(not s.parent_span_id for s in receiver.spans()) and time.monotonic() < deadline:
            time.sleep(0.1)
        exporter.call(rows[-1], no_messages, "claude-code")  # late: after the root was sent
        exporter.close()
        spans = receiver.spans()
    assert [s.name for s in spans if not s.parent_span_id] == ["invoke_agent claude-code"]
    assert len({s.trace_id for s in spans}) == 1 and len({s.span_id for s in spans}) == len(spans)
    assert (exporter.sent, exporter.dropped) == (len(spans), 0)

    # a one-span queue in front of a collector that is not there: every span is dropped, at the queue or the POST
    made = SessionTrace(rows[0]["session_id"])
    expected = sum(len(made.add(row, ToolUses())) for row in rows) + len(made.finish())
    full = OtlpExporter("http://127.0.0.1:9", max_queue=1)  # nothing listens on the discard port
    for row in rows:
        full.call(row, no_messages, None)
    full.close()
    assert (full.sent, full.dropped) == (0, expected)


def test_the_runner_ends_the_root_with_the_outcome_and_the_writer_leaves_it(tmp_path):
    """In process, with the example dataset: a writer's exporter under a runner (`ends_roots=False`) sends the
    call and tool spans and, at exit, no agent span; the runner's `end_session` sends the subagent and root spans
    with the outcome. Together they are the offline export of that session, attribute for attribute."""
    session = "cc-subagent-a1"
    rows = [r for r in pq.read_table(EXAMPLE / "calls").to_pylist() if r["session_id"] == session]
    [outcome] = [r for r in pq.read_table(EXAMPLE / "outcomes").to_pylist() if r["session_id"] == session]
    parts = {r["part_hash"]: r["part"] for r in session_rows(EXAMPLE, "messages", session, ["part_hash", "part"])
             .to_pylist()}

    def record(row: dict) -> types.SimpleNamespace:  # what the writer hands the exporter: the call's messages
        return types.SimpleNamespace(exchange=types.SimpleNamespace(input=call_messages(row, parts, "input"),
                                                                    output=call_messages(row, parts, "output")))
    with OtlpReceiver() as writer_side, OtlpReceiver() as runner_side:
        writer = OtlpExporter(writer_side.url, idle_s=0.0, ends_roots=False)
        for row in sorted(rows, key=writing_order):
            writer.call(row, record(row), "claude-code")
        writer.close()  # idle at once (idle_s=0), then closed: no agent span of its own either way
        runner = OtlpExporter(runner_side.url)
        runner.end_session(EXAMPLE, session, outcome)
        runner.close()
        calls, ends = writer_side.spans(), runner_side.spans()
    assert not [s for s in calls if s.name.startswith("invoke_agent")]
    assert sorted(s.name for s in ends) == ["invoke_agent claude-code", "invoke_agent claude-code subagent"]
    root = next(s for s in ends if not s.parent_span_id)
    a = attrs(root)
    assert (a["forgerl.task.id"], a["forgerl.reward"], a["forgerl.outcome.status"]) == (outcome["task_id"], 1.0,
                                                                                          "success")
    assert [(e.name, attrs(e)["gen_ai.evaluation.score.value"]) for e in root.events] == [
        ("gen_ai.evaluation.result", 1.0)]
    both = [s for s in offline(EXAMPLE, tmp_path / "o") if s.trace_id == root.trace_id]
    assert len(calls) + len(ends) == len(both)
    assert {s.span_id: (attrs(s), [e.name for e in s.events]) for s in calls + ends} == {
        s.span_id: (attrs(s), [e.name for e in s.events]) for s in both}
    assert shape(calls + ends) == shape(both)


def test_a_runners_retried_try_gets_its_root_without_an_outcome(tmp_path, monkeypatch):
    """`BatchRunner.run` under `--otlp`: a try that failed (an infrastructure error, retried) has its root sent
    without an outcome, the try whose outcome is written with it (two example sessions stand for the tries)."""
    from runner_fixtures import toml_task

    from forgerl.harnesses import get_harness
    from forgerl.recorder.otlp import ROOTS_ENV, URL_ENV
    from forgerl.runners.loader import load_task
    from forgerl.runners.rollout import BatchRunner, InfraError, Outcome, Rollout, now
    from forgerl.schema.writer import DatasetWriter

    tries = iter(["cc-subagent-a1", "cc-verify-a1"])

    class Tries(Rollout):
        def new_session(self) -> str:
            return next(tries)

    class Runner(BatchRunner):
        harness, parallel, retries, model, name = get_harness("claude-code"), 1, 1, "", "test"

        def attempt(self, rollout: Rollout, session: str) -> Outcome:
            if session == "cc-subagent-a1":
                raise InfraError("the recorder flush barrier timed out")
            return Outcome.graded(rollout, session, "claude-code", self.name, now(), {"answered": 0.25}, False, 0)

    data = tmp_path / "data"
    shutil.copytree(EXAMPLE, data)
    task = load_task(toml_task(tmp_path / "tasks", "retried", "return {'answered': 0.25}"))
    with OtlpReceiver() as receiver:
        monkeypatch.setenv(URL_ENV, receiver.url)
        monkeypatch.setenv(ROOTS_ENV, "runner")
        with DatasetWriter(data, source="runner") as writer:
            [outcome] = Runner().run([Tries(task, 0, "v3")], writer)
        live = receiver.spans()
    roots = {attrs(s)["gen_ai.conversation.id"]: attrs(s) for s in live if not s.parent_span_id}
    assert set(roots) == {"cc-subagent-a1", "cc-verify-a1"} and outcome.session == "cc-verify-a1"
    assert "forgerl.task.id" not in roots["cc-subagent-a1"]
    assert (roots["cc-verify-a1"]["forgerl.task.id"], roots["cc-verify-a1"]["forgerl.reward"],
            roots["cc-verify-a1"]["forgerl.policy_version"]) == ("retried", 0.25, "v3")
    offline_roots = {attrs(s)["gen_ai.conversation.id"]: attrs(s) for s in offline(data, tmp_path / "o")
                     if not s.parent_span_id}
    assert roots["cc-verify-a1"] == offline_roots["cc-verify-a1"]  # the outcome as written, the example's beside it


@pytest.mark.slow
def test_forge_run_otlp_puts_the_outcome_on_the_live_root(scripted, tmp_path):
    """`forge-run --otlp` with Claude Code on a real task: the recorder it starts sends the call and tool spans,
    forge-run the root, carrying the task, reward, status and policy version and the reward's evaluation event,
    as it writes the outcome; the live trace is the offline export of the dataset, span for span."""
    from runner_fixtures import BENCH, SPARQL_SCORE, SPARQL_TASK, task_script

    up = scripted(task_script)
    out = tmp_path / "data"
    with OtlpReceiver() as receiver:
        r = subprocess.run([str(Path(FORGE_RECORD).with_name("forge-run")), str(BENCH), "--task", SPARQL_TASK,
                            "--harness", "claude-code", "--upstream", up.url, "--out", str(out), "--policy-version",
                            "v7", "--otlp", receiver.url], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL, env={**os.environ, "ANTHROPIC_API_KEY": "sk-ant-" + "k" * 40})
        assert r.returncode == 0, r.stderr[-3000:]
        live = receiver.spans()
    assert "1 spans sent, 0 dropped" in r.stderr, r.stderr[-3000:]  # forge-run's own: the root
    [outcome] = read_table(out, "outcomes").to_pylist()
    [root] = [s for s in live if not s.parent_span_id]
    a = attrs(root)
    assert (a["forgerl.task.id"], a["forgerl.outcome.status"], a["forgerl.policy_version"], a["forgerl.passed"]) == (
        SPARQL_TASK, "failed", "v7", False)
    assert a["forgerl.reward"] == pytest.approx(SPARQL_SCORE) == outcome["reward"]
    [event] = root.events
    assert (event.name, attrs(event)["gen_ai.evaluation.score.value"]) == ("gen_ai.evaluation.result",
                                                                           outcome["reward"])
    assert sorted(s.name.split(" ")[0] for s in live) == ["chat", "chat", "execute_tool", "invoke_agent"]
    both = offline(out, tmp_path / "o")
    assert shape(live) == shape(both) and len(live) == len(both)
    assert {s.span_id: (attrs(s), [attrs(e) for e in s.events]) for s in live} == {
        s.span_id: (attrs(s), [attrs(e) for e in s.events]) for s in both}


@pytest.mark.slow
def test_the_rl_agent_loop_ends_its_rollouts_trace_with_the_reward(tmp_path, monkeypatch):
    """`forge-train rl --otlp` (the environment it sets, which veRL's workers inherit): the agent loop's rollout
    recorder sends the calls, served by the policy (`vllm`), and the loop the root with the task, reward and
    policy version, as forge-run does."""
    from runner_fixtures import toml_task
    from serve_fixtures import TinyLM, tiny_model
    from test_trainer_agent_loop import agent_loop

    from forgerl.recorder.otlp import ROOTS_ENV, URL_ENV

    task = toml_task(tmp_path / "tasks", "touch", "return {'answered': 0.25}", prompt="say hi")
    loop = agent_loop(TinyLM(tiny_model(tmp_path / "tiny")), tmp_path)
    with OtlpReceiver() as receiver:
        monkeypatch.setenv(URL_ENV, receiver.url)
        monkeypatch.setenv(ROOTS_ENV, "runner")
        out = asyncio.run(loop.run({"temperature": 1.0}, extra_info={"task_path": str(task)}, raw_prompt=[]))
        live = receiver.spans()
    calls = [attrs(s) for s in live if s.parent_span_id]
    assert calls and {a["gen_ai.provider.name"] for a in calls} == {"vllm"}
    assert {a["gen_ai.conversation.id"] for a in calls} == {out.extra_fields["forge_session"]}
    [root] = [s for s in live if not s.parent_span_id]
    a = attrs(root)
    assert (a["forgerl.task.id"], a["forgerl.reward"], a["forgerl.policy_version"]) == ("touch", 0.25, "step-3")
    assert [attrs(e)["gen_ai.evaluation.score.value"] for e in root.events] == [out.reward_score]
    assert shape(live) == shape(offline(tmp_path / "data", tmp_path / "o"))  # the offline root: no outcome


def test_bad_export_flags_are_one_line_refusals(tmp_path, capsys, monkeypatch):
    from forgerl.recorder.cli import main as record_main
    from forgerl.runners.cli import main as run_main

    def refused(main, *argv: str) -> str:
        assert main(list(argv)) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        return err

    out = tmp_path / "d"
    assert "give the collector's OTLP/HTTP base URL" in refused(record_main, "run", "--otlp", "ftp://x", "--out",
                                                                 str(out), "--", "true")
    assert "give --otlp too" in refused(record_main, "serve", "--otel-content", "--out", str(out))
    assert "give it to the --recorder-url recorder" in refused(
        run_main, str(tmp_path), "--harness", "pi", "--recorder-url", "http://127.0.0.1:9", "--otlp",
        "http://127.0.0.1:4318", "--out", str(out), "--pass-keys")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")
    assert "OTEL_EXPORTER_OTLP_TIMEOUT" in refused(record_main, "serve", "--otlp", "http://127.0.0.1:4318", "--out",
                                                   str(out))
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TIMEOUT")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "big")
    assert "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT" in refused(convert_main, str(EXAMPLE), "--to", "otel", "--out",
                                                          str(out), "--otel-content")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".d.")]
