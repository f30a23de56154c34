"""Tasks with a simulated user (ClawEval `user_agent`): ClawEval's own `UserAgent` on a configured user model, the
dialogue rounds, each harness's way of resuming its session, and C01zh end to end through real harnesses.

The scripted upstream plays all three models, told apart by the model each request names: the harness's model
(through the recorder), the user model and the judge (both Chat Completions, called directly). The user's
persona decides how the dialogue goes: C01zh's own user gives its numbers when asked, asks one follow-up and is
satisfied ([DONE] after 2 rounds); a copy whose persona never knows the numbers keeps answering until
max_rounds (2). The judge scores what it is shown: the clarification part 1.0 when it holds the assistant's
question and a `[user_agent]` reply, the final answer 1.0 when the conversation holds the calculation.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from forgerl.runners.cli import main as forge_run_main
from forgerl.harnesses import HARNESSES, HarnessError, McpServer, RunContext
from forgerl.runners.simulated_user import (USER_TURN_PREFIX, Persona, Rounds, SimulatedUser, UserModel,
                                            UserModelError, hold_dialogue, refusal)
from forgerl.schema.messages import Message, Part
from forgerl.schema.store import read_table

from harness_checks import FORGE_RUN
from scripted_upstream import Request, ScriptedUpstream, Turn, last_user_text
from test_claweval import CLAWEVAL, HARNESS_MODELS, JUDGE_MODEL
from test_runner_kubernetes import NS, cluster  # noqa: F401 - cluster: the fixture (kmock's API and a fake kubelet)

USER_MODEL = "scripted-user"
C01 = "C01zh_mortgage_prepay"
ENDLESS = "C01zh_endless"  # C01zh with a user who never knows the numbers, and max_rounds 2
NEVER_KNOWS = "你记不清任何贷款数字。"
QUESTION = "请问贷款总额、利率、还款方式和已还期数分别是多少？"
ASK_AGAIN = "没有这些数字我没法算，能再查一下贷款总额吗？"
FINAL = "剩余本金约133万：提前还15万选缩短年限更省利息，选减少月供每月压力更小，建议缩短年限。"
FOLLOW_UP_ANSWER = "缩短年限大约能少还4年，总利息少约20万。"
INFO = "贷款150万，30年等额本息，现在利率3.75%，已还60期。"
FOLLOW_UP = "那缩短年限能少还几年？"
DONT_KNOW = "不太清楚具体数字。"


# ------------------------------------------------------------------ the three scripted models


def _conversation(request: Request) -> str:
    body = request.body
    return json.dumps(body.get("messages") or body.get("input") or body.get("contents") or [], ensure_ascii=False)


def user_says(request: Request) -> Turn:
    """The user model: C01zh's user gives the numbers, asks one follow-up, then is done; the other never knows."""
    system, transcript = request.body["messages"][0]["content"], last_user_text(request)
    if NEVER_KNOWS in system:
        return Turn(text=DONT_KNOW)
    answers = transcript.count("[助手]:")
    return Turn(text=INFO if answers == 1 else FOLLOW_UP if answers == 2 else "好的，明白了。[DONE]")


def judge_says(request: Request) -> Turn:
    """The judge: each rubric's part 1.0 when the conversation shown holds what it asks for, else 0."""
    shown = last_user_text(request)
    wanted = (QUESTION, "[user_agent]") if "澄清提问质量" in shown else (FINAL,)
    score = 1.0 if all(w in shown for w in wanted) else 0.0
    return Turn(text=json.dumps({"score": score, "reasoning": "scripted judge"}))


def agent_says(request: Request) -> Turn:
    """The harness's model: asks for the numbers, calculates once it has them, answers the follow-up."""
    conversation = _conversation(request)
    replies, knows = conversation.count("[user_agent]"), "150万" in conversation
    if not replies:
        return Turn(text=QUESTION)
    if not knows:
        return Turn(text=ASK_AGAIN)
    return Turn(text=FINAL if replies == 1 else FOLLOW_UP_ANSWER)


class Models:
    """The three models behind one scripted upstream; keeps what the user model and the judge were shown."""

    def __init__(self) -> None:
        self.user_prompts: list[list[dict]] = []
        self.judge_prompts: list[str] = []

    def __call__(self, request: Request) -> Turn:
        model = request.body.get("model")
        if model == USER_MODEL:
            self.user_prompts.append(request.body["messages"])
            return user_says(request)
        if model == JUDGE_MODEL:
            self.judge_prompts.append(last_user_text(request))
            return judge_says(request)
        return agent_says(request)


