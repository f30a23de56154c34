"""The token extension a policy-served answer carries to the recorder.

In serve mode (`recorder/serve.py`) the answer the harness receives is made
by the gateway from a policy's token ids. Those ids must reach the recorded
call, and the recorder's addon only sees HTTP, so the gateway adds one
extension object under `TOKENS_KEY` to the response body it sends:

- Anthropic Messages: the non-streaming body; in a stream, the
  `message_delta` event's `delta` (the stream assembler merges it into the
  message, so the reassembled body has it too);
- OpenAI Responses: the response object, streamed in `response.completed`;
- Chat Completions answers use vLLM's own fields instead (`prompt_token_ids`,
  per-choice `token_ids`, `logprobs.content`), which the chat codec reads,
  and an extension with `malformed_tool_calls` only, on the body or the
  finishing chunk.

    "forge": {"prompt_token_ids": [...], "completion_token_ids": [...], "completion_logprobs": [...],
              "malformed_tool_calls": N}

(`malformed_tool_calls`: call-shaped spans of the generated text that did not
parse as a tool call and went to the harness as text; stored on the call.)

(The recorder tags the call with the policy version itself: `--policy-version`.)

Clients ignore unknown keys (checked with Claude Code and Codex CLI).
The completion ids include the end-of-turn token when the model produced it.
"""

from __future__ import annotations

from typing import Any

from forgerl.schema.messages import Exchange

TOKENS_KEY = "forge"


def token_extension(prompt_ids: list[int] | None, completion_ids: list[int],
                    logprobs: list[float] | None, malformed_tool_calls: int = 0) -> dict[str, Any]:
    """Inverse of `read_token_extension`."""
    return {"prompt_token_ids": None if prompt_ids is None else list(prompt_ids),
            "completion_token_ids": list(completion_ids),
            "completion_logprobs": None if logprobs is None else list(logprobs),
            "malformed_tool_calls": malformed_tool_calls}


def read_token_extension(body: Any, exchange: Exchange) -> None:
    """Copy a body's token extension (if any) into the exchange; anything malformed is ignored."""
    ext = body.get(TOKENS_KEY) if isinstance(body, dict) else None
    if not isinstance(ext, dict):
        return
    prompt, completion, logprobs = (ext.get(key) for key in
                                    ("prompt_token_ids", "completion_token_ids", "completion_logprobs"))
    if _ints(prompt):
        exchange.prompt_token_ids = prompt
    if _ints(completion):
        exchange.completion_token_ids = completion
    if isinstance(logprobs, list) and all(isinstance(v, (int, float)) for v in logprobs):
        exchange.completion_logprobs = [float(v) for v in logprobs]
    malformed = ext.get("malformed_tool_calls")
    if isinstance(malformed, int) and not isinstance(malformed, bool) and malformed >= 0:
        exchange.malformed_tool_calls = malformed


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
