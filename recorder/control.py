"""The recorder's own endpoints, beside the API it proxies: readiness and the per-session flush barrier.

    GET  /_forge/ready                 200 {"ready": true} while calls are recorded;
                                       503 {"error": why} once they cannot be
    POST /_forge/sessions/<id>/flush   200 {"session": id, "calls": n} once every call of <id> the
                                       recorder has seen is on disk (files fsynced by the writer's next
                                       flush, at most half a second on; with ?now=1 one started at
                                       once), the calls of <id> still in flight waited for first;
                                       500 if a call of <id> could not be recorded whole (which, and
                                       why: `CallsFailed`), 503 after a recording failure, 504 if
                                       calls of <id> stay open
    POST /_forge/sessions/<id>/token   200 {"session": id, "token": t, "expires": s}: a capability token
         [?ttl=SECONDS]                for <id>'s harness (`credentials.py`; default an hour)
    POST /_forge/sessions/<id>/close   200 {"session": id, "closed": true}: every token issued for <id>
                                       so far is refused from now on (after its final flush barrier)

The last two exist only when the recorder holds the keys (`--hold-keys`;
409 otherwise), and then every endpoint wants `Authorization: Bearer
<secret>` (401 without): the runner holds the secret, a jail or pod never.
Two exceptions, both harmless: `ready` is open (a kubelet's readiness probe
cannot hold a secret; it says only whether calls are recorded), and a
session's flush also takes that session's own token as the bearer, so a pod
(which grades itself, after the barrier) needs nothing but the token its
harness already holds; a flush only waits.

A runner grades a rollout from its recorded calls the moment the harness
exits. The writer flushes on its own clock in another process, so without a
barrier the runner could only poll the dataset until it stopped changing; and
without a readiness probe it had to read the recorder's log. Once recording
fails, the proxy answers every call with a 503 naming the failure rather than
forward what it cannot record (`Recorder.request`), and stops soon after.

Paths under `/_forge/` are answered by the recorder itself, never forwarded
or recorded. Harness traffic uses `/s/<session>/...` or the API's own paths,
so the two cannot collide; `/s/<id>/_forge/...` is harness traffic like any
other. `RecorderControl` is the client (runners, the veRL agent loop, tests).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import quote, unquote

from mitmproxy import http

from forgerl.errors import UserError

from .credentials import DEFAULT_TTL_S, KeyHolder, Refused
from .writer_process import CallsFailed, RecorderFailure

PREFIX = "/_forge/"
READY_PATH = PREFIX + "ready"
SESSIONS = "sessions"
FLUSH = "flush"
TOKEN = "token"
CLOSE = "close"
CALLS_FAILED = "forgerl_calls_failed"
BARRIER_TIMEOUT_S = 120  # the client's: the recorder itself gives up on open calls sooner
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through the user's HTTP_PROXY


class Recording(Protocol):
    """What the endpoints need from the addon."""

    @property
    def failure(self) -> str | None: ...

    keys: KeyHolder | None

    def durable(self, session: str, now: bool = False) -> Awaitable[int]: ...


# ------------------------------------------------------------------ the recorder's side


def is_control(path: str) -> bool:
    return path.startswith(PREFIX)


def _json(status: int, body: dict) -> http.Response:
    return http.Response.make(status, json.dumps(body), {"content-type": "application/json"})


def refusal(failure: str) -> http.Response:
    """What a call gets once nothing can be recorded: it is not forwarded."""
    return _json(503, {"error": {"type": "forgerl_recorder_failure",
                                 "message": f"forgerl recorder failure: {failure}; the call was not forwarded"}})


async def answer(flow: http.HTTPFlow, recording: Recording) -> None:
    """Set `flow.response` for a request to a control path."""
    request = flow.request
    parts = request.path.split("?", 1)[0][len(PREFIX):].split("/")
    keys = recording.keys
    if keys is not None and not _allowed(keys, request.headers.get("authorization", ""), parts, request.method):
        flow.response = _json(401, {"error": {"type": "forgerl_unauthorized",
                                              "message": "the recorder's control endpoints want its secret"}})
    elif len(parts) == 3 and parts[0] == SESSIONS and parts[1] and parts[2] in (TOKEN, CLOSE) \
            and request.method == "POST":
        flow.response = _credentials(keys, unquote(parts[1]), parts[2], request.query.get("ttl", ""))
    elif parts == ["ready"] and request.method == "GET":
        flow.response = refusal(recording.failure) if recording.failure else _json(200, {"ready": True})
    elif len(parts) == 3 and parts[0] == SESSIONS and parts[1] and parts[2] == FLUSH and request.method == "POST":
        session = unquote(parts[1])
        try:
            calls = await recording.durable(session, now=request.query.get("now") == "1")
            flow.response = _json(200, {"session": session, "calls": calls})
        except RecorderFailure as e:
            flow.response = refusal(str(e))
        except CallsFailed as e:
            flow.response = _json(500, {"error": {"type": CALLS_FAILED, "message": str(e)}})
        except TimeoutError as e:
            flow.response = _json(504, {"error": {"type": "forgerl_barrier_timeout", "message": str(e)}})
        except LookupError as e:
            flow.response = _json(409, {"error": {"type": "forgerl_not_recording", "message": str(e)}})
    else:
        flow.response = _json(404, {"error": {"type": "forgerl_no_such_endpoint",
                                              "message": f"no {request.method} {request.path} on the recorder"}})


def _allowed(keys: KeyHolder, authorization: str, parts: list[str], method: str) -> bool:
    """The secret opens every endpoint; `ready` is open; a session's own token opens that session's flush only."""
    if parts == ["ready"] or keys.tokens.control_allowed(authorization):
        return True
    if not (len(parts) == 3 and parts[0] == SESSIONS and parts[2] == FLUSH and method == "POST"):
        return False
    scheme, _, token = authorization.partition(" ")
    try:
        keys.tokens.check(token.strip(), unquote(parts[1]))
    except Refused:
        return False
    return scheme.lower() == "bearer"


def _credentials(keys: KeyHolder | None, session: str, action: str, ttl: str) -> http.Response:
    if keys is None:
        return _json(409, {"error": {"type": "forgerl_not_holding_keys",
                                     "message": "this recorder passes keys through (start it with --hold-keys)"}})
    if action == CLOSE:
        keys.tokens.revoke(session)
        return _json(200, {"session": session, "closed": True})
    try:
        token, expires = keys.tokens.issue(session, int(ttl) if ttl else DEFAULT_TTL_S)
    except (ValueError, UserError) as e:
        return _json(400, {"error": {"type": "forgerl_bad_request", "message": f"ttl {ttl!r}: {e}"}})
    return _json(200, {"session": session, "token": token, "expires": expires})


# ------------------------------------------------------------------ the runner's side


class BarrierError(RuntimeError):
    """The recorder answered a flush with something other than an acknowledgement (calls stuck open)."""


class RecorderUnreachable(RecorderFailure):
    """Nothing answers at the recorder's URL (not started yet, or gone)."""