# ------------------------------------------------------------------ each harness's resume command


MESSAGE = USER_TURN_PREFIX + INFO
MCP = McpServer("claweval", ("python", "-m", "server"))


def _ctx(tmp_path: Path, servers: tuple[McpServer, ...] = ()) -> RunContext:
    (tmp_path / "home").mkdir(exist_ok=True)
    return RunContext("the prompt", tmp_path, tmp_path / "home", "http://127.0.0.1:8787", "sess-1", "m1",
                      mcp_servers=servers)


@pytest.mark.parametrize("name,expected", [
    ("claude-code", lambda exe: [exe, "-p", MESSAGE, "--output-format", "json", "--dangerously-skip-permissions",
                                 "--model", "m1", "--continue"]),
    ("gemini-cli", lambda exe: [exe, "--resume", "latest", "--yolo", "--output-format", "json", "-m", "m1", "-p",
                                MESSAGE]),
    ("qwen-code", lambda exe: [exe, "--continue", "--auth-type", "openai", "--yolo", "--output-format", "json",
                               "-m", "m1", MESSAGE]),
    ("opencode", lambda exe: [exe, "run", "--continue", "--format", "json", "--title", "sess-1", MESSAGE]),
    ("openclaw", lambda exe: [exe, "agent", "--local", "--session-id", "sess-1", "--message", MESSAGE, "--json"]),
    ("pi", lambda exe: [exe, "-p", "--continue", "--mode", "json", "--provider", "forgerl", "--model", "m1",
                        MESSAGE]),
])
def test_resume_argv(tmp_path, name, expected):
    """The next user turn goes to the session the last run left, as each CLI's --help says it resumes."""
    harness = HARNESSES[name]
    argv, env = harness.full_command("/bin/h", _ctx(tmp_path), reply=MESSAGE)
    assert argv == expected("/bin/h")
    assert env == harness.full_command("/bin/h", _ctx(tmp_path))[1]  # the same configuration as the first run
    assert harness.resumes


def test_codex_resumes_with_its_options_and_mcp_servers_after_resume(tmp_path):
    """`codex exec resume --last` takes exec's options (the recorder's provider, -o, -m, the MCP servers) after
    `resume`, the message last."""
    argv, _ = HARNESSES["codex"].full_command("/bin/codex", _ctx(tmp_path, (MCP,)), reply=MESSAGE)
    first, _ = HARNESSES["codex"].full_command("/bin/codex", _ctx(tmp_path, (MCP,)))
    assert argv[:4] == ["/bin/codex", "exec", "resume", "--last"] and argv[-1] == MESSAGE
    assert argv[4:-1] == first[2:-1]  # every option of the first run, in the same order
    assert 'mcp_servers.claweval.command="python"' in argv and "-o" in argv and argv[argv.index("-m") + 1] == "m1"


def test_claude_code_resumes_with_its_mcp_config(tmp_path):
    argv, env = HARNESSES["claude-code"].full_command("/bin/claude", _ctx(tmp_path, (MCP,)), reply=MESSAGE)
    assert argv[:3] == ["/bin/claude", "-p", MESSAGE] and "--continue" in argv
    assert argv[-3:] == ["--strict-mcp-config", "--mcp-config", str(tmp_path / "home" / "mcp.json")]
    assert env["MCP_CONNECTION_NONBLOCKING"] == "0"


def test_qwen_code_runs_without_its_memory_subagent(tmp_path):
    """Qwen Code 0.24 otherwise ends every run (every round of a dialogue) with a call of its managed-memory
    subagent, which the grader would read as the session's last call."""
    ctx = _ctx(tmp_path)
    HARNESSES["qwen-code"].full_command("/bin/qwen", ctx, reply=MESSAGE)
    settings = json.loads((ctx.home / ".qwen" / "settings.json").read_text())
    assert settings["memory"] == {"enableManagedAutoMemory": False, "enableManagedAutoDream": False}


