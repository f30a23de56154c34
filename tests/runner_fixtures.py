"""Shared pieces of the runner tests: task-performing model scripts, tiny harnesses, process checks.

The scripts play the model behind the recorder: on the first call they ask
the harness's shell tool to create exactly the files a QwenClawBench task's
grade() checks, and once the tool result comes back they give a final
answer. The file contents are chosen so the expected score is known and not
trivial (some checks pass, some deliberately fail).
"""

from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from forgerl.recorder.scripted import Request, Script, ToolCall, Turn, saw_tool_result
from forgerl.runners.harnesses import Harness, RunContext

BENCH = Path("/work/shared/benchmarks/qwenclawbench")
if not BENCH.is_dir():  # the repository's sibling checkout of the shared folder
    BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "qwenclawbench"
SPARQL_TASK = "task_00067_write_sparql_query_for_product_reviews_containing_iphone"
NOVEL_TASK = "task_00043_read_memory_files_and_summarize_novel_preparation"

# 14 of task_00067's 15 checks pass: the query also selects ?reviewerName (the task's trap).
SPARQL_QUERY = """PREFIX pr: <http://www.example.org/product-review#>
SELECT ?reviewId ?reviewTitle ?reviewText ?reviewDate ?productName ?reviewerName WHERE {
  ?r pr:reviewId ?reviewId ; pr:reviewTitle ?reviewTitle ; pr:reviewText ?reviewText ;
     pr:reviewDate ?reviewDate ; pr:hasProduct ?p ; pr:reviewerName ?reviewerName .
  ?p pr:productName ?productName .
  FILTER(CONTAINS(?productName, "iPhone"))
}
"""
SPARQL_SCORE = 14 / 15
PERFECT_QUERY = SPARQL_QUERY.replace(" ?reviewerName WHERE", " WHERE").replace(" ; pr:reviewerName ?reviewerName", "")

# task_00043 grades the assistant's text: this answer passes 3 of its 8 checks exactly
# (title; genre/setting: literary + sci-fi + 2041; style: unreliable + dual timeline).
NOVEL_ANSWER = ("Summary: 'The Borrowed Mind' is a literary sci-fi novel set in 2041, told by an unreliable "
                "narrator across a dual timeline.")
NOVEL_SCORE = 3 / 8


def shell_call(request: Request, command: str) -> ToolCall:
    """The harness's own shell tool: Claude Code's Bash, Codex's exec_command."""
    if request.api == "anthropic":
        return ToolCall("Bash", {"command": command, "description": "write the answer file"})
    return ToolCall("exec_command", {"cmd": command})


def write_query(request: Request, query: str) -> Turn:
    cmd = f"cat > query_output.sparql <<'EOF'\n{query}EOF"
    return Turn(text="Writing the query.", tool_calls=[shell_call(request, cmd)])


def task_script(request: Request) -> Turn:
    """Performs task_00067 (writes query_output.sparql) or task_00043 (answers in text), by its prompt."""
    if "SPARQL" in str(request.body):
        return Turn(text="Wrote query_output.sparql.") if saw_tool_result(request) else write_query(request, SPARQL_QUERY)
    return Turn(text=NOVEL_ANSWER)


def alternating_script() -> Script:
    """Like `task_script`, but every other SPARQL rollout writes the perfect query (reward 1.0): 1 pass in 2."""
    rollouts = itertools.count()

    def script(request: Request) -> Turn:
        if "SPARQL" in str(request.body) and not saw_tool_result(request):
            return write_query(request, PERFECT_QUERY if next(rollouts) % 2 == 0 else SPARQL_QUERY)
        return task_script(request)

    return script


@dataclass
class PythonHarness(Harness):
    """A stand-in harness: a Python snippet as the agent (hangs, crashes, forks), run like any harness."""

    name: str = "python-snippet"
    cli: str = "python3"
    api: str = "none"
    code: str = ""

    def find(self) -> str:
        return sys.executable

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        return [exe, "-c", self.code], {"HOME": str(ctx.home), "FORGE_BASE_URL": ctx.base_url,
                                        "FORGE_SESSION_ID": ctx.session}


def rollout_processes(marker: str) -> list[int]:
    """PIDs whose command line carries `marker` (left-overs of a rollout)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def rollout_dirs() -> set[str]:
    import tempfile
    return {p.name for p in Path(tempfile.gettempdir()).glob("forgerl-rollout-*")}


def toml_task(folder: Path, task_id: str, grader_body: str, *, timeout_s: float = 60, memory_mb: int = 1024,
              prompt: str = "do it") -> Path:
    """A forgerl TOML task whose grade() runs `grader_body` (with `ws = Path(workspace_path)`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "seed.txt").write_text("seed\n")
    body = "\n".join("    " + line for line in grader_body.strip().splitlines())
    path = folder / f"{task_id}.toml"
    path.write_text(f'''id = "{task_id}"
prompt = "{prompt}"
timeout_seconds = {timeout_s}
[limits]
memory_mb = {memory_mb}
[[workspace_files]]
source = "seed.txt"
dest = "in/seed.txt"
[grading]
code = """
from pathlib import Path
def grade(transcript, workspace_path):
    ws = Path(workspace_path)
{body}
"""
''')
    return path
