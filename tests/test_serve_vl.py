"""Serve mode for a VL policy: screenshots go to the policy's vLLM-protocol chat endpoint.

The scripted VL policy plays vLLM's chat server with `return_token_ids`: it renders the messages
with the Qwen2.5-VL chat template (image_url items become vision tokens), expands each image pad
as transformers' Qwen2-VL image processor computes for the image it receives (vLLM's path: the HF
processor on the decoded image), and answers a browser action, then the answer. Claude Code +
Playwright MCP's shape drives it through `forge-record serve --policy`.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import anthropic
import httpx
import pytest

from forgerl.recorder.policy import HTTPPolicy, ScriptedPolicy, turns
from forgerl.recorder.serve import GatewayThread, PolicyGateway
from forgerl.schema.segments import ANSWER_HEADER, CONTINUES_HEADER
from forgerl.schema.toolcalls import FORMATS

from conftest import RecorderProcess, session_calls
from convert_fixtures import QwenChatUpstream, convert, rows
from gui_sessions import drive_anthropic, screenshot
from vl_checks import vl_tokenizer_dir


class ScriptedVLPolicy(QwenChatUpstream):
    """/v1/chat/completions like vLLM for a Qwen2.5-VL model: a tool call first, then the answer."""

    def __init__(self, tokenizer_dir: str):
        from transformers import AutoTokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        super().__init__(None, AutoTokenizer.from_pretrained(tokenizer_dir))  # its server, this answer()
        self.images = Qwen2VLImageProcessorPil.from_pretrained(tokenizer_dir)
        self.log: list[dict[str, Any]] = []
        self.start()

    def pads(self, url: str) -> int:
        from PIL import Image

        image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
        grid = self.images(images=[image], return_tensors="np")["image_grid_thw"][0]
        return int(grid.prod()) // self.images.merge_size ** 2

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        text = self.tokenizer.apply_chat_template(messages, tools=body.get("tools"), tokenize=False,
                                                  add_generation_prompt=True)
        urls = [item["image_url"]["url"] for m in messages if isinstance(m["content"], list)
                for item in m["content"] if item["type"] == "image_url"]
        pieces = text.split("<|image_pad|>")
        assert len(pieces) == len(urls) + 1
        text = pieces[0] + "".join("<|image_pad|>" * self.pads(url) + piece for url, piece in zip(urls, pieces[1:]))
        prompt_ids = self.tokenizer.encode(text, add_special_tokens=False)
        acted = any(m["role"] == "assistant" for m in messages)
        out = "The blue mug costs $12." if acted else \
            '<tool_call>\n{"name": "browser_click", "arguments": {"ref": "e1"}}\n</tool_call>'
        ids = self.tokenizer.encode(out, add_special_tokens=False) + [self.eos]
        self.log.append({"prompt_token_ids": prompt_ids, "token_ids": ids, "images": len(urls), "body": body})
        return {"id": "chatcmpl-vl", "object": "chat.completion", "model": body["model"],
                "prompt_token_ids": prompt_ids,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": out}, "token_ids": ids,
                             "finish_reason": "stop",
                             "logprobs": {"content": [{"token": str(i), "logprob": -0.5} for i in ids]}}]}


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return vl_tokenizer_dir(tmp_path_factory.mktemp("serve-vl-tokenizer") / "qwen2_5_vl")


@pytest.fixture(scope="module")
def served(vl_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("serve-vl")
    policy = ScriptedVLPolicy(str(vl_dir))
    root = base / "data"
    rec = RecorderProcess(root, None, "--policy", policy.url, "--tokenizer", str(vl_dir), "--served-model", "qwen-vl",
                          "--tool-format", "hermes").start()
    try:
        drive_anthropic(rec.base("vl"), 3)
        calls = session_calls(root, "vl", 2)
    finally:
        rec.stop()
        policy.stop()
    return root, vl_dir, policy.log, calls


def test_image_prompts_go_to_the_chat_endpoint_and_their_ids_are_recorded(served):
    _, _, log, calls = served
    assert [entry["images"] for entry in log] == [1, 2]  # the second call resends the first screenshot
    first_body = log[0]["body"]
    assert first_body["return_token_ids"] is True and first_body["model"] == "qwen-vl"
    assert [c["error"] for c in calls] == [None, None]
    for call, entry in zip(calls, log):
        assert call["prompt_token_ids"] == entry["prompt_token_ids"]
        assert call["completion_token_ids"] == entry["token_ids"]
        assert call["completion_logprobs"] == [-0.5] * len(entry["token_ids"])
    pad = json.loads(open(served[1] / "tokenizer.json").read())["added_tokens"]
    pad_id = next(t["id"] for t in pad if t["content"] == "<|image_pad|>")
    assert calls[0]["prompt_token_ids"].count(pad_id) == 322  # 640x400 -> 392x644 -> 28x46 patches / 4
    assert json.loads(calls[0]["response"])["content"][0]["name"] == "browser_click"  # the parsed tool call


def test_tokens_rows_keep_the_engine_ids_and_the_drift_report_checks_image_prompts(served, tmp_path):
    root, vl_dir, log, calls = served
    manifest = convert(root, tmp_path / "t", "--to", "tokens", "--tokenizer", str(vl_dir), "--drift", "all")
    # Qwen2.5-VL's template drops an assistant turn's tool calls from history, so the engine's second
    # prompt does not extend the first answer's ids: the gateway claims no continuation, two segments
    assert [c["segment_index"] for c in calls] == [0, 1]
    by_call = {r["call_ids"][0]: r for r in rows(tmp_path / "t")}
    for call, entry in zip(calls, log):
        row = by_call[call["call_id"]]
        assert not row["retokenized"] and row["input_ids"] == entry["prompt_token_ids"] + entry["token_ids"]
    # each recorded input re-rendered with its images expanded as veRL counts them equals the engine's prompt
    report = manifest["drift"]["prompt_rerender"]
    assert (report["checked"], report["differ"]) == (2, 0)


def test_the_drift_report_says_where_image_tokens_differ(served, tmp_path):
    """Re-rendered with an image processor that resizes otherwise (a lower max_pixels than the engine's),
    each image prompt differs from the engine's ids, and the report says it is the image tokens."""
    root, vl_dir, _, _ = served
    other = vl_tokenizer_dir(tmp_path / "small-images")
    config = json.loads((other / "preprocessor_config.json").read_text())
    config["size"]["longest_edge"] = 100_000  # 640x400 screenshots now shrink: fewer pads than the engine used
    (other / "preprocessor_config.json").write_text(json.dumps(config))
    report = convert(root, tmp_path / "t", "--to", "tokens", "--tokenizer", str(other), "--drift", "all")["drift"]
    assert (report["prompt_rerender"]["differ"], report["prompt_rerender"]["where"]) == (2, {"image_tokens": 2})
    example = report["examples"][0]
    assert example["kind"] == "image_tokens" and "<|image_pad|>" in example["engine"]


IMAGE_CALL = {"model": "claude-gui", "max_tokens": 256, "tools": [
    {"name": "browser_click", "description": "Click", "input_schema": {"type": "object", "properties": {
        "ref": {"type": "string"}}}}],
    "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Find the price of the blue mug."},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(screenshot(0)).decode()}}]}]}


