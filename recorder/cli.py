"""`forge-record`: capture what a harness says to its model.

    forge-record serve --upstream URL [--listen 127.0.0.1:PORT] [--out DIR]
    forge-record serve --policy URL --tokenizer DIR --served-model NAME [--out DIR]
    forge-record serve --hold-keys ...      (FORGE_RECORDER_SECRET set: harnesses send tokens, not keys)
    forge-record token --session ID [--ttl SECONDS]
    forge-record run --out DIR [--upstream URL] [--upstream-anthropic|-openai|-gemini URL] -- CMD...
    forge-record ls DIR
    forge-record show DIR SESSION
    forge-record compact DIR
    forge-record delete DIR SESSION
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path

from forgerl.cli import run_verb
from forgerl.errors import UserError
from forgerl.harnesses import launch, recorded_commands
from forgerl.schema.files import read_manifest
from forgerl.schema.maintenance import compact, delete_session
from forgerl.schema.toolcalls import FORMATS

from . import summary
from .policy import HTTPPolicy, Policy, Sampling, ScriptedPolicy, check_trained_template, turns
from .credentials import DEFAULT_KEY_ENV, DEFAULT_TTL_S, MAX_TTL_S, SECRET_ENV, KeyHolder, Tokens, secret_from_env
from .images import IMAGE_MODES
from .otlp import add_otlp_flag, configure_export
from .proxy import ANTHROPIC_API, GEMINI_API, OPENAI_API, BackgroundRecorder, RecorderConfig, serve_forever


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="forge-data", help="dataset root to record into (default: ./forge-data)")
    p.add_argument("--redact-rules", default="", metavar="FILE",
                   help="extra redaction regexes, one per line (keys, tokens and .env secrets are always redacted)")
    p.add_argument("--images", choices=IMAGE_MODES, default="keep",
                   help="what to keep of images (screenshots), which regexes cannot redact: keep (bytes stored once "
                        "per session in blobs), hash-only (the reference and size, no bytes), drop (neither); "
                        "default keep")
    p.add_argument("--policy-version", default="", help="tag every call with this policy/weights version")
    p.add_argument("--labels", default="", metavar="JSON", help='labels for new sessions, e.g. \'{"task":"t1"}\'')
    add_otlp_flag(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forge-record", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the recording proxy until interrupted")
    serve.add_argument("--upstream", help="origin to forward to, http(s)://HOST[:PORT]; request paths pass "
                       f"through unchanged (default: {ANTHROPIC_API} for Anthropic paths, {GEMINI_API} for Gemini "
                       f"paths, {OPENAI_API} otherwise)")
    serve.add_argument("--upstream-anthropic", help="origin for Anthropic Messages paths only")
    serve.add_argument("--upstream-gemini", help="origin for Gemini API paths only (/v1beta/..., :generateContent)")
    serve.add_argument("--upstream-openai", help="origin for every other path")
    serve.add_argument("--listen", type=_listen, default=("127.0.0.1", 8787),
                       help="HOST:PORT to listen on (default 127.0.0.1:8787; loopback unless you say otherwise)")
    serve.add_argument("--forward", action="store_true",
                       help="forward-proxy mode (HTTPS_PROXY) with mitmproxy's CA, for clients that cannot "
                       "change their base URL; trust ~/.mitmproxy/mitmproxy-ca-cert.pem")
    serve.add_argument("--upstream-ca", default="", metavar="PEM",
                       help="also trust this CA bundle for upstream TLS (self-signed or corporate origins)")
    policy = serve.add_argument_group("serve mode: answer from a policy (vLLM) instead of forwarding")
    policy.add_argument("--policy", metavar="URL",
                        help="OpenAI-compatible policy server speaking vLLM's protocol (token ids to /v1/completions "
                        "with return_token_ids), or script:FILE (a JSON list of turn texts, said in order)")
    policy.add_argument("--tokenizer", metavar="DIR", help="the policy's tokenizer directory (chat template)")
    policy.add_argument("--served-model", metavar="NAME", help="the model name the policy server serves")
    policy.add_argument("--tool-format", choices=sorted(FORMATS), metavar="NAME",
                        help="how the policy writes tool calls: " + ", ".join(sorted(FORMATS)) +
                        " (default: recognised from the tokenizer's chat template)")
    policy.add_argument("--max-tokens", type=int, default=1024, help="cap on tokens per turn (default 1024)")
    policy.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    policy.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1.0)")
    serve.add_argument("--session", default="default",
                       help="session id for calls with no /s/<id>/ prefix or X-Forge-Session header")
    held = serve.add_argument_group("holding the keys: clients send per-session tokens, never a vendor key")
    held.add_argument("--hold-keys", action="store_true",
                      help=f"accept only tokens (forge-record token, or POST /_forge/sessions/ID/token) made with "
                      f"the secret in ${SECRET_ENV}, and swap each for the API's real key; anything else gets "
                      "the API's 401. The control endpoints then want 'Authorization: Bearer <secret>'")
    held.add_argument("--upstream-key-env", action="append", default=[], metavar="API=VAR",
                      help="read API's real key (anthropic, openai, gemini) from variable VAR; defaults "
                      + ", ".join(f"{api}={var}" for api, var in DEFAULT_KEY_ENV.items())
                      + "; an API whose variable is unset is sent no key")
    _common(serve)

    token = sub.add_parser("token", help=f"print a capability token for a --hold-keys recorder (${SECRET_ENV})")
    token.add_argument("--session", required=True, help="the session the token is for (its /s/<id>/ path)")
    token.add_argument("--ttl", type=int, default=DEFAULT_TTL_S,
                       help=f"seconds the token lives (default {DEFAULT_TTL_S}, at most {MAX_TTL_S})")

    run = sub.add_parser("run", help="record one command: point known harnesses at a fresh recorder, run, summarise",
                         description="Record one command. Known harness commands are aimed at the recorder with "
                         f"their own flags and config: {recorded_commands()}; any other gets the Anthropic and "
                         "OpenAI SDKs' base-URL variables.")
    run.add_argument("--upstream", help="origin for every API (the three below default to it)")
    run.add_argument("--upstream-anthropic", help=f"origin for Anthropic Messages paths (default {ANTHROPIC_API})")
    run.add_argument("--upstream-gemini", help=f"origin for Gemini API paths (default {GEMINI_API})")
    run.add_argument("--upstream-openai", help=f"origin for every other path (default {OPENAI_API})")
    run.add_argument("--session", help="session id (default: run-<time>-<random>)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    _common(run)

    ls = sub.add_parser("ls", help="list recorded sessions")
    ls.add_argument("dir")
    ls.add_argument("--json", action="store_true", help="machine-readable output")

    show = sub.add_parser("show", help="pretty-print one session's calls, tool calls and errors")
    show.add_argument("dir")
    show.add_argument("session")

    comp = sub.add_parser("compact", help="merge small files into large ones, atomically for readers")
    comp.add_argument("dir")

    delete = sub.add_parser("delete", help="remove every trace of one session (rewrites only files that hold it)")
    delete.add_argument("dir")
    delete.add_argument("session")
    return parser


def cmd_serve(args: argparse.Namespace) -> int:
    if args.policy or args.tokenizer or args.served_model:
        return cmd_serve_policy(args)
    anthropic, openai, gemini = _upstreams(args)
    host, port = args.listen
    config = RecorderConfig(out=Path(args.out), upstream_anthropic=anthropic, upstream_openai=openai,
                            upstream_gemini=gemini, listen_host=host, listen_port=port, forward=args.forward,
                            session=args.session, redact_rules=args.redact_rules, images=args.images,
                            policy_version=args.policy_version, labels=args.labels, upstream_ca=args.upstream_ca,
                            keys=_keys(args))
    target = "forward proxy" if args.forward else f"anthropic -> {anthropic}, gemini -> {gemini}, openai -> {openai}"
    return _closing_status(serve_forever(config, on_ready=lambda: print(
        f"forge-record: listening on {config.url} ({target}); recording to {args.out}", flush=True)))


def _keys(args: argparse.Namespace) -> KeyHolder | None:
    """--hold-keys: the secret and each API's real key, from this process's environment."""
    if not args.hold_keys:
        if args.upstream_key_env:
            raise UserError("--upstream-key-env goes with --hold-keys")
        return None
    names = {}
    for item in args.upstream_key_env:
        api, sep, var = item.partition("=")
        if not sep or not api or not var:
            raise UserError(f"--upstream-key-env: expected API=VAR, got {item!r}")
        names[api] = var
    return KeyHolder.from_env(names)


def cmd_token(args: argparse.Namespace) -> int:
    token, _ = Tokens(secret_from_env()).issue(args.session, args.ttl)
    print(token)
    return 0


def _closing_status(call_failures: int, status: int = 0) -> int:
    """The exit status once the recorder has stopped: non-zero, the count said, if any call could not be recorded
    whole (each was logged with its traceback as it happened)."""
    if not call_failures:
        return status
    print(f"forge-record: {call_failures} call{'s' if call_failures != 1 else ''} could not be recorded whole; "
          "the log above has each one's traceback", file=sys.stderr, flush=True)
    return status or 1


def _upstreams(args: argparse.Namespace) -> tuple[str, str, str]:
    """(anthropic, openai, gemini) origins: each its own flag, else --upstream, else the vendor's API."""
    return (args.upstream_anthropic or args.upstream or ANTHROPIC_API,
            args.upstream_openai or args.upstream or OPENAI_API,
            args.upstream_gemini or args.upstream or GEMINI_API)


