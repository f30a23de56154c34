"""The derived DuckDB views: tool calls and results, turns, behaviour metrics, reliability.

Each view is a named SQL definition with a one-line doc; `register` creates
them all on a connection from `forgerl.schema.duck.connect`. Harness names,
check commands and error text come from `kinds.py` tables, never literals
here. README.md defines every metric in words; the definitions below are the
truth those words describe.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import pyarrow as pa

from forgerl.schema import attempts, duck
from forgerl.schema.segments import PLACED_SQL, SEGMENT_ID_SQL

from . import gui, kinds
from .groups import FIXED, metrics_by, pass_curve_by
from .reliability import pass_at_k, pass_pow_k

# The groups with a registered `metrics_by_*` / `pass_curve_by_*` view (any other column: `groups.metrics_by`).
GROUPS: dict[str, str] = {g: g for g in FIXED}


@dataclass(frozen=True)
class View:
    name: str
    doc: str
    sql: str


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _coalesce_keys(keys: tuple[str, ...], doc: str = "args") -> str:
    return "coalesce(" + ", ".join(f"json_extract_string({doc}, {_lit('$.' + k)})" for k in keys) + ")"


def _first_match(column: str, patterns: dict[str, str]) -> str:
    whens = " ".join(f"WHEN regexp_matches({column}, {_lit(p)}) THEN {_lit(name)}" for name, p in patterns.items())
    return f"CASE {whens} END"


def _snapshot_statuses() -> str:
    whens = " ".join(f"WHEN tool_name = {_lit(t)} THEN json_extract_string(args, {_lit(path + '[*].status')})"
                     for t, path in kinds.PLAN_SNAPSHOTS.items())
    return f"CASE {whens} END"


def _shell_write_targets() -> str:
    """The file each `kinds.SHELL_WRITES` pattern finds in `command_line` (NULL where it finds none)."""
    return ", ".join(f"nullif(regexp_extract(command_line, {_lit(p)}, 1), '')" for p in kinds.SHELL_WRITES)


def _update_target() -> str:
    """The item a plan update names (kinds.PLAN_UPDATE), NULL for updates of the latest item."""
    whens = " ".join(f"WHEN tool_name = {_lit(t)} THEN json_extract_string(try(arguments::JSON), {_lit(path)})"
                     for t, path in kinds.PLAN_UPDATE.items() if path)
    return f"CASE {whens} END"


def _lit_list(values: list[str]) -> str:
    return "[" + ", ".join(map(_lit, values)) + "]"


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(map(_lit, names))


def _unwrap(part: str) -> str:
    """The wrapped tool's name (`part` = 'name'; a catalogue id such as `openclaw:core:create_goal` gives its last
    part) or arguments ('args') of a wrapper call, else the call's own."""
    whens = []
    for wrapper, (name_keys, arg_keys) in kinds.TOOL_WRAPPERS.items():
        keys = name_keys if part == "name" else arg_keys
        fn = "json_extract_string" if part == "name" else "json_extract"
        got = "coalesce(" + ", ".join(f"{fn}(try(m.arguments::JSON), {_lit('$.' + k)})" for k in keys) + ")"
        value = f"regexp_replace({got}, '^.*:', '')" if part == "name" else f"CAST({got} AS VARCHAR)"
        whens.append(f"WHEN m.tool_name = {_lit(wrapper)} AND {got} IS NOT NULL THEN {value}")
    own = "m.tool_name" if part == "name" else "m.arguments"
    return f"CASE {' '.join(whens)} ELSE {own} END"


# A turn is a call that holds a model turn (placed in a segment as it was written); its model is the one that
# answered (else the one asked for).
IS_TURN = PLACED_SQL
TURN_MODEL = "coalesce(model_returned, model_requested)"

