"""Harness vocabulary in one place: tool kinds, checks, error text, harness-written user turns, prices.

Every behaviour metric reads harness-specific names through these tables
(registered in DuckDB by `forgerl.analysis.views`), never through names
scattered in SQL. To teach the analysis a new harness, add rows here.
"""

from __future__ import annotations

from forgerl.schema.segments import SUBAGENT_TOOLS

KINDS: tuple[str, ...] = ("shell", "read", "write", "search", "web", "plan", "subagent", "other")

# tool name as the model sees it -> kind. Sources: Claude Code 2.1 (sdk-tools.d.ts), Codex CLI 0.17x,
# OpenClaw and ZeroClaw tool lists. Unlisted tools (MCP tools, custom functions) are `other`.
TOOL_KINDS: dict[str, str] = {
    # Claude Code
    "Bash": "shell", "BashOutput": "shell", "KillShell": "shell", "KillBash": "shell",
    "Read": "read", "LS": "read", "NotebookRead": "read",
    "Edit": "write", "MultiEdit": "write", "Write": "write", "NotebookEdit": "write",
    "Glob": "search", "Grep": "search",
    "WebFetch": "web", "WebSearch": "web",
    "TodoWrite": "plan", "TaskCreate": "plan", "TaskUpdate": "plan", "TaskList": "plan", "TaskGet": "plan",
    "ExitPlanMode": "plan",
    # Codex CLI
    "exec_command": "shell", "write_stdin": "shell", "shell": "shell", "local_shell": "shell",
    "container.exec": "shell", "unified_exec": "shell",
    "apply_patch": "write",
    "read_file": "read", "list_dir": "read", "view_image": "read",
    "grep_files": "search",
    "web_search": "web", "web_fetch": "web",
    "update_plan": "plan",
    # Codex CLI 0.171: goals (`create_goal` / `update_goal` / `get_goal`, below with OpenClaw's) and its
    # multi_agent_v1 namespace: spawn_agent starts a subagent (SUBAGENT_TOOLS), the rest steer or await one.
    "send_input": "subagent", "wait_agent": "subagent", "resume_agent": "subagent", "close_agent": "subagent",
    # OpenClaw / ZeroClaw
    "exec": "shell", "process": "shell", "file_read": "read", "read": "read",
    "edit": "write", "write": "write", "file_write": "write",
    "glob": "search", "grep": "search", "memory_search": "search",
    "browser": "web", "http_request": "web",
    # Qwen Code 0.24.4 (ToolNames in its bundle; read_file, edit, glob, exec, web_fetch, web_search as above).
    # `agent` is its subagent tool; `todo_write` (off unless tools.todoWrite.enabled) its plan.
    "run_shell_command": "shell", "write_file": "write", "notebook_edit": "write",
    "list_directory": "read", "zoom_image": "read", "grep_search": "search",
    "todo_write": "plan", "enter_plan_mode": "plan", "exit_plan_mode": "plan", "task_create": "plan",
    "task_update": "plan", "task_list": "plan",  # its subagent tool, agent: SUBAGENT_TOOLS
    # pi 0.73.1 (built-in tools; read, edit, write, grep as above)
    "bash": "shell", "find": "search", "ls": "read",
    # mini-swe-agent 2.4.6: one tool, `bash` (as pi's above; v2 sends it as a tool definition and calls it
    # as a tool call). Its checks are shell commands (CHECK_COMMANDS); it has no plan or subagent tool.
    # Gemini CLI 0.61.0 (the functionDeclarations it sends; run_shell_command, read_file, write_file, glob,
    # list_directory, grep_search, web_fetch, enter_plan_mode as above). `invoke_agent` is its subagent tool,
    # `write_todos` and `update_topic` (its chapter/progress narration) its plan tools.
    "replace": "write", "read_many_files": "read", "google_web_search": "web",
    "list_background_processes": "shell", "read_background_output": "shell",
    "write_todos": "plan", "update_topic": "plan",  # invoke_agent: SUBAGENT_TOOLS
    # OpenClaw 2026.9.6 (offered up front: exec, process, read, write, edit, apply_patch, ls as above; the
    # deferred ones it calls through `tool_call`, e.g. browser, web_*, view_image, file_write as above).
    # `sessions_spawn` is its subagent tool; `subagents`, `agents_wait` and `sessions_yield` steer or await
    # subagents; goals are its plan. tool_search / tool_describe / tool_call (deferred-tool discovery) are other.
    "terminal": "shell", "dir_list": "read", "dir_fetch": "read", "file_fetch": "read", "pdf": "read",
    "memory_get": "read", "subagents": "subagent", "agents_wait": "subagent", "sessions_yield": "subagent",
    "create_goal": "plan", "update_goal": "plan", "get_goal": "plan",
    # OpenCode 1.18.33 (bash, read, edit, write, glob, grep, apply_patch as above; a gpt-* model gets
    # apply_patch in place of edit and write). `task` is its subagent tool, `todowrite` its plan.
    "webfetch": "web", "websearch": "web", "todowrite": "plan", "plan_enter": "plan", "plan_exit": "plan",
    # Subagent tools of every harness: one list, which the thread segmenter also reads.
    **{name: "subagent" for name in SUBAGENT_TOOLS},
}