def test_a_streamed_image_call_is_streamed_by_the_gateway_as_any_other(vl_dir):
    """The chat endpoint answers whole; the gateway streams that turn through the same writer, with the same
    headers, as a token-in turn: a tool-use block, the engine's prompt ids counted as the input."""
    from transformers import AutoTokenizer

    policy = ScriptedVLPolicy(str(vl_dir))
    tokenizer = AutoTokenizer.from_pretrained(vl_dir)
    try:
        with GatewayThread(PolicyGateway(HTTPPolicy(policy.url, "qwen-vl"), tokenizer, "qwen-vl",
                                         fmt=FORMATS["hermes"])) as url:
            client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
            with client.messages.stream(**IMAGE_CALL) as stream:
                message = stream.get_final_message()
                headers = stream.response.headers
    finally:
        policy.stop()
    assert [(b.type, b.name, b.input) for b in message.content] == [("tool_use", "browser_click", {"ref": "e1"})]
    assert message.stop_reason == "tool_use"
    assert message.usage.input_tokens == len(policy.log[0]["prompt_token_ids"])
    assert message.usage.output_tokens == len(policy.log[0]["token_ids"])
    assert headers[ANSWER_HEADER].startswith("fa_") and headers[CONTINUES_HEADER] == ""


def test_an_image_call_without_a_chat_endpoint_is_refused_and_a_failed_one_is_a_502(vl_dir):
    """A scripted policy has no chat endpoint: 400, saying what would serve it. A chat endpoint that cannot be
    reached: 502, before any stream starts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vl_dir)
    for policy, status, needle in [(ScriptedPolicy(tokenizer, turns("never said")), 400, "needs --policy URL"),
                                   (HTTPPolicy("http://127.0.0.1:9", "qwen-vl"), 502, "policy chat endpoint")]:
        with GatewayThread(PolicyGateway(policy, tokenizer, "qwen-vl", fmt=FORMATS["hermes"])) as url:
            for streamed in (False, True):
                r = httpx.post(url + "/v1/messages", json={**IMAGE_CALL, "stream": streamed}, timeout=30)
                assert r.status_code == status and needle in r.json()["error"]["message"], r.text
