"""Running mitmproxy with the recorder addon, in the foreground or on a thread.

`forge-record serve` runs it in the foreground; `forge-record run` and tests
run it on a background thread (`BackgroundRecorder`) while a harness talks to it.
Either way, a proxy that stopped because recording failed raises
`RecorderFailure` when it ends, so its owner exits non-zero; one that stopped
with calls it could not record whole says how many (`Recorder.call_failures`).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from mitmproxy import exceptions
from mitmproxy import master as mitm_master
from mitmproxy import options
from mitmproxy.addons import (block, core, disable_h2c, dns_resolver, errorcheck, next_layer, onboarding,
                              proxyserver, tlsconfig, update_alt_svc)

from forgerl.errors import UserError, removed_on_user_error

from .addon import Recorder, Upstream, parse_labels
from .credentials import KeyHolder
from .images import IMAGE_MODES
from .redact import Redactor
from .writer_process import RecorderFailure

ANTHROPIC_API = "https://api.anthropic.com"
OPENAI_API = "https://api.openai.com"
GEMINI_API = "https://generativelanguage.googleapis.com"


@dataclass
class RecorderConfig:
    out: Path
    upstream_anthropic: str = ANTHROPIC_API
    upstream_openai: str = OPENAI_API
    upstream_gemini: str = GEMINI_API
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    forward: bool = False
    session: str = "default"
    redact_rules: str = ""
    images: str = "keep"  # forge-record --images (recorder/images.py)
    policy_version: str = ""
    labels: str = ""
    confdir: str = "~/.mitmproxy"
    upstream_ca: str = ""
    keys: KeyHolder | None = None  # --hold-keys: swap each session's token for the real key (credentials.py)

    def __post_init__(self) -> None:
        # Validate here, so bad input is one clear line before any socket opens.
        for url in (self.upstream_anthropic, self.upstream_openai, self.upstream_gemini):
            Upstream(url)
        if self.redact_rules:
            Redactor.from_file(self.redact_rules)
        if self.images not in IMAGE_MODES:
            raise UserError(f"--images {self.images}: choose from {', '.join(IMAGE_MODES)}")
        if self.upstream_ca and not Path(self.upstream_ca).is_file():
            raise UserError(f"--upstream-ca: no such file: {self.upstream_ca}")
        parse_labels(self.labels)
        self.listen_port = free_port(self.listen_host, self.listen_port)

    @classmethod
    def one_upstream(cls, out: Path, upstream: str, **options: object) -> RecorderConfig:
        """A recorder that forwards every API (Anthropic, OpenAI, Gemini) to one origin."""
        return cls(out, upstream_anthropic=upstream, upstream_openai=upstream, upstream_gemini=upstream, **options)

    @property
    def url(self) -> str:
        return f"http://{self.listen_host}:{self.listen_port}"


def free_port(host: str = "127.0.0.1", port: int = 0) -> int:
    """`port` if something can listen on it at `host` now (0: a free one), else a `UserError` saying why."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.create_server((host, port), family=family) as s:
            return s.getsockname()[1]
    except OSError as e:  # a taken port, a host that is not this machine's or does not resolve
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


class StartupCheck(errorcheck.ErrorCheck):
    """mitmproxy's startup check, raising what went wrong where mitmproxy's exits with only "Error logged
    during startup": a `UserError` for what mitmproxy reports plainly (a port taken since `RecorderConfig`
    looked, say), a `RuntimeError` when an addon raised (a bug)."""

    name = "errorcheck"  # the name `Master.run` looks it up by

    async def shutdown_if_errored(self) -> None:
        await asyncio.sleep(0)  # let pending log records land, as mitmproxy's does
        records = self.logger.has_errored
        if records:
            message = "; ".join(record.getMessage() for record in records)
            raise (RuntimeError if any(r.exc_info for r in records) else UserError)(message)


class _Ready:
    """Sets an event once mitmproxy's servers are listening."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def running(self) -> None:
        self.event.set()


def _ignore_cancelled(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """Stopping with keep-alive clients still connected cancels their handlers, and
    Python 3.11's asyncio reports each one as an error. It is not one."""
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)


def proxy_addons(forward: bool) -> list:
    """The mitmproxy addons a recording proxy needs, and no more.

    mitmproxy offers every hook of every flow to every addon; `mitmdump` loads
    about 35 (playback, map-local, cookies, export...), which on a busy machine
    costs more CPU per request than recording does. These are the ones this job
    uses: the proxy itself, TLS (https upstreams, forward mode), non-local
    client blocking, Alt-Svc rewriting (so clients do not bypass a reverse
    proxy), startup error checks, and mitm.it CA onboarding in forward mode.
    """
    addons = [core.Core(), block.Block(), disable_h2c.DisableH2C(), proxyserver.Proxyserver(),
              dns_resolver.DnsResolver(), next_layer.NextLayer(), tlsconfig.TlsConfig(),
              update_alt_svc.UpdateAltSvc(), StartupCheck()]
    if forward:
        addons.append(onboarding.Onboarding())
    return addons