# `turn` counts a session's model calls in time order; `segment_index` / `segment_turn` place each in the
# thread the dataset stored for it (`forgerl.schema.segments`), so a subagent's turns count in its own thread.
TURNS = f"""
SELECT session_id, call_id,
       row_number() OVER (PARTITION BY session_id ORDER BY t_start, seq, call_id) AS turn,
       t_start, {TURN_MODEL} AS model, output_refs,
       segment_index, {SEGMENT_ID_SQL} AS segment_id, segment_reason,
       CASE WHEN segment_index IS NOT NULL THEN row_number() OVER (
           PARTITION BY session_id, segment_index ORDER BY t_start, seq, call_id) END AS segment_turn,
       malformed_tool_calls
FROM calls WHERE {IS_TURN}
"""

# Paths read from a tool call's arguments, parsed once per call: [command keys, path keys, target keys, patch].
_ARG_PATHS = [*(f"$.{k}" for k in (*kinds.COMMAND_KEYS, *kinds.PATH_KEYS, *kinds.TARGET_KEYS)), "$.input", "$.patch",
              "$.patchText"]
_N_CMD, _N_PATH, _N_TARGET = len(kinds.COMMAND_KEYS), len(kinds.PATH_KEYS), len(kinds.TARGET_KEYS)


def _slot(first: int, count: int) -> str:
    return "coalesce(" + ", ".join(f"v[{i}]" for i in range(first, first + count)) + ")"


# A tool call part is written with the call whose output first held it (`messages.call_id`), so its turn
# is that call's and its position its index in that call's output_refs. The join names the session too, so a
# query for one session's tool calls (the viewer's) reads only that session's calls.
TOOL_CALLS = f"""
WITH made AS (  -- a deferred-tool wrapper (kinds.TOOL_WRAPPERS) is read as the tool it calls
  SELECT m.session_id, m.call_id, t.turn, list_position(t.output_refs, m.part_hash) AS pos, m.tool_call_id,
         {_unwrap('name')} AS tool_name, {_unwrap('args')} AS arguments,
         CASE WHEN m.tool_name IN ({_names(tuple(kinds.TOOL_WRAPPERS))}) THEN m.tool_name END AS via
  FROM messages m JOIN turns t ON t.session_id = m.session_id AND t.call_id = m.call_id
  WHERE m.part_type = 'tool_call' AND m.direction = 'output'),
raw AS (
  SELECT made.*, coalesce(k.kind, 'other') AS declared_kind,
         json_extract_string(try(arguments::JSON), {_lit_list(_ARG_PATHS)}) AS v
  FROM made LEFT JOIN tool_kinds k USING (tool_name)),
cmd0 AS (
  SELECT * EXCLUDE (v), {_slot(1, _N_CMD)} AS cmd_raw,
    {_slot(1 + _N_CMD, _N_PATH)} AS arg_path,
    {_slot(1 + _N_CMD + _N_PATH, _N_TARGET)} AS arg_target,
    coalesce(v[{len(_ARG_PATHS) - 2}], v[{len(_ARG_PATHS) - 1}], v[{len(_ARG_PATHS)}], CASE WHEN v IS NULL THEN arguments END)
      AS patch
  FROM raw),
cmd1 AS (  -- a command given as a list (["bash", "-lc", S]) arrives as its JSON text
  SELECT *, CASE WHEN starts_with(ltrim(cmd_raw), '[') THEN try(json_extract_string(cmd_raw, '$[*]')) END AS argv
  FROM cmd0),
cmd AS (
  SELECT * EXCLUDE (cmd_raw, argv),
    CASE WHEN argv IS NULL THEN cmd_raw
         WHEN len(argv) >= 3 AND regexp_matches(argv[1], '(^|/)(ba|z)?sh$') AND argv[2] IN ('-c', '-lc') THEN argv[3]
         ELSE array_to_string(argv, ' ') END AS command
  FROM cmd1),
tok AS (
  SELECT *, CASE WHEN starts_with(ltrim(command), 'cd ')
                 THEN regexp_replace(trim(command), '^(cd\\s+[^;&|]+?\\s*(&&|;)\\s*)+', '')
                 ELSE trim(command) END AS command_line
  FROM cmd),
prog AS (
  SELECT *, string_split_regex(command_line, '\\s+') AS tokens FROM tok),
kinded AS (
  SELECT *, CASE WHEN command IS NOT NULL THEN regexp_replace(tokens[1], '^.*/', '') END AS program,
         CASE WHEN command IS NOT NULL THEN list_filter(tokens[2:], lambda x: NOT starts_with(x, '-'))[1] END
           AS program_arg,
         coalesce(arg_path, CASE WHEN patch IS NOT NULL OR command IS NOT NULL THEN
                  nullif(regexp_extract(coalesce(patch, command), {_lit(kinds.PATCH_FILE)}, 1), '') END) AS path
  FROM prog),
checked AS (
  SELECT *, CASE WHEN declared_kind = 'shell' AND program <> 'apply_patch'
                 THEN {_first_match('command_line', kinds.CHECK_COMMANDS)} END AS check_kind
  FROM kinded),
written AS (  -- a shell command that is not a check and redirects or tees into a file writes it (kinds.SHELL_WRITES)
  SELECT *, CASE WHEN declared_kind = 'shell' AND program <> 'apply_patch' AND check_kind IS NULL
                 THEN list_filter([{_shell_write_targets()}], lambda f: f IS NOT NULL AND NOT starts_with(f, '/dev/')
                                  AND NOT regexp_matches(f, '^[0-9.]+$'))[1] END AS shell_write
  FROM checked)
SELECT session_id, call_id, turn, pos, turn * 100000 + pos AS step, tool_call_id,
       regexp_replace(tool_call_id, {_lit(kinds.CALL_ID_DROP)}, '', 'g') AS call_key, tool_name, via,
       CASE WHEN program = 'apply_patch' THEN 'write' ELSE declared_kind END AS kind, arguments,
       coalesce(path, shell_write) AS path, command, command_line, program, program_arg,
       coalesce(path, shell_write, CASE WHEN command IS NOT NULL THEN program || coalesce(' ' || program_arg, '') END,
                arg_target, tool_name) AS target,
       check_kind, program = 'apply_patch' OR declared_kind = 'write' OR shell_write IS NOT NULL AS writes_file
FROM written
"""