class RecorderControl:
    """A recorder's control endpoints, from a runner."""

    def __init__(self, url: str, timeout: float = BARRIER_TIMEOUT_S, secret: str = ""):
        self.url = url.rstrip("/")
        self.timeout = timeout
        # a --hold-keys recorder's secret (or, for a session's flush alone, that session's token)
        self._headers = {"authorization": f"Bearer {secret}"} if secret else {}

    def _call(self, method: str, path: str) -> dict:
        request = urllib.request.Request(self.url + path, method=method, headers=self._headers)
        try:
            with _DIRECT.open(request, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                error = json.loads(body)["error"]
                kind, message = error.get("type"), error["message"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
                kind, message = None, body.decode(errors="replace")[:300] or e.reason
            if e.code == 503:
                raise RecorderFailure(message) from None
            if kind == CALLS_FAILED:
                raise CallsFailed(message) from None
            raise BarrierError(f"{method} {path}: HTTP {e.code}: {message}") from None
        except OSError as e:  # refused, reset, timed out: the recorder is gone
            raise RecorderUnreachable(f"recorder at {self.url} unreachable: {e}") from None

    def ready(self) -> bool:
        """One probe: is it listening and recording? (RecorderFailure once recording has failed)"""
        try:
            return bool(self._call("GET", READY_PATH).get("ready"))
        except RecorderUnreachable:
            return False

    def wait_ready(self, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
        """Until `ready()`; RuntimeError when `alive()` turns false or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if not alive():
                raise RuntimeError(f"recorder at {self.url} exited before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"recorder at {self.url} not ready after {timeout:.0f} s")
            time.sleep(0.05)

    def flush(self, session: str, now: bool = False) -> int:
        """Block until every call of `session` is on disk, by the writer's next flush on its clock or one at once
        (`now`: nothing else keeps the machine busy meanwhile); how many there are. `CallsFailed` if one of them
        could not be recorded whole."""
        path = f"{PREFIX}{SESSIONS}/{quote(session, safe='')}/{FLUSH}" + ("?now=1" if now else "")
        return int(self._call("POST", path)["calls"])

    def register(self, session: str, ttl_s: int = DEFAULT_TTL_S) -> str:
        """A capability token for `session`'s harness, valid `ttl_s` seconds or until `close` (--hold-keys)."""
        return str(self._call("POST", f"{PREFIX}{SESSIONS}/{quote(session, safe='')}/{TOKEN}?ttl={ttl_s}")["token"])

    def close(self, session: str) -> None:
        """Revoke `session`'s tokens: call it once its final flush barrier is done."""
        self._call("POST", f"{PREFIX}{SESSIONS}/{quote(session, safe='')}/{CLOSE}")
