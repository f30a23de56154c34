"""A rollout pod's key holder: the judge's and the user model's keys, in a container of the pod of their own.

    python -m forgerl.runners.model_keys           (the pod template's `model-keys` container)
    python -m forgerl.runners.model_keys --check   (its startup probe: answers once it listens)

A pod drops every capability, so inside the harness's container nothing can
keep a secret from the harness: it runs as the same user as the pod entry,
and reads every process's environment there. So the keys are not in that
container. This process runs in a container of its own, a native sidecar
(an init container with `restartPolicy: Always`, which starts before the
rollout's container and stops after it). Its environment holds
FORGE_JUDGE_URL / FORGE_JUDGE_API_KEY and FORGE_USER_MODEL_URL /
FORGE_USER_MODEL_API_KEY (the keys from the template's Secret). It forwards
the pod's calls, made to http://127.0.0.1:PORT/judge/... and /user/..., to
those APIs with the key added, and replaces whatever credential the caller
sent.

The rollout's container holds only those loopback URLs. A pod's containers
share one network namespace, so its harness can reach them too: it can spend
judge and user-model calls, but never read a key (SECURITY.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.request

from aiohttp import ClientSession, ClientTimeout, web

PORT_VARIABLE = "FORGE_MODEL_KEYS_PORT"
DEFAULT_PORT = 8791
CONTAINER = "model-keys"  # its name in the pod template
# route -> the variables of its API base and key, the same names the rollout's container uses for the loopback URL
ROUTES = {"judge": ("FORGE_JUDGE_URL", "FORGE_JUDGE_API_KEY"),
          "user": ("FORGE_USER_MODEL_URL", "FORGE_USER_MODEL_API_KEY")}
_CREDENTIALS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})
_HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade",
                  "proxy-authorization", "te", "trailer"})
CALL_TIMEOUT_S = 600
_CLIENT = web.AppKey("client", ClientSession)


def loopback_url(route: str, port: int = DEFAULT_PORT) -> str:
    """What the rollout's container is given instead of the API's base URL."""
    return f"http://127.0.0.1:{port}/{route}"


def upstreams(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """route -> (API base, key) for each API this pod was given (a local API may need no key)."""
    return {route: (env[url].rstrip("/"), env.get(key, "")) for route, (url, key) in ROUTES.items() if env.get(url)}


def add_routes(app: web.Application, apis: dict[str, tuple[str, str]]) -> None:
    """The holder on `app`: /healthz, and /{route}/{path} forwarded to that route's API with its key."""

    async def client(app: web.Application):
        app[_CLIENT] = ClientSession(timeout=ClientTimeout(total=CALL_TIMEOUT_S), auto_decompress=False)
        yield
        await app[_CLIENT].close()

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def forward(request: web.Request) -> web.StreamResponse:
        route = request.match_info["route"]
        if route not in apis:
            return web.json_response({"error": {"message": f"this pod was given no {route} model"}}, status=404)
        base, key = apis[route]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP | _CREDENTIALS}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = f"{base}/{request.match_info['path']}" + (f"?{request.query_string}" if request.query_string else "")
        async with request.app[_CLIENT].request(request.method, url, headers=headers,
                                                 data=await request.read()) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.cleanup_ctx.append(client)
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/{route}/{path:.*}", forward)


def check(port: int) -> int:
    """The startup probe: 0 once the holder answers on loopback."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return 0 if r.status == 200 else 1
    except OSError:
        return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m forgerl.runners.model_keys", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="probe a running holder instead of starting one")
    args = p.parse_args(argv)
    port = int(os.environ.get(PORT_VARIABLE) or DEFAULT_PORT)
    if args.check:
        return check(port)
    apis = upstreams(dict(os.environ))
    print(f"model-keys: forwarding {', '.join(sorted(apis)) or 'nothing'} on 127.0.0.1:{port}", flush=True)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    add_routes(app, apis)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