TOOL_RESULTS = f"""
WITH r AS (
  SELECT session_id, tool_call_id, is_error,
         CASE WHEN text IS NOT NULL THEN text
              ELSE coalesce(array_to_string(json_extract_string(part, '$.content[*].text'), chr(10)), '') END AS content
  FROM messages WHERE part_type = 'tool_result'),
g AS (
  SELECT session_id, tool_call_id, bool_or(coalesce(is_error, false)) AS is_error, first(content) AS content,
         max(try_cast(nullif(regexp_extract(content, {_lit(kinds.EXIT_CODE)}, 1), '') AS INTEGER)) AS exit_code,
         bool_or(regexp_matches(content, {_lit(kinds.ERROR_TEXT)})) AS error_text
  FROM r GROUP BY session_id, tool_call_id)
SELECT *, regexp_replace(tool_call_id, {_lit(kinds.CALL_ID_DROP)}, '', 'g') AS call_key,
       is_error OR coalesce(exit_code, 0) <> 0 OR error_text AS failed
FROM g
"""

# An episode is a run of failed calls of one intent; the first success after it is what ends it, so the
# episode is keyed by that success's step (NULL: given up, only ever the intent's last run). Both window
# aggregates share one frame order, so the whole view costs one sort.
RECOVERIES = """
WITH a AS (
  SELECT tc.session_id, tc.kind, tc.target, tc.step, tc.turn, tr.failed
  FROM tool_calls tc JOIN tool_results tr USING (session_id, call_key)),
b AS (
  SELECT *, min(step) FILTER (WHERE NOT failed) OVER w AS next_ok_step,
            arg_min(turn, step) FILTER (WHERE NOT failed) OVER w AS next_ok_turn
  FROM a
  WINDOW w AS (PARTITION BY session_id, kind, target ORDER BY step ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING))
SELECT session_id, kind, target,
       row_number() OVER (PARTITION BY session_id, kind, target ORDER BY min(step)) AS episode,
       count(*) AS failures, min(turn) AS failed_turn, any_value(next_ok_turn) AS recovered_turn,
       next_ok_step IS NOT NULL AS recovered, any_value(next_ok_turn) - min(turn) AS turns_to_recover
FROM b WHERE failed
GROUP BY session_id, kind, target, next_ok_step
"""