@pytest.mark.parametrize("name", ["mini-swe-agent", "zeroclaw", "browser-use"])
def test_harnesses_that_cannot_resume_refuse(tmp_path, name):
    harness = HARNESSES[name]
    assert not harness.resumes
    with pytest.raises(HarnessError, match=f"{name} cannot resume its session"):
        harness.full_command("/bin/h", _ctx(tmp_path), reply=MESSAGE)
    assert refusal(UserModel("http://u/v1", "m"), harness) == (
        f"needs a simulated user (user_agent persona), and {name} cannot resume its session to send it the "
        "user's replies")


# ------------------------------------------------------------------ the dialogue rounds


@pytest.fixture(scope="module")
def models():
    """One scripted upstream for the module's dialogues, and what its models were shown."""
    shown = Models()
    with ScriptedUpstream(shown) as up:
        yield up, shown


def _persona(max_rounds: int, never_knows: bool = False) -> Persona:
    return Persona("32岁的北京上班族，贷款150万。" + (NEVER_KNOWS if never_knows else ""), max_rounds, "提前还房贷划算吗？")


def _harness_double(answers: list[str | None]):
    """A harness session stand-in: answers in order, and keeps each turn's message (None: the prompt)."""
    sent: list[str | None] = []

    def turn(message: str | None) -> str | None:
        sent.append(message)
        return answers[len(sent) - 1]

    return turn, sent


def test_dialogue_ends_when_the_user_is_done(models):
    """Each final answer goes to the user model (ClawEval's prompt, persona and transcript, the [user_agent]
    prefix shown stripped), its reply back to the session prefixed; [DONE] after 2 replies ends it."""
    up, shown = models
    turn, sent = _harness_double([QUESTION, FINAL, FOLLOW_UP_ANSWER])
    first = len(shown.user_prompts)
    rounds = hold_dialogue(turn, _persona(8), SimulatedUser(UserModel(f"{up.url}/v1", USER_MODEL)))
    assert rounds == Rounds(rounds_used=2, max_rounds=8, done_reached=True)
    assert sent == [None, USER_TURN_PREFIX + INFO, USER_TURN_PREFIX + FOLLOW_UP]
    system, transcript = shown.user_prompts[-1][0]["content"], shown.user_prompts[-1][1]["content"]
    assert len(shown.user_prompts) - first == 3 and "32岁的北京上班族" in system and "[DONE]" in system
    assert (f"[用户]: 提前还房贷划算吗？\n[助手]: {QUESTION}\n[用户]: {INFO}\n[助手]: {FINAL}\n[用户]: {FOLLOW_UP}\n"
            f"[助手]: {FOLLOW_UP_ANSWER}") in transcript


def test_dialogue_stops_at_max_rounds(models):
    """A user never satisfied: max_rounds replies are sent, and the answer to the last one ends the dialogue."""
    up, _ = models
    turn, sent = _harness_double([QUESTION, ASK_AGAIN, ASK_AGAIN, "never asked"])
    rounds = hold_dialogue(turn, _persona(2, never_knows=True), SimulatedUser(UserModel(f"{up.url}/v1", USER_MODEL)))
    assert rounds == Rounds(rounds_used=2, max_rounds=2, done_reached=False)
    assert sent == [None, USER_TURN_PREFIX + DONT_KNOW, USER_TURN_PREFIX + DONT_KNOW]


def test_a_turn_without_an_answer_ends_the_dialogue(models):
    up, shown = models
    turn, sent = _harness_double([None])
    before = len(shown.user_prompts)
    rounds = hold_dialogue(turn, _persona(8), SimulatedUser(UserModel(f"{up.url}/v1", USER_MODEL)))
    assert (rounds, sent, len(shown.user_prompts)) == (Rounds(0, 8, False), [None], before)


def test_a_failing_user_model_is_an_error_not_the_end_of_the_dialogue(models):
    """UserAgent alone would retry 30 times and then read as [DONE]; here the first failed call (after the
    client's own 2 retries) raises."""
    up, _ = models
    turn, _ = _harness_double([QUESTION])
    start = time.monotonic()
    with pytest.raises(UserModelError, match=f"the user model at {up.url}/fault/500/v1 failed: InternalServerError"):
        hold_dialogue(turn, _persona(8), SimulatedUser(UserModel(f"{up.url}/fault/500/v1", USER_MODEL)))
    assert time.monotonic() - start < 20


# ------------------------------------------------------------------ the dialogue as C01zh's grader reads it