# Argument keys that name a tool's file (first present wins) and its shell command.
PATH_KEYS: tuple[str, ...] = ("file_path", "path", "filePath", "notebook_path", "file", "target_file")
COMMAND_KEYS: tuple[str, ...] = ("cmd", "command")
# apply_patch names its files inside the patch text.
PATCH_FILE = r"\*\*\* (?:Update|Add|Delete) File: (\S+)"

# A shell command is a check (self-verification) when it matches one of these (after leading
# `cd DIR &&` hops are removed). Named so the docs can list them. RE2 syntax (no lookaround).
CHECK_COMMANDS: dict[str, str] = {
    "test": r"^(pytest|py\.test|tox|nox)\b|^python[0-9.]* -m (pytest|unittest)\b|^(npm|yarn|pnpm|bun) (run )?test\b"
            r"|^(cargo|go|dotnet|mvn|gradle|\./gradlew) test\b|^(jest|vitest|mocha|rspec|phpunit|ctest)\b"
            r"|^bash \S*test\S*|^\./\S*test\S*",
    "build": r"^(make|cmake|ninja|tsc)\b|^(cargo|go|dotnet|mvn|gradle|\./gradlew) (build|check|vet|compile)\b"
             r"|^(npm|yarn|pnpm|bun) (run )?build\b|^(gcc|g\+\+|clang|clang\+\+|javac|rustc)\b"
             r"|^python[0-9.]* -m (py_compile|compileall)\b|^node --check\b",
    "lint": r"^(ruff|flake8|pylint|mypy|pyright|eslint|prettier --check|black --check|shellcheck|clippy)\b"
            r"|^cargo clippy\b|^(npm|yarn|pnpm|bun) (run )?(lint|typecheck)\b|^python[0-9.]* -m (ruff|mypy|flake8)\b",
    "run": r"^python[0-9.]* [^-\s]\S*\.py\b|^(node|deno|bun) [^-\s]\S*\.(js|mjs|ts)\b|^(bash|sh) [^-\s]\S*\.sh\b",
    "reread": r"^(cat|head|tail|less|more|wc|diff|cmp|git diff|git status|git show|ls|sed -n|grep|rg)\b",
}

# A shell command (not a check, not apply_patch) writes a file when it redirects output into one (`> F`, `>> F`,
# `cat > F <<EOF`) or tees into one: each pattern's group 1 is the file. Devices (`/dev/null`) are not files.
# mini-swe-agent and the harnesses' shell tools write this way; such a call stays a `shell` call and counts as a
# write for self-verification. A `>` inside a quoted string also matches (a known over-count; a bare number such
# as the 5 of `x > 5` is not taken for a file).
SHELL_WRITES: tuple[str, ...] = (r"(?:^|[^0-9&>])>>?\s*([^\s&|;<>()'\"=][^\s&|;<>()'\"]*)",
                                 r"(?:^|[;&|]\s*)tee\s+(?:-a\s+)?([^\s&|;<>()'\"-][^\s&|;<>()'\"]*)")

# A tool result failed when the harness flagged it (`is_error`), reported a non-zero exit code (mini-swe-agent
# reports `"returncode": N`), or its text matches one of these.
EXIT_CODE = r"(?i)(?:exit(?:ed with)? code:?|exit status|\"exit_code\":|\"returncode\":|<returncode>)\s*(-?\d+)"
ERROR_TEXT = (r"^\s*(<tool_use_error>|Error:|ERROR:|error:|Traceback \(most recent call last\)|fatal:)"
              r"|: command not found|No such file or directory|Permission denied")

# User-role text written by the harness, not a person: reminders, hook output, slash-command
# echoes, environment and instruction preambles. (A subagent's prompt is recognised separately:
# it is the `prompt` argument of a subagent tool call in the same session.)
HARNESS_USER_TEXT: dict[str, str] = {
    "system_reminder": r"^\s*<system-reminder>",
    "hook_output": r"^\s*<[a-z-]*hook[a-z-]*>|hook (success|error|blocking)",
    "local_command": r"^\s*<(command-name|command-message|command-args|local-command-stdout|local-command-stderr)>",
    "caveat": r"^\s*Caveat: The messages below were generated by the user while running local commands",
    "environment": r"^\s*<(environment_context|user_instructions|permissions instructions|turn_aborted)>",
    "agents_md": r"^\s*# AGENTS\.md instructions",
    "interrupted": r"^\s*\[Request interrupted by user",
}

