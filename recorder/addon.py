"""The mitmproxy addon: every flow through the proxy becomes a recorded call.

Usable on its own::

    mitmdump -s recorder/addon.py --mode reverse:http://127.0.0.1:8000@127.0.0.1:8080 \\
        --set forge_out=./data

Hooks stay tiny (the proxy's latency is the harness's latency): they strip
the session prefix, stamp times, and set a streaming tap so SSE passes chunk
by chunk. Redaction, parsing and writing happen in a writer process of its
own (`writer_process.py`), so they never hold the proxy's GIL.

Paths under `/_forge/` are the recorder's own (`control.py`): readiness and
the per-session flush barrier. Once the writer process fails, no call is
forwarded: each gets a 503 naming the failure, and the proxy shuts down
`FAILURE_GRACE_S` later (its owner sees the failure and exits non-zero).
A call the writer could not record whole fails its session's barrier
(`writer_process.CallsFailed`) and is counted in `call_failures`, which the
proxy's owner reports as it exits.

With a `KeyHolder` (`forge-record serve --hold-keys`, `credentials.py`) the
harness sends a token, not a key: each call's token is checked against its
session and swapped for the real key, and a call without a valid one is
answered with its API's own 401 and recorded as refused, never forwarded.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from urllib.parse import urlsplit

from mitmproxy import ctx, exceptions, http

from forgerl.errors import UserError
from forgerl.recorder import control
from forgerl.recorder.apis.gemini import is_gemini_api
from forgerl.recorder.capture import CapturedCall
from forgerl.recorder.credentials import KeyHolder, Refused, refusal_body
from forgerl.recorder.images import IMAGE_MODES
from forgerl.recorder.redact import Redactor
from forgerl.recorder.writer_process import WriterClient

SESSION_HEADER = "x-forge-session"
SESSION_PREFIX = "/s/"
ANTHROPIC_PATHS = ("/v1/messages", "/messages")
TERMINAL_WS_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
OPEN_CALLS_WAIT_S = 30.0  # a flush barrier waits this long for the session's calls still in flight
FAILURE_GRACE_S = 2.0  # after a recording failure, calls get the 503 this long before the proxy stops


def split_session(path: str) -> tuple[str | None, str]:
    """`/s/<id>/v1/messages?x` -> (`<id>`, `/v1/messages?x`); other paths unchanged."""
    if not path.startswith(SESSION_PREFIX):
        return None, path
    rest = path[len(SESSION_PREFIX):]
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    session, tail = rest[:end], rest[end:]
    if not session:
        return None, path
    return session, tail if tail.startswith("/") else "/" + tail


def parse_labels(text: str) -> dict | None:
    """`forge_labels`: a JSON object, or empty for none."""
    if not text:
        return None
    try:
        labels = json.loads(text)
    except json.JSONDecodeError:
        labels = None
    if not isinstance(labels, dict):
        raise UserError(f"labels must be a JSON object, got {text!r}")
    return labels


class Upstream:
    """Where one API family is forwarded: scheme, host, port and a path prefix."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        try:
            port = parts.port  # ValueError: out of range or not a number
            valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            valid = False
        if not valid:
            raise UserError(f"upstream must be http(s)://HOST[:PORT][/prefix], got {url!r}")
        self.url = url.rstrip("/")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")

    def apply(self, request: http.Request) -> None:
        request.scheme, request.host, request.port = self.scheme, self.host, self.port
        request.host_header = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        request.path = self.prefix + request.path


