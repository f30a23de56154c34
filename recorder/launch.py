"""How `forge-record run` and the runners aim a harness at a recorder session URL.

One launcher per harness CLI, found by the command's file name in
`LAUNCHERS`. A launcher returns the harness's own flags and environment that
point it at `<recorder>/s/<session>`. Config files a harness can only read
from disk go under `scratch`, a private directory the caller owns and
removes, never the user's HOME. Commands nobody knows get `harness_env`
alone: the base-URL variables that the Anthropic and OpenAI SDKs read.

Adding a harness: one function here and one row in `LAUNCHERS`, one adapter
in `runners/harnesses/`, one row of fingerprints in `recorder/harness.py`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Launch:
    """A command line and the environment additions that aim it at a session."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


Launcher = Callable[[list[str], str, str, Path], Launch]


PROVIDER = "forgerl"  # the name every harness config gives the recorder as its model provider


def session_root(base_url: str, session: str) -> str:
    """The session's URL on the recorder: every API path goes under it."""
    return f"{base_url}/s/{session}"


def harness_env(base_url: str, session: str) -> dict[str, str]:
    """Environment that points Claude Code and OpenAI-SDK clients at the recorder."""
    root = session_root(base_url, session)
    return {
        "ANTHROPIC_BASE_URL": root,
        "OPENAI_BASE_URL": f"{root}/v1",
        "FORGE_SESSION_ID": session,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def codex_overrides(base_url: str, session: str) -> list[str]:
    """`-c` flags that give Codex a provider pointing at the recorder over SSE."""
    provider = (f'{{name="{PROVIDER}", base_url="{session_root(base_url, session)}/v1", wire_api="responses", '
                f'env_key="OPENAI_API_KEY"}}')
    return ["-c", f"model_providers.{PROVIDER}={provider}", "-c", f"model_provider={PROVIDER}"]


def codex(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    return Launch([argv[0], *codex_overrides(base_url, session), *argv[1:]], harness_env(base_url, session))


def _write_json(path: Path, doc: dict) -> Path:
    """A harness config file (keys stay in the environment: configs name the variable, never its value)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    return path


def claude_code(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    return Launch(list(argv), harness_env(base_url, session))


def mini_swe_agent_env(base_url: str, session: str, scratch: Path) -> dict[str, str]:
    """mini-swe-agent (litellm): the OpenAI base URL, no first-run setup prompt, its global config
    (`.env`, last trajectory) in `scratch`, no cost lookup for an unpriced model, and litellm's model
    cost map read from the package instead of fetched from GitHub at import."""
    root = session_root(base_url, session)
    return {**harness_env(base_url, session), "OPENAI_API_BASE": f"{root}/v1", "MSWEA_CONFIGURED": "true",
            "MSWEA_GLOBAL_CONFIG_DIR": str(scratch / "mini-swe-agent"), "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def mini_swe_agent(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    return Launch(list(argv), mini_swe_agent_env(base_url, session, scratch))


BROWSER_USE_OFFLINE = {"ANONYMIZED_TELEMETRY": "false", "BROWSER_USE_CLOUD_SYNC": "false",
                       "BROWSER_USE_VERSION_CHECK": "false", "BROWSER_USE_CLOUD_HINTS": "false"}
"""browser-use 0.13's phone-home off: PostHog telemetry (eu.i.posthog.com), cloud sync of runs
(api.browser-use.com), the PyPI version check and cloud hints (names from its `config.py`)."""


def browser_use_env(base_url: str, session: str, scratch: Path) -> dict[str, str]:
    """browser-use's `ChatOpenAI` at the session (`OPENAI_BASE_URL`), its config folder (profiles, cached
    settings) in `scratch`, its phone-home off."""
    return {**harness_env(base_url, session), **BROWSER_USE_OFFLINE,
            "BROWSER_USE_CONFIG_DIR": str(scratch / "browser-use"), "XDG_CONFIG_HOME": str(scratch / "config"),
            "XDG_CACHE_HOME": str(scratch / "cache")}


def qwen_code(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    """Qwen Code 0.24 on its OpenAI auth (Chat Completions at `OPENAI_BASE_URL`, key in `OPENAI_API_KEY`); the
    flag outranks an auth type chosen in the user's settings. Its usage statistics (RUM beacons to
    `*.rum.aliyuncs.com`, on by default) are turned off; update checks and the IDE companion run only in the
    interactive TUI, and telemetry is off unless configured."""
    flags = [] if any(a.startswith("--auth-type") for a in argv) else ["--auth-type", "openai"]
    return Launch([argv[0], *flags, *argv[1:]],
                  {**harness_env(base_url, session), "QWEN_USAGE_STATISTICS_ENABLED": "false"})


PI_OFFLINE = {"PI_OFFLINE": "1", "PI_TELEMETRY": "0"}  # no version check, install report or tool downloads


def pi_models(base_url: str, session: str, model: str) -> dict:
    """pi's `models.json`: one Chat Completions provider at the session, its key read from `OPENAI_API_KEY`
    (the variable's name, not its value, is written)."""
    return {"providers": {PROVIDER: {
        "baseUrl": f"{session_root(base_url, session)}/v1", "api": "openai-completions", "apiKey": "OPENAI_API_KEY",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": model}]}}}


def pi(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    """pi with its agent dir in `scratch` (a custom provider can only come from `models.json` there) and its
    sessions where pi keeps them for this folder. `--model M` names the upstream model (a `P/` prefix naming
    the given `--provider P` is dropped; `Qwen/Qwen3-8B` stays whole)."""
    rest, given = _drop_options(argv[1:], ("--provider", "--model"))
    model = given.get("--model", "policy")
    for provider in (PROVIDER, given.get("--provider")):
        model = model.removeprefix(f"{provider}/") if provider else model
    agent = scratch / "pi-agent"
    _write_json(agent / "models.json", pi_models(base_url, session, model))
    user_agent = Path(os.environ.get("PI_CODING_AGENT_DIR") or Path.home() / ".pi" / "agent").expanduser()
    sessions = os.environ.get("PI_CODING_AGENT_SESSION_DIR") or str(user_agent / "sessions" / pi_folder(Path.cwd()))
    env = {**harness_env(base_url, session), **PI_OFFLINE, "PI_CODING_AGENT_DIR": str(agent),
           "PI_CODING_AGENT_SESSION_DIR": sessions}
    return Launch([argv[0], *rest, "--provider", PROVIDER, "--model", model], env)


def pi_folder(cwd: Path) -> str:
    """The folder name pi gives a working directory's sessions (`getDefaultSessionDir`)."""
    return "--" + re.sub(r"[/\\:]", "-", str(cwd).lstrip("/\\")) + "--"


def _drop_options(args: list[str], names: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """`args` without the options `names` (`--x V` or `--x=V`), and the values they had."""
    rest, values, i = [], {}, 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in names and eq:
            values[name] = value
        elif name in names and i + 1 < len(args):
            values[name] = args[i + 1]
            i += 1
        else:
            rest.append(args[i])
        i += 1
    return rest, values


GEMINI_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "ide": {"enabled": False},
}
"""Gemini CLI's settings for a recorded run: the API-key auth (with only `GOOGLE_GEMINI_BASE_URL` set, 0.61 picks
its "gateway" auth, which headless mode then refuses), and its phone-home off: update checks (npm registry),
usage statistics (Clearcut, play.googleapis.com), OpenTelemetry export, IDE companion discovery."""


def gemini_env(base_url: str, session: str, home: Path) -> dict[str, str]:
    """Gemini CLI 0.61: the Gemini API at `GOOGLE_GEMINI_BASE_URL`, key in `GEMINI_API_KEY` (sent as
    `x-goog-api-key`), and `GEMINI_CLI_HOME` = `home`, whose `.gemini/settings.json` holds `GEMINI_SETTINGS`
    (its chats go there too). Not the system settings file: Gemini CLI skips one whose parent folders are
    writable by others, as /tmp is. The workspace is trusted, so headless `--yolo` may run tools."""
    _write_json(home / ".gemini" / "settings.json", GEMINI_SETTINGS)
    return {**harness_env(base_url, session), "GOOGLE_GEMINI_BASE_URL": session_root(base_url, session),
            "GEMINI_CLI_HOME": str(home), "GEMINI_CLI_TRUST_WORKSPACE": "true"}


def gemini(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    return Launch(list(argv), gemini_env(base_url, session, scratch / "gemini"))


OPENCODE_OFFLINE = {"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
                    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1"}
"""OpenCode 1.18's phone-home off: the models.dev catalogue, the update check, language-server downloads and
session sharing (names from its `RuntimeFlags`)."""


def opencode_config(base_url: str, session: str, model: str) -> dict:
    """OpenCode's config (`OPENCODE_CONFIG_CONTENT`): one `@ai-sdk/openai-compatible` provider at the session,
    its key read from `OPENAI_API_KEY` when called, as the default model; every permission granted (headless
    runs cannot ask), no auto-update, no sharing, no git snapshots of the workspace (kept for undo only)."""
    return {"provider": {PROVIDER: {
                "npm": "@ai-sdk/openai-compatible", "name": PROVIDER,
                "options": {"baseURL": f"{session_root(base_url, session)}/v1", "apiKey": "{env:OPENAI_API_KEY}"},
                "models": {model: {"name": model, "tool_call": True}}}},
            "model": f"{PROVIDER}/{model}", "permission": "allow", "autoupdate": False, "share": "disabled",
            "snapshot": False}


def opencode_env(base_url: str, session: str, model: str, config_home: Path, workdir: Path) -> dict[str, str]:
    """OpenCode aimed at the session, working in `workdir` (it reads `PWD` before its real working directory),
    its global config folder `config_home/opencode` (`XDG_CONFIG_HOME`, so the user's own config and plugins
    stay out of the recording). OpenCode 1.18 runs `npm install @opencode-ai/plugin` in the background in every
    config folder whose lock file lacks it; the folder is seeded with that lock file and an empty
    `node_modules`, so it finds nothing to do and fetches nothing."""
    folder = config_home / "opencode"
    (folder / "node_modules").mkdir(parents=True, exist_ok=True)
    lock = {"packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}}
    (folder / "package-lock.json").write_text(json.dumps(lock))
    return {**harness_env(base_url, session), **OPENCODE_OFFLINE, "XDG_CONFIG_HOME": str(config_home),
            "PWD": str(workdir), "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(base_url, session, model))}


def opencode(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    """`-m M` (or `provider/M`) names the upstream model, served as `forgerl/M` (the config's default)."""
    rest, given = _drop_options(argv[1:], ("-m", "--model"))
    model = (given.get("-m") or given.get("--model") or "policy").split("/", 1)[-1]
    return Launch([argv[0], *rest], opencode_env(base_url, session, model, scratch / "opencode-config", Path.cwd()))


def openclaw_config(base_url: str, session: str, model: str, workspace: Path) -> dict:
    """OpenClaw 2026.9's `openclaw.json`: one Chat Completions provider at the session (its key read from
    `OPENAI_API_KEY`, the variable's name written, not its value) as the default model, the workspace left as
    it is (no AGENTS.md/SOUL.md/... bootstrap files), and its phone-home off: memory search (embeddings from
    api.openai.com on every session update), the daily update check and feature statistics
    (telemetry.openclaw.ai)."""
    return {"models": {"providers": {PROVIDER: {
                "baseUrl": f"{session_root(base_url, session)}/v1", "api": "openai-completions",
                "apiKey": "${OPENAI_API_KEY}", "models": [{"id": model, "name": model}]}}},
            "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{model}"},
                                    "workspace": str(workspace), "skipBootstrap": True}},
            "memory": {"search": {"enabled": False}},
            "update": {"checkOnStart": False}, "telemetry": {"enabled": False}}


def openclaw_env(base_url: str, session: str, model: str, workspace: Path, state: Path) -> dict[str, str]:
    """OpenClaw with its state folder (config, agents' SQLite transcripts) at `state`."""
    config = _write_json(state / "openclaw.json", openclaw_config(base_url, session, model, workspace))
    return {**harness_env(base_url, session), "OPENCLAW_STATE_DIR": str(state), "OPENCLAW_CONFIG_PATH": str(config),
            "OPENCLAW_NO_AUTO_UPDATE": "1"}


def openclaw(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    """The working directory is the agent's workspace; `--model M` (or `provider/M`) names the upstream model.
    Its state (config, SQLite transcripts) lives in `scratch` and goes with it: the recording is what stays."""
    rest, given = _drop_options(argv[1:], ("--model",))
    model = given.get("--model", "policy").split("/", 1)[-1]
    return Launch([argv[0], *rest], openclaw_env(base_url, session, model, Path.cwd(), scratch / "openclaw"))


LAUNCHERS: dict[str, Launcher] = {
    "claude": claude_code,
    "codex": codex,
    "gemini": gemini,
    "qwen": qwen_code,
    "pi": pi,
    "mini": mini_swe_agent,
    "opencode": opencode,
    "openclaw": openclaw,
}


def launch(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    """`argv` aimed at the session: its harness's launcher, else the SDK base-URL variables."""
    launcher = LAUNCHERS.get(Path(argv[0]).name)
    if launcher is None:
        return Launch(list(argv), harness_env(base_url, session))
    return launcher(argv, base_url, session, scratch)