VERIFICATION = """
WITH w AS (
  SELECT session_id, count(*) AS writes, max(step) AS last_write_step, arg_max(turn, step) AS last_write_turn,
         list(DISTINCT path) FILTER (WHERE path IS NOT NULL) AS written
  FROM tool_calls WHERE writes_file GROUP BY session_id),
ck AS (  -- a read of a written file: the same path, or one path ending in /<the other> (relative against absolute)
  SELECT tc.session_id, tc.step, tc.turn, coalesce(tc.check_kind, 'reread') AS check_kind
  FROM tool_calls tc JOIN w USING (session_id)
  WHERE tc.step > w.last_write_step
    AND (tc.check_kind IS NOT NULL OR (tc.kind = 'read' AND len(list_filter(w.written, lambda p: p = tc.path
         OR ends_with(tc.path, '/' || p) OR ends_with(p, '/' || tc.path))) > 0)))
SELECT w.session_id, any_value(w.writes) AS writes, any_value(w.last_write_turn) AS last_write_turn,
       min(ck.turn) AS check_turn, arg_min(ck.check_kind, ck.step) AS check_kind,
       min(ck.turn) IS NOT NULL AS verified, min(ck.turn) - any_value(w.last_write_turn) AS verify_latency_turns
FROM w LEFT JOIN ck USING (session_id) GROUP BY w.session_id
"""

USER_TURNS = f"""
WITH prompts AS (
  SELECT DISTINCT session_id, {_coalesce_keys(kinds.SUBAGENT_PROMPT_KEYS, 'try(arguments::JSON)')} AS prompt
  FROM tool_calls WHERE kind = 'subagent'),
u AS (
  SELECT session_id, call_id, part_hash, text FROM messages
  WHERE role = 'user' AND part_type = 'text' AND direction = 'input' AND text IS NOT NULL)
SELECT u.session_id, u.call_id, u.part_hash, u.text,
       coalesce({_first_match('u.text', kinds.HARNESS_USER_TEXT)},
                CASE WHEN p.prompt IS NOT NULL THEN 'subagent_prompt' END) AS harness_reason,
       CASE WHEN harness_reason IS NULL THEN 'human' ELSE 'harness' END AS written_by
FROM u LEFT JOIN (SELECT DISTINCT session_id, prompt FROM prompts WHERE prompt IS NOT NULL) p
  ON p.session_id = u.session_id AND p.prompt = u.text
"""

# USD at list price of token counts `t` under the matched `prices` row `p`: calls and sessions priced one way.
_COST_USD = ("(coalesce(t.input_tokens, 0) * p.input + coalesce(t.output_tokens, 0) * p.output"
             " + coalesce(t.cache_read_tokens, 0) * p.cache_read + coalesce(t.cache_write_tokens, 0) * p.cache_write)"
             " / 1e6")

SESSION_COSTS = f"""
WITH per_model AS (
  SELECT session_id, coalesce(model_returned, model_requested, '') AS model, count(*) AS calls,
         coalesce(sum(input_tokens), 0) AS input_tokens, coalesce(sum(output_tokens), 0) AS output_tokens,
         coalesce(sum(cache_read_tokens), 0) AS cache_read_tokens,
         coalesce(sum(cache_write_tokens), 0) AS cache_write_tokens,
         coalesce(sum(reasoning_tokens), 0) AS reasoning_tokens
  FROM calls GROUP BY ALL),
priced AS (
  SELECT t.*, p.prefix, {_COST_USD} AS cost_usd,
         row_number() OVER (PARTITION BY t.session_id, t.model ORDER BY length(p.prefix) DESC NULLS LAST) AS rn
  FROM per_model t LEFT JOIN prices p ON starts_with(t.model, p.prefix))
SELECT session_id, sum(calls) AS calls, sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
       sum(cache_read_tokens) AS cache_read_tokens, sum(cache_write_tokens) AS cache_write_tokens,
       sum(reasoning_tokens) AS reasoning_tokens,
       coalesce(sum(cost_usd), 0) AS cost_usd, coalesce(sum(calls) FILTER (WHERE prefix IS NULL), 0) AS unpriced_calls
FROM priced WHERE rn = 1 GROUP BY session_id
"""