def build_master(config: RecorderConfig, loop: asyncio.AbstractEventLoop) -> tuple[mitm_master.Master, _Ready]:
    listen = f"@{config.listen_host}:{config.listen_port}"
    mode = f"regular{listen}" if config.forward else f"reverse:{config.upstream_openai}{listen}"
    opts = options.Options(mode=[mode], confdir=config.confdir)
    master = mitm_master.Master(opts, event_loop=loop, with_termlog=True)
    master.addons.add(*proxy_addons(config.forward))
    ready = _Ready()
    master.addons.add(Recorder(config.keys), ready)
    try:
        _configure(opts, config)
    except exceptions.OptionsError as e:  # the addon's way of saying bad input (a root it cannot open)
        raise UserError(str(e)) from None
    return master, ready


def _configure(opts: options.Options, config: RecorderConfig) -> None:
    opts.update(
        termlog_verbosity="warn",
        # Read the request before connecting upstream, so a call to an upstream
        # that is down is still recorded (with its error) rather than dropped.
        connection_strategy="lazy",
        forge_out=str(config.out),
        forge_session=config.session,
        forge_upstream_anthropic="" if config.forward else config.upstream_anthropic,
        forge_upstream_openai="" if config.forward else config.upstream_openai,
        forge_upstream_gemini="" if config.forward else config.upstream_gemini,
        forge_redact_rules=config.redact_rules,
        forge_images=config.images,
        forge_policy_version=config.policy_version,
        forge_labels=config.labels,
    )
    if config.upstream_ca:
        opts.update(ssl_verify_upstream_trusted_ca=config.upstream_ca)


def _raise_failure(master: mitm_master.Master) -> None:
    failure = master.addons.get("recorder").failure
    if failure is not None:
        raise RecorderFailure(failure)


async def _run(master: mitm_master.Master) -> int:
    """Run until shut down; failing to start closes the writer (mitmproxy does not), so a folder it made can go.
    How many calls could not be recorded whole."""
    try:
        await master.run()
    except Exception:
        master.addons.get("recorder").done()
        raise
    _raise_failure(master)
    return master.addons.get("recorder").call_failures


def serve_forever(config: RecorderConfig, on_ready=None) -> int:
    """Run until SIGINT/SIGTERM or a recording failure (raised); the writer flushes and closes on the way out.
    Failing to start (bad input) is a `UserError`, with no dataset folder left behind. How many calls could not
    be recorded whole."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_ignore_cancelled)
        master, ready = build_master(config, loop)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, master.shutdown)
        if on_ready:
            loop.create_task(_when_ready(ready, on_ready))
        return await _run(master)

    failed: RecorderFailure | None = None
    with removed_on_user_error(config.out):  # only a failure to start removes a new --out folder
        try:
            failures = asyncio.run(main())
        except RecorderFailure as e:
            failed = e
    if failed is not None:
        raise failed
    return failures


async def _when_ready(ready: _Ready, callback) -> None:
    while not ready.event.is_set():
        await asyncio.sleep(0.01)
    callback()


class BackgroundRecorder:
    """The recorder on its own thread and event loop; a context manager."""

    def __init__(self, config: RecorderConfig):
        self.config = config
        self._thread: threading.Thread | None = None
        self._master: mitm_master.Master | None = None
        self._ready: _Ready | None = None
        self._failure: BaseException | None = None
        self._built = threading.Event()
        self.call_failures = 0  # once stopped: how many calls could not be recorded whole

    def start(self, timeout: float = 30) -> BackgroundRecorder:
        self._thread = threading.Thread(target=self._run, name="forgerl-recorder", daemon=True)
        self._thread.start()
        self._built.wait(timeout)
        if self._ready is None or not self._ready.event.wait(timeout):
            self.stop()
            if isinstance(self._failure, UserError):
                raise self._failure
            raise RuntimeError(f"recorder did not start on {self.config.url}: {self._failure or 'timeout'}")
        return self

    def _run(self) -> None:
        async def main() -> int:
            loop = asyncio.get_running_loop()
            loop.set_exception_handler(_ignore_cancelled)
            self._master, self._ready = build_master(self.config, loop)
            self._built.set()
            return await _run(self._master)

        try:
            self.call_failures = asyncio.run(main())
        except BaseException as e:  # reported by start()
            self._failure = e
        finally:
            self._built.set()

    def stop(self) -> None:
        if self._master is not None:
            self._master.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def __enter__(self) -> BackgroundRecorder:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