class Recorder:
    """Records each flow into a forgerl dataset root (`forge_out`)."""

    def __init__(self, keys: KeyHolder | None = None) -> None:
        self.keys = keys  # hold the keys: swap tokens for them (None: pass whatever the harness sends)
        self.writer: WriterClient | None = None
        self.upstreams: dict[str, Upstream] = {}
        self.master = None
        self._failed: str | None = None  # kept once the writer is closed, for whoever stops the proxy
        self.call_failures = 0  # calls the writers closed so far could not record whole
        self._open: dict[str, set[str]] = {}  # session -> ids of its calls not yet handed to the writer

    def load(self, loader) -> None:
        self.master = loader.master
        loader.add_option("forge_out", str, "", "Dataset root to record into (empty: record nothing).")
        loader.add_option("forge_session", str, "default",
                          "Session id for calls with neither a /s/<id>/ prefix nor an X-Forge-Session header.")
        loader.add_option("forge_upstream_anthropic", str, "",
                          "Forward Anthropic Messages paths here instead of the proxy's own target.")
        loader.add_option("forge_upstream_gemini", str, "",
                          "Forward Gemini API paths (/v1beta/..., models/M:generateContent) here.")
        loader.add_option("forge_upstream_openai", str, "",
                          "Forward every other path here instead of the proxy's own target.")
        loader.add_option("forge_redact_rules", str, "", "File of extra redaction regexes, one per line.")
        loader.add_option("forge_images", str, "keep", "What to keep of images: keep, hash-only or drop.")
        loader.add_option("forge_policy_version", str, "", "Policy/weights version to tag every call with.")
        loader.add_option("forge_labels", str, "", "JSON object of labels for every new session.")

    def configure(self, updated: set[str]) -> None:
        """Check the options before anything uses them; a bad one is an `OptionsError`, as mitmproxy expects
        (it rolls the options back, and mitmdump prints it and stops)."""
        opts = ctx.options
        try:
            if "forge_redact_rules" in updated and opts.forge_redact_rules:
                Redactor.from_file(opts.forge_redact_rules)  # a bad rule is an error here, not in the writer
            if {"forge_upstream_anthropic", "forge_upstream_gemini", "forge_upstream_openai"} & updated:
                self.upstreams = {name: Upstream(url) for name, url in (
                    ("anthropic", opts.forge_upstream_anthropic), ("gemini", opts.forge_upstream_gemini),
                    ("openai", opts.forge_upstream_openai)) if url}
            if "forge_labels" in updated:
                parse_labels(opts.forge_labels)
            if "forge_images" in updated and opts.forge_images not in IMAGE_MODES:
                raise UserError(f"forge_images {opts.forge_images}: choose from {', '.join(IMAGE_MODES)}")
            if "forge_out" in updated:
                self._close_writer()
                if opts.forge_out:
                    self.writer = WriterClient(opts.forge_out, on_failure=self._writer_failed)
        except UserError as e:
            raise exceptions.OptionsError(str(e)) from None
        if self.writer is not None and {"forge_out", "forge_redact_rules", "forge_labels", "forge_images"} & updated:
            self.writer.configure(redact_rules=opts.forge_redact_rules, labels=opts.forge_labels,
                                  images=opts.forge_images)

    # http ---------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        """Why calls can no longer be recorded, once they cannot."""
        return self._failed or (self.writer.failure if self.writer is not None else None)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        if control.is_control(request.path):
            flow.metadata["forgerl_control"] = True  # answered in `request`, never forwarded or recorded
            return
        if self.writer is None or self.failure is not None:
            return
        session, path = split_session(request.path)
        header_session = request.headers.pop(SESSION_HEADER, None)
        request.path = path
        session = session or header_session or ctx.options.forge_session
        family = _family(path)
        if family in self.upstreams:
            self.upstreams[family].apply(request)
        headers = list(request.headers.items(multi=True))  # recorded as sent: a token, never the real key
        if self.keys is not None:
            try:
                self.keys.swap(request.headers, request.query, family, session)
            except Refused as e:
                flow.metadata["forgerl_refused"] = (family, str(e))
        call = flow.metadata["forgerl"] = CapturedCall(
            call_id=uuid.uuid4().hex, session_id=session, seq=self.writer.next_seq(),
            method=request.method, path=path, upstream=f"{request.scheme}://{request.pretty_host}:{request.port}",
            t_start=request.timestamp_start, request_headers=headers,
            policy_version=ctx.options.forge_policy_version or None,
        )
        self._opened(call)

    def request(self, flow: http.HTTPFlow):
        if flow.metadata.get("forgerl_control"):
            return control.answer(flow, self)  # a coroutine: mitmproxy awaits what a hook returns
        if self.failure is not None:
            call = flow.metadata.pop("forgerl", None)
            if call is not None:
                self._closed(call)
            flow.response = control.refusal(self.failure)
            return None
        call = flow.metadata.get("forgerl")
        if call is None:
            return None
        call.request_body = flow.request.raw_content
        self.writer.open(call)
        refused = flow.metadata.get("forgerl_refused")
        if refused is not None:
            family, why = refused
            flow.response = http.Response.make(401, json.dumps(refusal_body(family, why)),
                                               {"content-type": "application/json"})
        return None

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        call = flow.metadata.get("forgerl")
        if call is None:
            return
        response = flow.response
        call.status = response.status_code
        call.response_headers = list(response.headers.items(multi=True))
        call.sse = response.headers.get("content-type", "").startswith("text/event-stream")
        if "forgerl_refused" in flow.metadata:
            call.tap(response.content)  # the recorder's own answer: whole, not streamed from upstream
        else:
            response.stream = call.tap

    def response(self, flow: http.HTTPFlow) -> None:
        call = flow.metadata.get("forgerl")
        if call is None:
            return
        if flow.websocket is not None:
            self._closed(call)  # the upgrade is no call of its own: its messages are
            return
        call.finish()
        self._submit(call, flow)

    def error(self, flow: http.HTTPFlow) -> None:
        call = flow.metadata.get("forgerl")
        if call is None or call.t_end is not None:
            return
        call.finish(error=flow.error.msg if flow.error else "connection failed")
        self._submit(call, flow)

    # websockets: each client message opens a call, server messages are its stream ----

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        parent = flow.metadata.get("forgerl")
        if parent is None:
            return
        message = flow.websocket.messages[-1]
        current: CapturedCall | None = flow.metadata.get("forgerl_ws_call")
        if message.from_client:
            if current is not None:
                current.finish(error="superseded by a new request before its terminal event")
                self._submit(current, flow)
            current = CapturedCall(
                call_id=uuid.uuid4().hex, session_id=parent.session_id, seq=self.writer.next_seq(),
                method="WS", path=parent.path, upstream=parent.upstream, t_start=message.timestamp,
                request_headers=parent.request_headers, request_body=message.content, websocket=True,
                status=101, sse=True, response_headers=[("x-forgerl-transport", "websocket")],
                policy_version=parent.policy_version)
            flow.metadata["forgerl_ws_call"] = current
            self._opened(current)
            self.writer.open(current)
            return
        if current is None:
            return
        event_type = _ws_event_type(message.content)
        current.tap(b"event: %s\ndata: %s\n\n" % (event_type.encode(), message.content))
        if event_type in TERMINAL_WS_EVENTS:
            current.finish()
            self._submit(current, flow)
            flow.metadata["forgerl_ws_call"] = None

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        current = flow.metadata.get("forgerl_ws_call")
        if current is not None:
            current.finish(error="websocket closed before the terminal event")
            self._submit(current, flow)
            flow.metadata["forgerl_ws_call"] = None

    # recording ------------------------------------------------------------

    def _submit(self, call: CapturedCall, flow: http.HTTPFlow) -> None:
        if self.writer is not None:
            self.writer.finish(call, flow.request.headers.get("user-agent", ""))
        self._closed(call)

    def _opened(self, call: CapturedCall) -> None:
        self._open.setdefault(call.session_id, set()).add(call.call_id)

    def _closed(self, call: CapturedCall) -> None:
        calls = self._open.get(call.session_id)
        if calls is not None:
            calls.discard(call.call_id)
            if not calls:
                del self._open[call.session_id]

    async def durable(self, session: str, now: bool = False) -> int:
        """How many of `session`'s calls are on disk, once none of them is still in flight (the flush barrier);
        written by the writer's next flush on its clock, or by one at once (`now`)."""
        if self.writer is None:
            raise LookupError("this proxy records nothing (forge_out is empty)")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + OPEN_CALLS_WAIT_S
        while session in self._open:  # finishing: the harness has its answer, mitmproxy's hooks lag a little
            if loop.time() > deadline:
                raise TimeoutError(f"{len(self._open[session])} calls of session {session!r} still open "
                                   f"after {OPEN_CALLS_WAIT_S:.0f} s")
            await asyncio.sleep(0.01)
        return await asyncio.wait_for(asyncio.wrap_future(self.writer.flush(session, now)), OPEN_CALLS_WAIT_S)

    def _writer_failed(self, failure: str) -> None:
        """Called from the writer client's thread: refuse calls for a moment, then stop the proxy."""
        self._failed = failure
        if self.master is not None:
            loop = self.master.event_loop
            loop.call_soon_threadsafe(loop.call_later, FAILURE_GRACE_S, self.master.shutdown)

    def _close_writer(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.call_failures += self.writer.call_failures
            self.writer = None

    def done(self) -> None:
        self._close_writer()


def _family(path: str) -> str:
    """Which upstream a path goes to: Anthropic Messages, the Gemini API, or OpenAI (everything else)."""
    if path.split("?", 1)[0].endswith(ANTHROPIC_PATHS):
        return "anthropic"
    return "gemini" if is_gemini_api(path) else "openai"


def _ws_event_type(content: bytes) -> str:
    try:
        value = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "message"
    return str(value.get("type", "message")) if isinstance(value, dict) else "message"


addons = [Recorder()]