# Every column of the call with its cost, so one scan serves a reader of both (the viewer's call list);
# partitioned by session first, so a filter on one session reaches that scan.
CALL_COSTS = f"""
SELECT t.*, {_COST_USD} AS cost_usd, p.prefix IS NULL AS unpriced
FROM calls t LEFT JOIN prices p ON starts_with(coalesce(t.model_returned, t.model_requested, ''), p.prefix)
QUALIFY row_number() OVER (PARTITION BY t.session_id, t.call_id ORDER BY length(p.prefix) DESC NULLS LAST) = 1
"""

TOOL_COVERAGE = """
WITH offered AS (  -- a namespace (Codex) offers the tools it holds
  SELECT DISTINCT session_id,
         unnest(CASE WHEN tool->>'type' = 'namespace' THEN json_extract_string(tool, '$.tools[*].name')
                     ELSE [tool->>'name'] END) AS tool_name
  FROM (SELECT session_id, unnest(json_extract(tools, '$[*]')) AS tool
        FROM (SELECT DISTINCT session_id, tools FROM calls WHERE tools IS NOT NULL))),
used AS (SELECT DISTINCT session_id, tool_name FROM tool_calls
         UNION SELECT DISTINCT session_id, via FROM tool_calls WHERE via IS NOT NULL),
j AS (
  SELECT coalesce(o.session_id, u.session_id) AS session_id, o.tool_name IS NOT NULL AS is_offered,
         u.tool_name IS NOT NULL AS is_used
  FROM offered o FULL JOIN used u ON o.session_id = u.session_id AND o.tool_name = u.tool_name)
SELECT session_id, count(*) FILTER (WHERE is_offered) AS tools_offered, count(*) FILTER (WHERE is_used) AS tools_used,
       count(*) FILTER (WHERE is_offered AND is_used) AS tools_used_offered,
       count(*) FILTER (WHERE is_offered AND is_used) / nullif(count(*) FILTER (WHERE is_offered), 0) AS tool_coverage
FROM j GROUP BY session_id
"""

PLANS = f"""
WITH snap AS (
  SELECT session_id, arg_max({_snapshot_statuses()}, step) AS statuses
  FROM (SELECT *, try(arguments::JSON) AS args FROM tool_calls WHERE tool_name IN ({_names(tuple(kinds.PLAN_SNAPSHOTS))}))
  GROUP BY session_id),
created AS (
  SELECT session_id, step, CAST(row_number() OVER (PARTITION BY session_id ORDER BY step) AS VARCHAR) AS task_id
  FROM tool_calls WHERE tool_name IN ({_names(kinds.PLAN_CREATE)})),
update_calls AS (
  SELECT session_id, step, json_extract_string(try(arguments::JSON), '$.status') AS status,
         {_update_target()} AS task_id
  FROM tool_calls WHERE tool_name IN ({_names(tuple(kinds.PLAN_UPDATE))})),
updates AS (  -- an update without an item id (goals) updates the latest item created before it
  SELECT u.session_id, coalesce(u.task_id, (SELECT arg_max(c.task_id, c.step) FROM created c
                                            WHERE c.session_id = u.session_id AND c.step < u.step)) AS task_id,
         arg_max(u.status, u.step) FILTER (WHERE u.status IS NOT NULL) AS status
  FROM update_calls u GROUP BY ALL),
tasks AS (
  SELECT c.session_id, count(*) FILTER (WHERE coalesce(u.status, '') <> 'deleted') AS items,
         count(*) FILTER (WHERE u.status IN ({_names(kinds.PLAN_DONE)})) AS completed
  FROM created c LEFT JOIN updates u ON u.session_id = c.session_id AND u.task_id = c.task_id
  GROUP BY c.session_id),
both_ AS (
  SELECT session_id, len(statuses) AS items, len(list_filter(statuses, lambda s: s IN ({_names(kinds.PLAN_DONE)}))) AS completed
  FROM snap
  UNION ALL SELECT session_id, items, completed FROM tasks)
SELECT session_id, sum(items) AS plan_items, sum(completed) AS plan_completed,
       sum(completed) / nullif(sum(items), 0) AS plan_completion
FROM both_ GROUP BY session_id
"""

