"""The project's own policy server: a torch checkpoint behind the token protocol the serve-mode gateway speaks.

`forge-train rl --engine torch` serves each iteration's weights with it rather
than with vLLM. vLLM CPU 0.32 can take new weights in place only through its
development endpoints (`VLLM_SERVER_DEV_MODE=1`, "should NOT be used in
production"): `POST /collective_rpc {"method": "reload_weights", "kwargs":
{"weights_path": DIR}}` answers, but `/v1/models` keeps reporting the first
folder as `root`, so rollouts could not tell the versions apart; `sleep` /
`wake_up` are no-ops on CPU (`CPUWorker` logs "sleep mode is not supported on
CPU"); restarting it per iteration costs its start-up. This server loads a
checkpoint folder with transformers in the dtype it was saved in and answers:

- `POST /v1/completions`: `prompt` as token ids, `max_tokens` (capped by the
  server's own, if given), `temperature`, `top_p`, `seed`; the sampled ids in `choices[0].token_ids` and their raw
  log-probabilities (before temperature and top-p, as vLLM's default
  `raw_logprobs`) in `choices[0].logprobs.token_logprobs` (`recorder/policy.py`'s
  `HTTPPolicy`; a streamed request is answered whole, which it accepts);
- `GET /v1/models`: the served name as `id` and the checkpoint's
  `policy_version` (its `forgerl_policy.json`) as `root`, which
  `forge-run --watch` reads to tag rollouts;
- `reload(folder)` in process: the next request is answered by the new
  weights and `/v1/models` says their version.

Sampling is reproducible: each request's generator is seeded with its `seed`,
else the server's seed plus the request's number.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from forgerl.errors import UserError
from forgerl.runners.policy import checkpoint_version

START_TIMEOUT_S = 30


def load_checkpoint(folder: Path) -> Any:
    """The causal LM in `folder`, in the dtype it was saved in, for inference."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # stderr keeps to what a verb has to say
    try:
        return AutoModelForCausalLM.from_pretrained(folder, dtype="auto").eval()
    except (OSError, ValueError) as e:
        raise UserError(f"{folder}: cannot load the checkpoint: {str(e).splitlines()[0]}") from None


def stop_ids(model: Any) -> set[int]:
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    eos = model.config.eos_token_id if eos is None else eos
    return set(eos if isinstance(eos, list) else [eos]) - {None}


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """`logits` with the tokens outside the smallest set whose probability reaches `top_p` set to -inf."""
    if top_p >= 1.0:
        return logits
    ordered, order = torch.sort(logits, descending=True)
    cumulative = torch.softmax(ordered, -1).cumsum(-1)
    drop = cumulative - torch.softmax(ordered, -1) >= top_p  # keep the token that crosses top_p
    return logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))


class TorchPolicy:
    """A checkpoint generating from token ids, one request at a time, swappable between requests."""

    def __init__(self, folder: Path, seed: int = 0, max_tokens: int = 0):
        self.seed = seed
        self.max_tokens = max_tokens  # a cap on every request's max_tokens (0: none), as vLLM's context caps it
        self.requests = 0
        self.lock = threading.Lock()
        self.load(folder)

    def load(self, folder: Path) -> None:
        version, model = checkpoint_version(folder), load_checkpoint(folder)
        with self.lock:
            self.folder, self.version, self.model, self.stops = folder, version, model, stop_ids(model)

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float, top_p: float,
                 seed: int | None) -> tuple[list[int], list[float], str]:
        """Sampled ids (greedy at temperature 0), their raw log-probabilities, and "stop" or "length"."""
        with self.lock:
            self.requests += 1
            generator = torch.Generator().manual_seed(self.seed + self.requests if seed is None else seed)
            ids, logprobs, cache = [], [], None
            step = torch.tensor([prompt_ids])
            max_tokens = min(max_tokens, self.max_tokens or max_tokens)
            while len(ids) < max_tokens:
                out = self.model(input_ids=step, past_key_values=cache, use_cache=True, logits_to_keep=1)
                cache, logits = out.past_key_values, out.logits[0, -1].float()
                raw = torch.log_softmax(logits, -1)
                if temperature <= 0:
                    token = int(logits.argmax())
                else:
                    probs = torch.softmax(top_p_filter(logits / temperature, top_p), -1)
                    token = int(torch.multinomial(probs, 1, generator=generator))
                ids.append(token)
                logprobs.append(float(raw[token]))
                if token in self.stops:
                    return ids, logprobs, "stop"
                step = torch.tensor([[token]])
            return ids, logprobs, "length"


class PolicyServer:
    """`TorchPolicy` behind aiohttp on loopback, on a thread and event loop of its own."""

    def __init__(self, policy: TorchPolicy, served_model: str = "policy"):
        self.policy = policy
        self.served_model = served_model
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="policy-server")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return web.json_response({"error": {"message": "this server takes token-id prompts only"}}, status=400)
        ids, logprobs, finish = await asyncio.to_thread(
            self.policy.generate, prompt, int(body.get("max_tokens") or 16), float(body.get("temperature", 1.0)),
            float(body.get("top_p", 1.0)), body.get("seed"))
        choice = {"index": 0, "text": "", "finish_reason": finish, "token_ids": ids,
                  "logprobs": {"token_logprobs": logprobs}, "prompt_token_ids": prompt}
        return web.json_response({"id": f"cmpl-{self.policy.requests}", "object": "text_completion",
                                  "model": self.served_model, "choices": [choice],
                                  "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.served_model, "object": "model",
                                                              "root": self.policy.version}]})

    async def _start(self, port: int) -> str:
        self._runner = web.AppRunner(self.app())
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def start(self, port: int = 0) -> str:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(port), self._loop).result(START_TIMEOUT_S)
        return self.url

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(START_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_TIMEOUT_S)

    def reload(self, folder: Path) -> str:
        """Serve the checkpoint in `folder` from the next request on; returns its policy version."""
        self.policy.load(folder)
        return self.policy.version


@contextmanager
def serving(folder: Path, served_model: str = "policy", seed: int = 0, max_tokens: int = 0,
            port: int = 0) -> Iterator[PolicyServer]:
    """A `PolicyServer` on `folder` for the duration of the block (its `url` set)."""
    server = PolicyServer(TorchPolicy(folder, seed, max_tokens), served_model)
    server.start(port)
    try:
        yield server
    finally:
        server.stop()