# USD per million tokens: (model prefix, input, output, cache read, cache write), longest prefix wins.
# Anthropic rows: platform.claude.com model pages, checked 2026-12-03 (cache write = the 5-minute rate,
# 1.25x input; the 1-hour rate is 2x and is not told apart in the recorded usage). Sonnet 5 / 5.5 and
# Haiku 5.5 cache rates and the Sonnet 5.5 cache-read cut of 2026-10-07 are from vendors' price-list
# changelogs; Haiku 5.5 is its up-to-100k-token-prompt rate. OpenAI rows are unverified list prices.
# Edit to match your contract. Unknown models get no cost and count as `unpriced_calls`.
PRICES: tuple[tuple[str, float, float, float, float], ...] = (
    ("claude-fable-5-1", 10.0, 50.0, 0.25, 12.50),
    ("claude-fable-5", 10.0, 50.0, 1.0, 12.50),
    ("claude-mythos-5-1", 10.0, 50.0, 0.25, 12.50),
    ("claude-mythos-5", 10.0, 50.0, 1.0, 12.50),
    ("claude-opus-5-5", 4.0, 20.0, 0.20, 5.0),
    ("claude-opus-5", 5.0, 25.0, 0.50, 6.25),
    ("claude-opus-4-8", 5.0, 25.0, 0.50, 6.25),
    ("claude-opus-4-7", 5.0, 25.0, 0.50, 6.25),
    ("claude-opus-4-6", 5.0, 25.0, 0.50, 6.25),
    ("claude-opus-4-5", 5.0, 25.0, 0.50, 6.25),
    ("claude-opus-4", 15.0, 75.0, 1.50, 18.75),
    ("claude-sonnet-5-5", 2.0, 10.0, 0.10, 2.50),
    ("claude-sonnet-5", 2.0, 10.0, 0.20, 2.50),
    ("claude-sonnet-4", 3.0, 15.0, 0.30, 3.75),
    ("claude-3-7-sonnet", 3.0, 15.0, 0.30, 3.75),
    ("claude-haiku-5-5", 0.10, 0.50, 0.01, 0.125),
    ("claude-haiku-4-5", 1.0, 5.0, 0.10, 1.25),
    ("claude-3-5-haiku", 0.80, 4.0, 0.08, 1.0),
    ("gpt-5-mini", 0.25, 2.0, 0.025, 0.0),
    ("gpt-5-nano", 0.05, 0.40, 0.005, 0.0),
    ("gpt-5", 1.25, 10.0, 0.125, 0.0),
    ("gpt-4.1-mini", 0.40, 1.60, 0.10, 0.0),
    ("gpt-4.1", 2.0, 8.0, 0.50, 0.0),
    ("gpt-4o-mini", 0.15, 0.60, 0.075, 0.0),
    ("gpt-4o", 2.50, 10.0, 1.25, 0.0),
)

# Plan tools. Snapshot tools resend the whole list each time (the last call is the plan's final
# state): tool name -> JSON path of the items, each with a `status`. Task tools create items one
# call at a time (ids 1, 2, ... in creation order, as Claude Code numbers them) and update them
# by `taskId`.
PLAN_SNAPSHOTS: dict[str, str] = {"TodoWrite": "$.todos", "update_plan": "$.plan", "todo_write": "$.todos",
                                  "todowrite": "$.todos", "write_todos": "$.todos"}  # OpenCode, Gemini CLI
# Item tools: each create call adds one item (numbered 1, 2, ... in call order); an update names its item by the
# argument at the given JSON path, or (None: Codex and OpenClaw goals, one active at a time) updates the latest
# item created before it.
PLAN_CREATE: tuple[str, ...] = ("TaskCreate", "create_goal")
PLAN_UPDATE: dict[str, str | None] = {"TaskUpdate": "$.taskId", "update_goal": None}
PLAN_DONE: tuple[str, ...] = ("completed", "complete")  # todo lists and tasks say completed, goals complete

# A tool result names its call by id, and some harnesses rewrite the ids they send back (OpenClaw drops the `_`
# of `call_…`): results are matched to calls on the id without these characters.
CALL_ID_DROP = r"[^A-Za-z0-9]"

# Deferred-tool wrappers: the model calls the wrapper with the real tool's name and arguments (OpenClaw
# `tool_call` {id, args}, Qwen Code `tool_call` {name, arguments}). The analysis reads the call as the tool it
# wraps (its kind, path, plan; an id `openclaw:core:create_goal` names `create_goal`); `tool_calls.via` keeps the
# wrapper's name. (keys naming the tool, keys of its arguments)
TOOL_WRAPPERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {"tool_call": (("id", "name"), ("args", "arguments"))}

# Argument keys that carry a subagent's prompt (its sub-conversation's first user text).
SUBAGENT_PROMPT_KEYS: tuple[str, ...] = ("prompt", "task", "message")

# Argument keys tried (after PATH_KEYS and the command) to name what other tools act on.
TARGET_KEYS: tuple[str, ...] = ("pattern", "query", "url")