# One grouped pass over the calls' narrow columns: the model of most of a session's turns, the policy version of
# most of its calls (mode skips NULLs); numbering every call as `turns` does is not needed for either.
SESSION_INFO = f"""
WITH h AS (SELECT session_id, nullif(harness, 'unknown') AS harness FROM sessions),
o AS (
  SELECT session_id, any_value(task_id) AS task, any_value(harness) AS harness, any_value(model) AS model,
         any_value(policy_version) AS policy_version
  FROM outcomes GROUP BY 1),
c AS (
  SELECT session_id, mode({TURN_MODEL}) FILTER (WHERE {IS_TURN}) AS model, mode(policy_version) AS policy_version
  FROM calls GROUP BY 1),
ids AS (SELECT session_id FROM c UNION SELECT session_id FROM outcomes)
SELECT ids.session_id, coalesce(h.harness, o.harness, 'unknown') AS harness,
       coalesce(c.model, o.model, 'unknown') AS model, coalesce(o.task, '(none)') AS task,
       coalesce(o.policy_version, c.policy_version, '(none)') AS policy_version
FROM ids LEFT JOIN h USING (session_id) LEFT JOIN o USING (session_id) LEFT JOIN c USING (session_id)
"""

# Every column a report or comparison may group sessions by (`groups.py` names them): session_info's, the
# graded outcome's and the recorder's labels (JSON).
SESSION_GROUPS = """
WITH o AS (
  SELECT session_id, any_value(status) AS status, any_value(runner) AS runner, any_value(attempt) AS attempt,
         any_value(passed) AS passed, any_value(reward) AS reward
  FROM outcomes GROUP BY 1),
l AS (SELECT session_id, any_value(labels) AS labels FROM sessions GROUP BY 1)
SELECT si.*, o.* EXCLUDE (session_id), l.labels
FROM session_info si LEFT JOIN o USING (session_id) LEFT JOIN l USING (session_id)
"""

