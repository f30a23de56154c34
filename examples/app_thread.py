"""An aiohttp app on loopback, on a thread and event loop of its own: the servers the examples and tests start
beside the code under test (the learn teacher's policy server, the tests' token policy servers)."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class AppThread:
    """Subclasses add their routes in `routes`; `with` starts it on `port` (0: a free one) and sets `url`."""

    def __init__(self, port: int = 0, name: str = "app-thread") -> None:
        self.port = port
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def _start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        self.routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    def __enter__(self):
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
