"""Task loading, the OpenClaw transcript built from canonical messages, grading and reward arithmetic."""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import pytest

from forgerl.runners import grading
from forgerl.runners.grade_code import run_grade
from forgerl.runners.grading import NOT_GRADED, GradeInput, GradingError, combine, grade_workspace, reads_transcript
from forgerl.runners.loader import find_task, load_tasks
from forgerl.runners.tasks import Task, TaskError
from forgerl.runners.transcript import openclaw_events
from forgerl.schema.messages import Message, Part

from runner_fixtures import BENCH, NOVEL_TASK, SPARQL_QUERY, SPARQL_SCORE, SPARQL_TASK, toml_task


def test_loads_every_shipped_qwenclawbench_task():
    tasks = load_tasks(BENCH)
    assert len(tasks) == 34
    for task in tasks:
        assert task.prompt and "def grade(" in task.grader and task.timeout_s == 1800
        assert all(f.source.is_file() for f in task.files), task.id
        assert task.grading_type == "hybrid" and set(task.weights) == {"automated", "llm_judge"}
    sparql = find_task(BENCH, SPARQL_TASK)
    assert sparql.weights == {"automated": 0.5, "llm_judge": 0.5}
    assert [f.dest for f in sparql.files][:2] == ["data/ontology_spec.ttl", "data/sample_reviews.ttl"]
    assert "SPARQL" in sparql.prompt and "## " not in sparql.prompt


def test_single_file_and_plain_folder(tmp_path):
    path = toml_task(tmp_path / "t", "alpha", "return {'x': 1.0}")
    [task] = load_tasks(path)
    assert task.id == "alpha" and task.memory_mb == 1024 and task.timeout_s == 60
    assert task.files[0].dest == "in/seed.txt" and task.files[0].source == tmp_path / "t" / "seed.txt"
    toml_task(tmp_path / "t", "beta", "return {'x': 0.0}")
    assert [t.id for t in load_tasks(tmp_path / "t")] == ["alpha", "beta"]


@pytest.mark.parametrize("text, message", [
    ('id = "x"\nprompt = "p"\n', "missing key 'grading'"),
    ('id = "x"\nprompt = "p"\n[grading]\ncode = "x"\n[[workspace_files]]\nsource = "a"\ndest = "../a"\n',
     r"workspace_files\[0\].dest = '../a': expected a relative path inside the workspace"),
    ('id = "x"\nprompt = "p"\n[grading]\ncode = "x"\nweights = {automated = -1}\n',
     "grading.weights.automated = -1: expected greater than or equal to 0"),
    ("id = \n", "Invalid"),
])
def test_bad_task_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(TaskError, match=message):
        load_tasks(path)


def test_a_folder_no_kind_claims_is_read_file_by_file(tmp_path):
    """Each file goes to the kind that claims it (QwenClawBench markdown beside forgerl TOML); others are left."""
    toml_task(tmp_path, "alpha", "return {'x': 1.0}")
    (tmp_path / "task_beta.md").write_text((BENCH / "tasks" / f"{SPARQL_TASK}.md").read_text())
    (tmp_path / "README.md").write_text("not a task")
    assert [t.id for t in load_tasks(tmp_path)] == ["alpha", SPARQL_TASK]


def test_missing_and_empty_task_paths(tmp_path):
    with pytest.raises(TaskError, match="no such task file or folder"):
        load_tasks(tmp_path / "nope")
    with pytest.raises(TaskError, match="no task files"):
        load_tasks(tmp_path)