SESSION_METRICS = """
WITH t AS (
  SELECT session_id, count(*) AS turns FROM turns GROUP BY 1),
per_call AS (
  SELECT session_id, call_id, count(*) AS n, count(*) FILTER (WHERE kind = 'subagent') AS subagent,
         count(*) FILTER (WHERE writes_file) AS writes
  FROM tool_calls GROUP BY ALL),
tc AS (
  SELECT session_id, sum(n) AS tool_calls, count(*) FILTER (WHERE n > 1) AS parallel_turns,
         sum(subagent) AS subagent_calls, sum(writes) AS writes
  FROM per_call GROUP BY 1),
tr AS (SELECT session_id, count(*) FILTER (WHERE failed) AS failed_results FROM tool_results GROUP BY 1),
ut AS (
  SELECT session_id, count(*) FILTER (WHERE written_by = 'human') AS human_turns,
         count(*) FILTER (WHERE written_by = 'harness') AS harness_turns
  FROM user_turns GROUP BY 1),
ce AS (
  SELECT session_id, count(*) FILTER (WHERE error IS NOT NULL OR status >= 400) AS call_errors,
         arg_max(error IS NOT NULL OR coalesce(status, 0) >= 400, (t_start, seq)) AS errored
  FROM calls GROUP BY 1),
rc AS (
  SELECT session_id, count(*) AS failure_episodes, count(*) FILTER (WHERE recovered) AS recovered_episodes,
         count(*) FILTER (WHERE NOT recovered) AS gave_up_episodes,
         sum(turns_to_recover) AS turns_to_recover_total
  FROM recoveries GROUP BY 1),
oc AS (
  SELECT session_id, any_value(status) AS outcome, any_value(reward) AS reward, any_value(passed) AS passed
  FROM outcomes GROUP BY 1)
SELECT si.session_id, si.harness, si.model, si.task,
       coalesce(t.turns, 0) AS turns, coalesce(tc.tool_calls, 0) AS tool_calls,
       coalesce(tc.parallel_turns, 0) AS parallel_turns, coalesce(tc.subagent_calls, 0) AS subagent_calls,
       coalesce(ut.human_turns, 0) AS human_turns, coalesce(ut.harness_turns, 0) AS harness_turns,
       coalesce(ce.call_errors, 0) AS call_errors, coalesce(ce.errored, false) AS errored,
       coalesce(sc.calls, 0) AS calls, coalesce(sc.input_tokens, 0) AS input_tokens,
       coalesce(sc.output_tokens, 0) AS output_tokens, coalesce(sc.cache_read_tokens, 0) AS cache_read_tokens,
       coalesce(sc.cache_write_tokens, 0) AS cache_write_tokens, coalesce(sc.reasoning_tokens, 0) AS reasoning_tokens,
       coalesce(sc.cost_usd, 0) AS cost_usd, coalesce(sc.unpriced_calls, 0) AS unpriced_calls,
       coalesce(tc.writes, 0) AS writes, v.verified, v.verify_latency_turns, v.check_kind,
       coalesce(tr.failed_results, 0) AS failed_results,
       coalesce(rc.failure_episodes, 0) AS failure_episodes, coalesce(rc.recovered_episodes, 0) AS recovered_episodes,
       coalesce(rc.gave_up_episodes, 0) AS gave_up_episodes, coalesce(rc.turns_to_recover_total, 0) AS turns_to_recover_total,
       coalesce(cv.tools_offered, 0) AS tools_offered, coalesce(cv.tools_used, 0) AS tools_used,
       cv.tool_coverage,
       coalesce(p.plan_items, 0) AS plan_items, coalesce(p.plan_completed, 0) AS plan_completed, p.plan_completion,
       oc.outcome, oc.reward, oc.passed
FROM session_info si
LEFT JOIN t USING (session_id) LEFT JOIN tc USING (session_id) LEFT JOIN tr USING (session_id)
LEFT JOIN ut USING (session_id) LEFT JOIN ce USING (session_id) LEFT JOIN rc USING (session_id)
LEFT JOIN session_costs sc USING (session_id) LEFT JOIN verification v USING (session_id)
LEFT JOIN tool_coverage cv USING (session_id) LEFT JOIN plans p USING (session_id) LEFT JOIN oc USING (session_id)
"""

TOOL_USAGE = """
SELECT si.harness, tc.tool_name, tc.kind, count(*) AS calls, count(DISTINCT tc.session_id) AS sessions
FROM tool_calls tc JOIN session_info si USING (session_id)
GROUP BY ALL
"""

PASS_K = """
WITH r AS (
  SELECT task, harness, model, policy_version, count(*) AS n, count(*) FILTER (WHERE passed) AS c
  FROM attempts GROUP BY ALL)
SELECT task, harness, model, policy_version, n, c, k, pass_at_k(n, c, k) AS pass_at_k, pass_pow_k(n, c, k) AS pass_pow_k
FROM (SELECT *, unnest(range(1, n + 1)) AS k FROM r)
"""