def _policy(args: argparse.Namespace, tokenizer: object) -> Policy:
    if args.policy.startswith("script:"):
        path = Path(args.policy[len("script:"):])
        try:
            texts = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(f"--policy script:{path}: {getattr(e, 'strerror', None) or e}") from None
        if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
            raise UserError(f"--policy script:{path}: expected a JSON list of turn texts")
        return ScriptedPolicy(tokenizer, turns(*texts))
    if not args.policy.startswith(("http://", "https://")):
        raise UserError(f"--policy: expected http(s)://HOST:PORT or script:FILE, got {args.policy!r}")
    return HTTPPolicy(args.policy, args.served_model)


def cmd_serve_policy(args: argparse.Namespace) -> int:
    """The recorder in front of a policy gateway: the harness is answered by the policy, recorded as usual."""
    if not (args.policy and args.tokenizer and args.served_model):
        raise UserError("serve mode needs --policy, --tokenizer and --served-model together")
    if args.upstream or args.upstream_anthropic or args.upstream_openai or args.upstream_gemini or args.forward:
        raise UserError("--policy answers every call itself: drop --upstream*/--forward")
    if args.max_tokens < 1:
        raise UserError("--max-tokens must be at least 1")
    from .serve import GatewayThread, PolicyGateway, load_tokenizer, tool_format  # transformers: only serve mode

    unchecked = check_trained_template(args.tokenizer)  # before the tokenizer loads (seconds): refused at once
    tokenizer = load_tokenizer(args.tokenizer)
    version = args.policy_version or args.served_model
    gateway = PolicyGateway(_policy(args, tokenizer), tokenizer, args.served_model,
                            fmt=tool_format(tokenizer, args.tool_format),
                            sampling=Sampling(max_tokens=args.max_tokens, temperature=args.temperature,
                                              top_p=args.top_p))
    host, port = args.listen

    def ready() -> None:
        if unchecked:  # said once serving: a refusal of other flags stays one line
            print(f"forge-record: note: {unchecked}", file=sys.stderr, flush=True)
        print(f"forge-record: listening on {config.url} (serving {args.served_model} from {args.policy}, "
              f"policy version {version}); recording to {args.out}", flush=True)

    with GatewayThread(gateway) as gateway_url:
        config = RecorderConfig.one_upstream(Path(args.out), gateway_url, listen_host=host, listen_port=port,
                                             session=args.session, redact_rules=args.redact_rules,
                                             images=args.images, policy_version=version, labels=args.labels,
                                             keys=_keys(args))
        failures = serve_forever(config, on_ready=ready)
    return _closing_status(failures)