class ShownJudge:
    """A judge double for a grader called in-process: keeps each conversation it is shown, scores 1.0."""

    def __init__(self) -> None:
        self.shown: list[str] = []

    def evaluate(self, task_prompt: str, conversation: str, actions: str, rubric: str):
        from claw_eval.graders.llm_judge import JudgeResult
        self.shown.append(conversation)
        return JudgeResult(score=1.0, reasoning="shown")


@pytest.mark.parametrize("as_recorded", [
    lambda text: (Part("text", text=text),),  # Codex, Gemini CLI, OpenCode, pi
    lambda text: (Part("text", text=f"[Fri 2026-12-04 03:04 UTC] {text}"),),  # OpenClaw's envelope
    lambda text: (Part("text", text="<system-reminder>\nThe current date is: Friday.\n</system-reminder>"),
                  Part("text", text=text)),  # Claude Code, Qwen Code: a reminder part before the turn
], ids=["plain", "openclaw", "reminder"])
def test_user_turns_reach_the_grader_as_the_user_wrote_them(as_recorded):
    """However a harness wraps a user turn in its requests, the trace gives it to the grader as sent, so C01zh's
    grader splits the dialogue at the last `[user_agent]` turn: the clarification part ends there."""
    from claw_eval.graders.registry import get_grader
    from claw_eval.models.task import TaskDefinition
    from forgerl.runners.kinds.claweval_trace import trace

    task = TaskDefinition.from_yaml(CLAWEVAL / "tasks" / C01 / "task.yaml")
    said = [Message("user", as_recorded(task.prompt.text)), Message("assistant", (Part("text", text=QUESTION),)),
            Message("user", as_recorded(USER_TURN_PREFIX + INFO)), Message("assistant", (Part("text", text=FINAL),))]
    messages, _ = trace(said, task)
    judge = ShownJudge()
    scores = get_grader(C01, tasks_dir=CLAWEVAL / "tasks").grade(messages, [], task, judge=judge)
    clarification, whole = judge.shown
    assert clarification == f"[USER]: {task.prompt.text}\n[ASSISTANT]: {QUESTION}\n[USER]: [user_agent]\n{INFO}"
    assert FINAL in whole and "system-reminder" not in whole and scores.completion == 1.0


# ------------------------------------------------------------------ forge-run


@pytest.mark.parametrize("args,says", [
    ([], "skipping C01zh_mortgage_prepay: needs a simulated user (user_agent persona): give forge-run "
         "--user-model URL --user-model-name M"),
    (["--user-model", "http://127.0.0.1:9/v1", "--user-model-name", "u", "--harness", "mini-swe-agent"],
     "skipping C01zh_mortgage_prepay: needs a simulated user (user_agent persona), and mini-swe-agent cannot "
     "resume its session"),
    (["--user-model", "http://127.0.0.1:9/v1"], "forge-run: --user-model URL and --user-model-name M go together"),
])
def test_forge_run_says_why_it_does_not_run_the_dialogue(tmp_path, capsys, args, says):
    harness = [] if "--harness" in args else ["--harness", "claude-code"]
    code = forge_run_main([str(CLAWEVAL / "tasks" / C01), *harness, "--upstream", "http://127.0.0.1:9",
                           "--out", str(tmp_path / "data"), *args])
    assert code != 0 and says in capsys.readouterr().err


def _bench(tmp_path: Path) -> Path:
    """C01zh as it is, and its copy whose user never knows the numbers (max_rounds 2)."""
    bench = tmp_path / "bench"
    (bench / "mock_services").mkdir(parents=True)
    shutil.copytree(CLAWEVAL / "tasks" / C01, bench / "tasks" / C01)
    shutil.copytree(CLAWEVAL / "tasks" / C01, bench / "tasks" / ENDLESS)
    spec = bench / "tasks" / ENDLESS / "task.yaml"
    text = spec.read_text().replace(f"task_id: {C01}", f"task_id: {ENDLESS}").replace("max_rounds: 8", "max_rounds: 2")
    spec.write_text(text.replace("  persona: |\n", f"  persona: |\n    {NEVER_KNOWS}\n"))
    return bench


