"""The recorder holds the keys: per-rollout capability tokens, and the swap for the real upstream key.

With `forge-record serve --hold-keys` no harness ever sees a vendor key. Each rollout's harness gets a token
where its key goes; the recorder checks it against the session in the request's path and puts the real key,
which only the recorder's process holds, in its place. A token is stateless -- an HMAC-SHA256 over its session
id, issue time and expiry with a secret only the recorder and its runner hold -- so it survives a recorder
restart and works at every recorder that shares the secret. What is not stateless is revocation: closing a
rollout (`/_forge/sessions/<id>/close`, after its final flush barrier) refuses every token issued for that
session until then, at this recorder, until the recorder restarts; expiry bounds what a restart forgets.

    forge-cap-<session, base64url>.<issued, µs since the epoch>.<expires, s since the epoch>.<mac, base64url>

The prefix is fixed so redaction (`redact.py`) masks a token like any key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from forgerl.errors import UserError

if TYPE_CHECKING:
    from mitmproxy.coretypes.multidict import MultiDictView
    from mitmproxy.http import Headers

PREFIX = "forge-cap-"
SECRET_ENV = "FORGE_RECORDER_SECRET"
MIN_SECRET_CHARS = 32
MAX_TTL_S = 24 * 3600  # the longest a token lives, so a revocation can be forgotten after it
DEFAULT_TTL_S = 3600
APIS = ("anthropic", "openai", "gemini")
DEFAULT_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY", "gemini": "GEMINI_API_KEY"}


class Refused(Exception):
    """A call that presented no valid token for its session; the message says why (never a secret)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def secret_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The shared secret, from `FORGE_RECORDER_SECRET`; a `UserError` if it is missing or short."""
    environ = os.environ if environ is None else environ  # read now: the object can be replaced after import
    secret = environ.get(SECRET_ENV, "")
    if len(secret) < MIN_SECRET_CHARS:
        raise UserError(f"{SECRET_ENV} must hold a secret of at least {MIN_SECRET_CHARS} characters "
                        f"(e.g. `export {SECRET_ENV}=$(openssl rand -hex 32)`)")
    return secret


def new_secret() -> str:
    """A fresh secret for a runner that starts its own recorder."""
    return os.urandom(32).hex()


@dataclass
class Tokens:
    """Issues and checks tokens with one secret; keeps this recorder's revocations."""

    secret: str = field(repr=False)
    _revoked: dict[str, int] = field(default_factory=dict, init=False, repr=False)  # session -> closed at, µs

    def __post_init__(self) -> None:
        self._mac_key = hmac.new(self.secret.encode(), b"forgerl capability token", hashlib.sha256).digest()

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._mac_key, body.encode(), hashlib.sha256).digest())

    def issue(self, session: str, ttl_s: int = DEFAULT_TTL_S) -> tuple[str, int]:
        """A token for `session`, valid `ttl_s` seconds from now; and its expiry (s since the epoch)."""
        if not session:
            raise UserError("a token needs a session id")
        if not 0 < ttl_s <= MAX_TTL_S:
            raise UserError(f"token lifetime must be 1..{MAX_TTL_S} s, got {ttl_s}")
        expires = int(time.time()) + ttl_s
        body = f"{_b64(session.encode())}.{time.time_ns() // 1000}.{expires}"
        return f"{PREFIX}{body}.{self._mac(body)}", expires

    def check(self, token: str, session: str) -> None:
        """Return if `token` is valid for `session` now; `Refused` saying why otherwise."""
        if not token.startswith(PREFIX):
            raise Refused("no forgerl token where the API key goes")
        body, _, mac = token[len(PREFIX):].rpartition(".")
        if not hmac.compare_digest(self._mac(body), mac):
            raise Refused("invalid forgerl token")
        encoded, issued, expires = body.split(".")  # the MAC vouches for the shape
        try:
            owner = _unb64(encoded).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise Refused("invalid forgerl token") from None
        if owner != session:
            raise Refused(f"forgerl token is for another session than {session!r}")
        if int(expires) <= time.time():
            raise Refused("forgerl token expired")
        if int(issued) <= self._revoked.get(session, -1):
            raise Refused(f"forgerl token revoked: session {session!r} is closed")

    def revoke(self, session: str) -> None:
        """Refuse every token issued for `session` until now (its rollout is over)."""
        now = time.time_ns() // 1000
        horizon = now - MAX_TTL_S * 1_000_000  # tokens issued before this have expired anyway
        for old in [s for s, closed in self._revoked.items() if closed < horizon]:
            del self._revoked[old]
        self._revoked[session] = now

    def control_allowed(self, authorization: str) -> bool:
        """Whether a control request's `Authorization` header carries the secret (`Bearer <secret>`)."""
        scheme, _, value = authorization.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self.secret.encode())


