"""Every task format is checked when it loads, before anything starts: through `forge-run` (its `main`; once as the real process), a wrong type,
a missing key, a key the format does not define, or grader code that does not compile is one line naming the file
and the key (or line), exit 2, no traceback and no output folder. README.md's "Bad input and what each verb answers"
lists these cases.

Also: ClawEval's tasks that share another task's fixtures (T087, T092) load with them, found as ClawEval finds them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from forgerl.runners.cli import main
from forgerl.runners.loader import load_tasks
from forgerl.runners.rollout import prepare_workspace

from verb_checks import assert_refused, verb

REPO = Path(__file__).resolve().parents[1]
CLAWEVAL = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "claweval"
HARBOR = Path(__file__).parent / "fixtures" / "harbor"
GRADER = '[grading]\ncode = """\ndef grade(transcript, workspace_path):\n    return {"ok": 1.0}\n"""\n'
TOML = f'id = "t"\nprompt = "Say hi."\ntimeout_seconds = 60\n[limits]\nmemory_mb = 1024\n{GRADER}'
FRONT = "---\nid: task_t\ngrading_type: automated\ntimeout_seconds: 60\nworkspace_files: []\n---\n"
BODY = "## Prompt\n\nSay hi.\n\n## Automated Checks\n\n```python\ndef grade(transcript, workspace_path):\n" \
       "    return {'ok': 1.0}\n```\n"


def refused(task_path: Path, tmp_path: Path, message: str, capsys: pytest.CaptureFixture) -> None:
    """forge-run's `main` (the console script's, with its verb wrapper) on `task_path` answers with one line holding
    `message`, exit 2, and leaves no dataset. In-process: 24 interpreter starts would cost a minute of CI."""
    out = tmp_path / "out"
    assert main([str(task_path), "--harness", "codex", "--upstream", "http://127.0.0.1:9", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err, err
    assert not out.exists()


def test_the_console_script_refuses_a_bad_task_in_one_line(tmp_path):
    """The real `forge-run` process answers as its `main` does."""
    (tmp_path / "t.toml").write_text(TOML.replace("memory_mb = 1024", 'memory_mb = "lots"'))
    out = tmp_path / "out"
    assert_refused(verb("forge-run", str(tmp_path / "t.toml"), "--harness", "codex", "--upstream",
                        "http://127.0.0.1:9", "--out", str(out)),
                   "t.toml: limits.memory_mb = 'lots': expected a valid integer")
    assert not out.exists()


@pytest.mark.parametrize("text, message", [
    (TOML.replace("memory_mb = 1024", 'memory_mb = "lots"'),
     "t.toml: limits.memory_mb = 'lots': expected a valid integer"),
    (TOML + '[[workspace_files]]\nsource = "seed.txt"\n', "t.toml: missing key 'workspace_files[0].dest'"),
    (TOML.replace("timeout_seconds", "timeout_secondz"), "t.toml: unknown key 'timeout_secondz' (expected one of: "
                                                         "id, prompt, timeout_seconds, workdir, limits, workspace_files, "
                                                         "grading)"),
    (TOML.replace("timeout_seconds = 60", 'timeout_seconds = 60\nworkdir = "/app/x"'),
     "t.toml: workdir = '/app/x': expected an absolute path of one folder under / (such as /workspace)"),
    (TOML.replace("timeout_seconds = 60", 'timeout_seconds = 60\nworkdir = "/tmp"'),
     "t.toml: workdir = '/tmp': expected a folder this machine does not have (the rollout's root would hide "
     "/tmp)"),
    (TOML.replace('prompt = "Say hi."\n', ""), "t.toml: missing key 'prompt'"),
    (TOML.replace('{"ok": 1.0}', '{"ok": 1.0'), "t.toml:9: [grading] code does not compile: '{' was never closed"),
    ('id = "t"\nprompt = \n', "t.toml: Invalid value (at line 2, column 10)"),
], ids=["wrong-type", "missing-dest", "unknown-key", "workdir-nested", "workdir-hides", "missing-key",
        "grader-syntax", "not-toml"])
def test_toml_task(tmp_path, text, message, capsys):
    (tmp_path / "t.toml").write_text(text)
    refused(tmp_path / "t.toml", tmp_path, message, capsys)


@pytest.mark.parametrize("front, body, message", [
    (FRONT.replace("timeout_seconds: 60", "timeout_seconds: soon"), BODY,
     "task_t.md: timeout_seconds = 'soon': expected a valid number"),
    (FRONT.replace("timeout_seconds", "timeout_secs"), BODY, "task_t.md: unknown key 'timeout_secs'"),
    (FRONT.replace("workspace_files: []", "workspace_files:\n- source: a.txt"), BODY,
     "task_t.md: missing key 'workspace_files[0].dest'"),
    (FRONT.replace("automated\n", "automatic\n"), BODY,
     "task_t.md: grading_type = 'automatic': expected 'automated', 'llm_judge' or 'hybrid'"),
    (FRONT, BODY.replace("return {'ok': 1.0}", "return {'ok': 1.0"),
     "task_t.md:16: ## Automated Checks does not compile: '{' was never closed"),
], ids=["wrong-type", "unknown-key", "missing-dest", "bad-choice", "grader-syntax"])
def test_qwenclawbench_task(tmp_path, front, body, message, capsys):
    (tmp_path / "task_t.md").write_text(front + "\n" + body)
    refused(tmp_path / "task_t.md", tmp_path, message, capsys)


def claweval_copy(tmp_path: Path, task: str = "T010_contact_lookup") -> Path:
    """A benchmark folder holding one real ClawEval task."""
    (tmp_path / "bench" / "mock_services").mkdir(parents=True)
    shutil.copytree(CLAWEVAL / "tasks" / task, tmp_path / "bench" / "tasks" / task)
    return tmp_path / "bench" / "tasks" / task


@pytest.mark.parametrize("old, new, message", [
    ("ready_timeout: 10", "ready_timeout: soon", "task.yaml: services[0].ready_timeout = 'soon': expected a valid "
                                                 "integer"),
    ("  language: en\n", "  languaje: en\n", "task.yaml: unknown key 'prompt.languaje' (expected one of: text, "
                                             "language, attachments)"),
    ("task_name: Contact Lookup\n", "", "task.yaml: missing key 'task_name'"),
    ("difficulty: easy", "difficulty: [easy", "task.yaml: not YAML"),
], ids=["wrong-type", "unknown-key", "missing-key", "not-yaml"])
def test_claweval_task(tmp_path, old, new, message, capsys):
    spec = claweval_copy(tmp_path) / "task.yaml"
    assert old in spec.read_text()
    spec.write_text(spec.read_text().replace(old, new))
    refused(spec.parent, tmp_path, message, capsys)


def test_claweval_grader_that_does_not_compile(tmp_path, capsys):
    grader = claweval_copy(tmp_path) / "grader.py"
    lines = grader.read_text().splitlines()
    lines[5] += " ("
    grader.write_text("\n".join(lines) + "\n")
    refused(grader.parent, tmp_path, "grader.py:6: grader does not compile", capsys)


@pytest.mark.parametrize("old, new, message", [
    ("memory_mb = 1024", 'memory_mb = "lots"', "task.toml: environment.memory_mb = 'lots': expected a valid integer"),
    ("memory_mb = 1024", 'memory = "lots"', "task.toml: environment.memory = 'lots': expected a size like '2G'"),
    ("[agent]\ntimeout_sec", "[agent]\ntimeout_secondz", "task.toml: unknown key 'agent.timeout_secondz' (expected "
                                                         "one of: timeout_sec, user, network_mode, allowed_hosts)"),
    ("allow_internet = false", 'allow_internet = false\n[[forgerl.services]]\nname = "s"\ncommand = ["true"]\n',
     "task.toml: missing key 'forgerl.services[0].port'"),
], ids=["wrong-type", "bad-size", "unknown-key", "service-without-port"])
def test_harbor_task(tmp_path, old, new, message, capsys):
    task = tmp_path / "hello"
    shutil.copytree(HARBOR / "hello", task)
    spec = task / "task.toml"
    assert old in spec.read_text()
    spec.write_text(spec.read_text().replace(old, new))
    refused(task, tmp_path, message, capsys)


@pytest.mark.parametrize("file, old, new, message", [
    ("tasks/shop-buy-sencha.toml", "timeout_seconds", "timeout_secondz", "shop-buy-sencha.toml: unknown key "
                                                                        "'timeout_secondz'"),
    ("tasks/shop-buy-sencha.toml", "== 1\"", "== \"", "shop-buy-sencha.toml: check 'one new order': expect does "
                                                      "not compile"),
    ("tasks/shop-buy-sencha.toml", 'name = "one new order"\n', "", "shop-buy-sencha.toml: missing key "
                                                                    "'checks[0].name'"),
    ("apps.toml", "port = 8101", 'port = "8101"', "apps.toml: shop.port = '8101': expected a valid integer"),
], ids=["unknown-key", "check-syntax", "check-without-name", "app-port-type"])
def test_web_task(tmp_path, file, old, new, message, capsys):
    bench = tmp_path / "web"
    shutil.copytree(REPO / "benchmarks" / "web", bench)
    spec = bench / file
    assert old in spec.read_text()
    spec.write_text(spec.read_text().replace(old, new, 1))
    refused(bench, tmp_path, message, capsys)


@pytest.mark.parametrize("task", ["T087_pinbench_market_news_brief", "T092_pinbench_daily_research_brief"])
def test_claweval_fixtures_shared_with_another_task_are_found_as_claweval_finds_them(task, tmp_path):
    """Their `sandbox_files` name T021zh's fixture relative to the benchmark folder: ClawEval's sandbox tries the
    task folder, then the benchmark folder; it lands at the same relative path in the workspace."""
    [loaded] = load_tasks(CLAWEVAL / "tasks" / task)
    rel = "tasks/T021zh_newsletter_curation/fixtures/rss/articles.json"
    assert loaded.unavailable == ""
    assert [(f.source.resolve(), f.dest) for f in loaded.files] == [((CLAWEVAL / rel).resolve(), rel)]
    prepare_workspace(loaded, tmp_path / "workspace")
    assert (tmp_path / "workspace" / rel).read_bytes() == (CLAWEVAL / rel).read_bytes()


def test_a_claweval_fixture_missing_everywhere_names_the_task_folder(tmp_path):
    folder = claweval_copy(tmp_path, "T087_pinbench_market_news_brief")
    [loaded] = load_tasks(folder)
    assert loaded.unavailable == (f"fixtures missing from this copy of ClawEval (expected in {folder}): "
                                  "tasks/T021zh_newsletter_curation/fixtures/rss/articles.json")