@pytest.mark.slow
@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_c01zh_dialogues_end_to_end(tmp_path, harness):
    """Both dialogues (at once) through the real harness, resumed in its own session for each user turn: one reaches
    [DONE] after 2 rounds, one runs out of rounds; the task's own grader scores the whole dialogue (user turns
    prefixed as ClawEval's loop logs them), the outcome says how the rounds went, and every call of a dialogue
    continues one thread."""
    shown = Models()
    with ScriptedUpstream(shown) as up:
        r = subprocess.run([FORGE_RUN, str(_bench(tmp_path)), "--harness", harness, "--upstream", up.url,
                            "--model", HARNESS_MODELS[harness], "--parallel", "2", "--retries", "0",
                            "--out", str(tmp_path / "data"),
                            "--judge", f"{up.url}/v1", "--judge-model", JUDGE_MODEL,
                            "--user-model", f"{up.url}/v1", "--user-model-name", USER_MODEL],
                           capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["task_id"]: row for row in read_table(tmp_path / "data", "outcomes").to_pylist()}
    done, endless = rows[C01], rows[ENDLESS]
    for row in (done, endless):
        assert row["status"] in ("success", "failed"), (row["error"], json.loads(row["extra"]).get("stderr_tail"))
    assert json.loads(done["extra"])["user_agent"] == {"rounds_used": 2, "max_rounds": 8, "done_reached": True}
    assert json.loads(endless["extra"])["user_agent"] == {"rounds_used": 2, "max_rounds": 2, "done_reached": False}
    assert json.loads(done["extra"])["final_answer"] == FOLLOW_UP_ANSWER
    # C01zh's grader: 0.8 * completion + 0.2 robustness, completion = 0.2 clarification + 0.8 final answer
    assert (done["reward"], done["passed"]) == (pytest.approx(1.0), True)
    assert (endless["reward"], endless["passed"]) == (pytest.approx(0.8 * 0.2 + 0.2), False)
    assert any(f"[USER]: [user_agent]\n{FOLLOW_UP}" in p and FINAL in p for p in shown.judge_prompts)
    calls = read_table(tmp_path / "data", "calls").to_pylist()
    for row, runs in ((done, 3), (endless, 3)):
        placed = [c for c in calls if c["session_id"] == row["session_id"] and c["segment_index"] is not None]
        assert {c["segment_index"] for c in placed} == {0}, [(c["segment_index"], c["segment_reason"]) for c in placed]
        assert len(placed) >= runs  # one model call per harness run at least: the resumed runs are in the thread


@pytest.mark.slow
def test_c01zh_dialogue_in_a_kubernetes_pod(cluster, tmp_path):  # noqa: F811 - the imported fixture
    """On the Kubernetes runner the pod holds the dialogue (pod.py runs the same `run_attempt`): the user model's
    name and its model-keys sidecar's loopback URL reach it in its environment, the sidecar forwards the user
    model's calls to the real URL, the rounds come back in the outcome."""
    bench, out = _bench(tmp_path), tmp_path / "data"
    with ScriptedUpstream(Models()) as up:
        r = subprocess.run([FORGE_RUN, str(bench), "--task", C01, "--harness", "codex", "--upstream", up.url,
                            "--model", HARNESS_MODELS["codex"], "--retries", "0", "--out", str(out),
                            "--runner", "kubernetes", "--kube-api", cluster.url, "--namespace", NS,
                            "--image", "forgerl/rollout:test", "--pod-tasks", str(bench), "--pod-dataset", str(out),
                            "--user-model", f"{up.url}/v1", "--user-model-name", USER_MODEL],
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    [row] = read_table(out, "outcomes").to_pylist()
    extra = json.loads(row["extra"])
    assert (row["runner"], row["status"]) == ("kubernetes", "failed"), (row["error"], extra.get("pod_log_tail"))
    assert extra["user_agent"] == {"rounds_used": 2, "max_rounds": 8, "done_reached": True}
    assert row["reward"] == pytest.approx(0.2)  # no judge: its parts score 0, robustness 1.0 stays
    [pod] = cluster.pods()
    env = {e["name"]: e["value"] for e in pod["manifest"]["spec"]["containers"][0]["env"]}
    assert (env["FORGE_USER_MODEL_URL"], env["FORGE_USER_MODEL_NAME"]) == ("http://127.0.0.1:8791/user", USER_MODEL)
    [holder] = pod["manifest"]["spec"]["initContainers"]
    assert {e["name"]: e["value"] for e in holder["env"]} == {"FORGE_USER_MODEL_URL": f"{up.url}/v1"}