VIEWS: tuple[View, ...] = (
    View("turns", "one row per model call that produced output, numbered per session (turn 1, 2, ...) and within "
         "its stored thread segment (segment_id, segment_turn); malformed_tool_calls: in serve mode, call-shaped "
         "text the policy's tool-call format could not read (answered as text)", TURNS),
    View("tool_calls", "every tool call a model made: turn, position, kind, file path, command, target, check kind",
         TOOL_CALLS),
    View("tool_results", "one row per tool call id that got a result: is_error, exit code, error text, failed",
         TOOL_RESULTS),
    View("recoveries", "failure episodes per intent (kind + target): failures, recovered, turns to recover",
         RECOVERIES),
    View("verification", "per session with writes: was the last write followed by a check, and how many turns later",
         VERIFICATION),
    View("user_turns", "user-role text parts, each marked human or harness-written (with the reason)", USER_TURNS),
    View("session_costs", "tokens per session (cache reads and writes separate) and list-price cost in USD",
         SESSION_COSTS),
    View("call_costs", "every call with its list-price cost in USD (unpriced: no price for its model)", CALL_COSTS),
    View("tool_coverage", "tools offered, used and used/offered per session", TOOL_COVERAGE),
    View("plans", "plan items and the share completed per session (TodoWrite, Task*, update_plan)", PLANS),
    View("session_info", "harness, model, task and policy version of each session", SESSION_INFO),
    View("session_groups", "what sessions group by: session_info, the outcome's status, runner, attempt, passed, "
         "reward, and the labels", SESSION_GROUPS),
    View("session_metrics", "every behaviour metric, one row per session", SESSION_METRICS),
    View("tool_usage", "calls per tool and kind, per harness", TOOL_USAGE),
    *(View(name, doc, sql) for name, doc, sql in attempts.VIEWS),
    View("pass_k", "pass@k and pass^k per task, harness, model and policy version, for k = 1..attempts", PASS_K),
    *(View(name, doc, sql) for name, doc, sql in gui.VIEWS),
    *(View(f"metrics_by_{g}", f"session metrics aggregated per {g}", metrics_by(g, g)) for g in FIXED),
    *(View(f"pass_curve_by_{g}", f"mean pass@k and pass^k over the {g}'s tasks, k up to their fewest attempts",
           pass_curve_by(g, g)) for g in FIXED),
)

# The views that several others read: a report computes them into tables once (`register(con, SHARED)`).
SHARED = ("turns", "tool_calls", "tool_results", "session_info", "session_groups", "session_metrics",
          "outcome_scopes")  # attempts, pass_k and every pass curve read outcome_scopes: one scan of calls


def _tables(con: duckdb.DuckDBPyConnection) -> None:
    duck.create_table(con, "tool_kinds", pa.schema([("tool_name", pa.string()), ("kind", pa.string())]),
                      kinds.TOOL_KINDS.items())
    duck.create_table(con, "prices", pa.schema([("prefix", pa.string()), *((c, pa.float64()) for c in (
        "input", "output", "cache_read", "cache_write"))]), kinds.PRICES)
    gui.register_tables(con)


def register(con: duckdb.DuckDBPyConnection, materialized: tuple[str, ...] = (),
             names: frozenset[str] | None = None) -> duckdb.DuckDBPyConnection:
    """Create the lookup tables, the pass@k functions and every view in `VIEWS` on `con` (or only those in
    `names`, which must hold every view they read: binding all of them costs seconds on a big dataset).

    Views named in `materialized` are computed into temp tables as they are created, so the views
    after them bind (and later run) against a table instead of re-planning the whole tree: `report`
    passes `SHARED`, ad-hoc SQL passes nothing and pays only for what it queries.
    """
    _tables(con)
    for name, fn in (("pass_at_k", pass_at_k), ("pass_pow_k", pass_pow_k)):
        con.create_function(name, fn, ["BIGINT", "BIGINT", "BIGINT"], "DOUBLE", side_effects=False)
    if materialized:
        con.execute("SET preserve_insertion_order = false")  # every view that promises an order says ORDER BY
    for view in VIEWS:
        if names is not None and view.name not in names:
            continue
        if view.name in materialized:
            con.execute(f"CREATE TEMP TABLE _m_{view.name} AS {view.sql}")
            con.execute(f"CREATE VIEW {view.name} AS SELECT * FROM _m_{view.name}")
        else:
            con.execute(f"CREATE VIEW {view.name} AS {view.sql}")
    return con