# Where a harness puts its key, by API: (header, scheme) pairs and the query parameter Gemini's SDKs use.
KEY_HEADERS = (("x-api-key", ""), ("authorization", "Bearer"), ("x-goog-api-key", ""))
KEY_QUERY = "key"


@dataclass
class KeyHolder:
    """The recorder's side of `--hold-keys`: the tokens, and the real key for each API (None: send no key)."""

    tokens: Tokens
    keys: dict[str, str] = field(repr=False)

    @classmethod
    def from_env(cls, key_env: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] | None = None) -> KeyHolder:
        """The secret from `FORGE_RECORDER_SECRET`; each API's key from its variable in `key_env` (API -> name,
        defaults `DEFAULT_KEY_ENV`). An API whose variable is unset or empty is sent no key (a keyless local
        upstream); the harness's token is taken off either way."""
        environ = os.environ if environ is None else environ
        names = {**DEFAULT_KEY_ENV, **(key_env or {})}
        unknown = set(names) - set(APIS)
        if unknown:
            raise UserError(f"--upstream-key-env: unknown API {sorted(unknown)[0]!r}; choose from {', '.join(APIS)}")
        keys = {api: environ[name] for api, name in names.items() if environ.get(name)}
        return cls(Tokens(secret_from_env(environ)), keys)

    def swap(self, headers: Headers, query: MultiDictView, api: str, session: str) -> None:
        """Check the token in `headers`/`query` (mitmproxy's multidicts) against `session`, and put `api`'s
        real key in its place; `Refused` if there is no valid one. Other key places are emptied."""
        places = [(name, scheme) for name, scheme in KEY_HEADERS if name in headers]
        found: list[tuple[str, str, str]] = []  # (kind, name, token)
        for name, scheme in places:
            value = headers[name]
            token = value.split(" ", 1)[1].strip() if scheme and " " in value else value.strip()
            found.append(("header", name, token))
        if KEY_QUERY in query:
            found.append(("query", KEY_QUERY, query[KEY_QUERY]))
        tokens = [f for f in found if f[2].startswith(PREFIX)]
        if not tokens:
            raise Refused("no forgerl token where the API key goes")
        for _, _, token in tokens:
            self.tokens.check(token, session)
        for kind, name, _ in found:
            if kind == "header":
                del headers[name]
            else:
                del query[name]
        real = self.keys.get(api)
        if real is None:
            return
        kind, name, _ = tokens[0]
        if kind == "query":
            query[name] = real
        else:
            scheme = dict(KEY_HEADERS)[name]
            headers[name] = f"{scheme} {real}" if scheme else real


def refusal_body(api: str, message: str) -> dict:
    """A 401 in the API's own error shape, so the harness reports it as a bad key."""
    if api == "anthropic":
        return {"type": "error", "error": {"type": "authentication_error", "message": message}}
    if api == "gemini":
        return {"error": {"code": 401, "message": message, "status": "UNAUTHENTICATED"}}
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