def test_openclaw_events_from_canonical_messages():
    messages = [
        Message("system", (Part("text", text="be brief"),)),
        Message("user", (Part("text", text="write q"),)),
        Message("assistant", (Part("reasoning", text="hmm"), Part("text", text="ok"),
                              Part("tool_call", tool_name="Bash", call_id="c1", arguments='{"command": "ls"}'))),
        Message("user", (Part("tool_result", call_id="c1", content=(Part("text", text="a.txt"),), is_error=True),)),
        Message("assistant", (Part("text", text="done"),)),
    ]
    events = openclaw_events(messages)
    assert [e["message"]["role"] for e in events] == ["user", "assistant", "toolResult", "assistant"]
    assert all(e["type"] == "message" for e in events)
    assert events[1]["message"]["content"] == [
        {"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "ok"},
        {"type": "toolCall", "id": "c1", "name": "Bash", "arguments": {"command": "ls"}}]
    assert events[2]["message"] == {"role": "toolResult", "content": [{"type": "text", "text": "a.txt"}],
                                    "toolCallId": "c1", "isError": True}


def test_reward_is_the_graded_parts_weighted_mean():
    sparql = find_task(BENCH, SPARQL_TASK)
    scores = {"a": 1.0, "b": 0.0, "c": 0.5}
    r = combine(sparql, scores)
    assert r.reward == pytest.approx(0.5)  # no judge: the automated mean itself
    assert r.graded == {"automated": {"weight": 0.5, "score": pytest.approx(0.5)}, "llm_judge": NOT_GRADED}
    judged = combine(sparql, scores, judge_score=1.0)
    assert judged.reward == pytest.approx(0.75)
    assert judged.graded["llm_judge"] == {"weight": 0.5, "score": 1.0}


def test_grade_runs_the_real_checks_on_a_workspace(tmp_path):
    sparql = find_task(BENCH, SPARQL_TASK)
    assert grade_workspace(sparql, [], tmp_path)["file_created"] == 0.0
    (tmp_path / "query_output.sparql").write_text(SPARQL_QUERY)
    scores = grade_workspace(sparql, [], tmp_path)
    assert sum(scores.values()) / len(scores) == pytest.approx(SPARQL_SCORE)
    assert scores["no_reviewer_name"] == 0.0
    novel = find_task(BENCH, NOVEL_TASK)
    transcript = [{"type": "message", "message": {"role": "assistant",
                                                  "content": [{"type": "text", "text": "The Borrowed Mind"}]}}]
    assert grade_workspace(novel, transcript, tmp_path)["novel_title_mentioned"] == 1.0


@pytest.mark.parametrize("code, reads", [
    ("def grade(transcript, workspace_path):\n    return {'a': 1.0}", False),
    ("import os\ndef grade(t, w):\n    return {'a': float(os.path.exists(w))}", False),
    ("def grade(transcript, w):\n    return {'a': float(len(transcript))}", True),
    ("def grade(transcript, w):\n    def inner():\n        return transcript\n    return {'a': 0.0}", True),
    ("def grade(transcript, w, t=None):\n    return {'a': 0.0}\ngrade = (lambda f: f)(grade)", True),
    ("@staticmethod\ndef grade(transcript, w):\n    return {}", True),
    ("def grade(*args):\n    return {}", True),
    ("def grade(transcript, w):\n    return {'a': float(len(locals()))}", True),
    ("def helper():\n    return sys._getframe(1)\nimport sys\ndef grade(t, w):\n    helper()\n    return {}", True),
    ("from inspect import currentframe\ndef grade(t, w):\n    return {}", True),
    ("from grading_lib import grade", True),
    ("def grade(transcript, w):\n    return {'a': 1.0", True),  # a syntax error: the child says so
])
def test_reads_transcript_is_false_only_when_grade_cannot_look(code, reads):
    assert reads_transcript(code) is reads


class Untouchable:
    """A transcript that fails any look at it."""

    def _fail(self, *args, **kwargs):
        raise AssertionError("the grader looked at its transcript")

    __iter__ = __len__ = __getitem__ = __contains__ = __bool__ = __eq__ = __reversed__ = __str__ = __repr__ = _fail


def test_graders_said_not_to_read_the_transcript_never_touch_it(tmp_path):
    """The 21 QwenClawBench graders classed as files-only grade alike with an untouchable transcript and an
    empty one, on an empty workspace and on the SPARQL task's answer."""
    files_only = [t for t in load_tasks(BENCH) if not t.grader_reads_transcript]
    assert len(files_only) == 21
    (tmp_path / "query_output.sparql").write_text(SPARQL_QUERY)
    for workspace in (tmp_path / "empty", tmp_path):
        workspace.mkdir(exist_ok=True)
        for task in files_only:
            assert run_grade(task.grader, Untouchable(), str(workspace)) == run_grade(task.grader, [], str(workspace))


def test_score_reads_the_calls_back_only_for_a_grader_that_reads_them(tmp_path, monkeypatch):
    read = []
    monkeypatch.setattr(grading, "rollout_messages", lambda root, session: read.append(session) or [])
    run = GradeInput(tmp_path / "data", "s1", tmp_path)
    assert find_task(BENCH, SPARQL_TASK).score(run)["file_created"] == 0.0 and read == []
    assert "novel_title_mentioned" in find_task(BENCH, NOVEL_TASK).score(run) and read == ["s1"]


@pytest.mark.parametrize("body, message", [
    ("raise KeyError('boom')", "KeyError: 'boom'"),
    ("return {'a': 'high'}", "not a number"),
    ("return [1]", "expected a dict"),
])
def test_broken_graders_are_errors(tmp_path, body, message):
    task = load_tasks(toml_task(tmp_path / "t", "g", body))[0]
    with pytest.raises(GradingError, match=message):
        grade_workspace(task, [], tmp_path)


def test_a_hanging_grader_is_stopped(tmp_path):
    task = load_tasks(toml_task(tmp_path / "t", "g", "import time\ntime.sleep(60)"))[0]
    start = time.monotonic()
    with pytest.raises(GradingError, match="ran past 1 s"):
        grade_workspace(task, [], tmp_path, timeout=1)
    assert time.monotonic() - start < 10


def test_a_grader_that_dies_is_an_error(tmp_path):
    task = load_tasks(toml_task(tmp_path / "t", "g", "import os\nos._exit(3)"))[0]
    with pytest.raises(GradingError, match="died without an answer"):
        grade_workspace(task, [], tmp_path)


def test_a_grader_runs_in_the_workspace_and_can_wait_for_its_own_processes(tmp_path):
    body = ("import os, subprocess\nprint('noise')\n"
            "return {'cwd': float(os.getcwd() == str(ws)), 'exit': float(subprocess.run(['false']).returncode)}")
    task = load_tasks(toml_task(tmp_path / "t", "g", body))[0]
    assert grade_workspace(task, [], tmp_path / "t") == {"cwd": 1.0, "exit": 1.0}


def test_a_grader_forks_from_the_small_server_without_the_dataset_reader(tmp_path):
    """A grade (and a jail) is a fork of a warm parent: one that had imported pyarrow cost twice the CPU per
    grade, and urllib with ssl was a third of the small server's memory."""
    heavy = "('pyarrow', 'forgerl.schema', 'ssl', 'urllib.request')"
    body = f"import sys\nreturn {{'small': float(not any(m.startswith({heavy}) for m in sys.modules))}}"
    task = load_tasks(toml_task(tmp_path / "t", "g", body))[0]
    assert grade_workspace(task, [], tmp_path) == {"small": 1.0}


def test_only_a_grade_that_reads_files_alone_is_left_to_the_jail(tmp_path):
    """`Task.jail_grader`: the default `score`'s grade() when it cannot look at the transcript; a grader that may
    read it waits for the recorded calls, and a kind with a `score` of its own grades its own way."""
    files = load_tasks(toml_task(tmp_path / "f", "f", "return {'a': float((ws / 'x').exists())}"))[0]
    reads = load_tasks(toml_task(tmp_path / "r", "r", "return {'a': float(bool(transcript))}"))[0]
    assert files.jail_grader == files.grader and reads.jail_grader == ""

    @dataclass(frozen=True)
    class OwnScore(Task):
        def score(self, run):
            return {"own": 1.0}

    assert OwnScore(**{f.name: getattr(files, f.name) for f in fields(Task)}).jail_grader == ""