def cmd_run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UserError("run: give the command after --, e.g. forge-record run --out data -- claude -p hi")
    executable = shutil.which(cmd[0])
    if executable is None:
        raise UserError(f"run: command not found: {cmd[0]}")
    session = args.session or f"run-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    anthropic, openai, gemini = _upstreams(args)
    config = RecorderConfig(out=Path(args.out), upstream_anthropic=anthropic, upstream_openai=openai,
                            upstream_gemini=gemini, session=session,
                            redact_rules=args.redact_rules, images=args.images, policy_version=args.policy_version,
                            labels=args.labels)
    with tempfile.TemporaryDirectory(prefix="forge-record-run-") as scratch, BackgroundRecorder(config) as recorder:
        aimed = launch(cmd, config.url, session, Path(scratch))
        returncode = subprocess.call(aimed.argv, env={**os.environ, **aimed.env})
    print(file=sys.stderr)
    print(summary.summarise_session(args.out, session), file=sys.stderr)
    return _closing_status(recorder.call_failures, returncode)


def cmd_ls(args: argparse.Namespace) -> int:
    rows = summary.sessions(args.dir)
    print(summary.dumps(rows) if args.json else summary.format_sessions(rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    print(summary.show_session(args.dir, args.session))
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    replaced = compact(args.dir)
    if not replaced:
        print(f"{args.dir}: nothing to compact")
    for table, n in replaced.items():
        print(f"{table}: merged {n} files into 1")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    removed = delete_session(args.dir, args.session)
    if not any(removed.values()):
        raise UserError(f"no session {args.session!r} in {args.dir}")
    print(f"deleted session {args.session}: " + ", ".join(f"{n} {t} rows" for t, n in removed.items() if n))
    return 0


COMMANDS = {"serve": cmd_serve, "token": cmd_token, "run": cmd_run, "ls": cmd_ls, "show": cmd_show,
            "compact": cmd_compact, "delete": cmd_delete}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_verb("forge-record", lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    if args.command in ("serve", "run"):
        configure_export(args)
    if args.command in ("ls", "show", "compact", "delete"):
        read_manifest(Path(args.dir))
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
