// forgerl viewer: routes on the URL hash, asks the server's JSON endpoints, builds the DOM with textContent
// (recorded text is never parsed as HTML).
"use strict";

const FILTERS = ["harness", "model", "task", "outcome", "policy_version", "label"];
const OUTCOME_COLUMNS = ["runner", "attempt", "passed", "reward"]; // report groups the list cannot filter by
const TAIL = 24; // characters of a long path a cell keeps
const app = document.getElementById("app");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick" || k === "onchange") node[k] = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function api(path, params) {
  const query = new URLSearchParams(Object.entries(params || {}).filter(([, v]) => v !== "" && v != null));
  const r = await fetch(`/api/${path}?${query}`);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

const fmt = {
  int: (v) => (v == null ? "-" : Number(v).toLocaleString("en-US")),
  usd: (v) => (v == null ? "-" : Number(v).toFixed(4)),
  num: (v) => (v == null ? "-" : Number(v).toFixed(2)),
  time: (v) => (v ? v.replace("T", " ").slice(0, 19) : "-"),
  clock: (v) => (v ? v.slice(11, 19) : "-"),
  ms: (a, b) => (a && b ? `${Math.round(new Date(b) - new Date(a))} ms` : "-"),
};

function badge(text) {
  return text ? el("span", { class: `badge ${text}` }, text) : "-";
}

function sessionHref(sid, rest) {
  return `#/session/${encodeURIComponent(sid)}${rest || ""}`;
}

function callHref(sid, callId) {
  return sessionHref(sid, `/call/${encodeURIComponent(callId)}`);
}

// A cell that keeps to one line, cut with an ellipsis (`tail`: keep the end, where a path names its file); the
// whole text is its tooltip.
function clipped(text, cls, tail) {
  const value = text == null || text === "" ? "-" : String(text);
  const line = value.split("\n")[0];
  return el("td", { class: `clip${cls ? ` ${cls}` : ""}`, title: value },
    tail && line.length > TAIL ? `…${line.slice(line.length - TAIL + 1)}` : line);
}

// --- sessions list ---------------------------------------------------------------------------------

// A report grouped by an outcome's status or a label key links here with that column (report.py `_group_cell`).
function reportLink(params) {
  if (params.has("status")) params.set("outcome", params.get("status"));
  for (const [k, v] of [...params]) {
    if (!FILTERS.includes(k) && !["q", "sort", "dir", "status", ...OUTCOME_COLUMNS].includes(k)) params.set("label", `${k}=${v}`);
  }
  return params;
}

async function showList(query) {
  const facets = await api("facets");
  const params = reportLink(query);
  const state = Object.fromEntries(FILTERS.map((f) => [f, params.get(f) || ""]));
  state.q = params.get("q") || "";
  state.sort = params.get("sort") || "time";
  state.dir = params.get("dir") || "desc";
  const go = () => {
    const q = new URLSearchParams(Object.entries(state).filter(([, v]) => v));
    location.hash = `#/?${q}`;
  };
  const select = (name, values) =>
    el("label", {}, name.replace("_", " "),
      el("select", { id: `f-${name}`, onchange: (e) => { state[name] = e.target.value; go(); } },
        el("option", { value: "" }, "all"),
        values.map((v) => el("option", { value: v, selected: String(v) === state[name] }, v))));
  const search = el("input", { id: "f-q", type: "search", value: state.q, placeholder: "text in messages, id, task" });
  search.onchange = () => { state.q = search.value; go(); };
  const filters = el("div", { class: "filters" },
    FILTERS.map((f) => select(f, facets[f] || [])),
    el("label", {}, "search", search),
    el("label", {}, "sort", el("select", { id: "f-sort", onchange: (e) => { state.sort = e.target.value; go(); } },
      ["time", "cost", "reward"].map((s) => el("option", { value: s, selected: s === state.sort }, s)))),
    el("label", {}, "order", el("select", { id: "f-dir", onchange: (e) => { state.dir = e.target.value; go(); } },
      ["desc", "asc"].map((s) => el("option", { value: s, selected: s === state.dir }, s)))));
  const body = el("tbody");
  const more = el("button", { id: "more" }, "more");
  const table = el("table", { id: "sessions" },
    el("thead", {}, el("tr", {}, ["session", "started", "harness", "model", "task", "outcome", "reward", "policy",
      "calls", "failed", "cost $"].map((h) => el("th", {}, h)))), body);
  app.replaceChildren(el("h1", {}, "Sessions"), filters, table, el("p", {}, more));
  let cursor = null;
  const load = async () => {
    const page = await api("sessions", { ...state, after: cursor });
    for (const s of page.sessions) {
      body.append(el("tr", { class: "clickable", "data-session": s.session_id,
        onclick: () => { location.hash = sessionHref(s.session_id); } },
        el("td", {}, el("a", { href: sessionHref(s.session_id) }, s.session_id)), el("td", {}, fmt.time(s.started)),
        el("td", {}, s.harness), el("td", {}, s.model), el("td", {}, s.task), el("td", {}, badge(s.outcome)),
        el("td", { class: "num" }, fmt.num(s.reward)), el("td", {}, s.policy_version || "-"),
        el("td", { class: "num" }, fmt.int(s.calls)), el("td", { class: "num" }, fmt.int(s.failed_calls)),
        el("td", { class: "num" }, fmt.usd(s.cost_usd))));
    }
    if (!page.sessions.length && !cursor) body.append(el("tr", {}, el("td", { colspan: 11 }, "no sessions match")));
    cursor = page.next;
    more.hidden = !cursor;
  };
  more.onclick = load;
  await load();
}

// --- one session ---------------------------------------------------------------------------------

async function showSession(sid, callId, tokensSegment) {
  const data = await api("session", { id: sid });
  const s = data.session;
  const head = el("div", {},
    el("h1", {}, `Session ${sid}`),
    el("dl", { class: "kv", id: "session-facts" },
      ["harness", "model", "task", "policy_version", "labels"].map((k) => [el("dt", {}, k), el("dd", {}, s[k] ?? "-")]),
      el("dt", {}, "outcome"), el("dd", {}, badge(s.outcome), " reward ", fmt.num(s.reward)),
      el("dt", {}, "calls"), el("dd", {}, `${fmt.int(s.calls)} (${fmt.int(s.failed_calls)} failed)`),
      el("dt", {}, "tokens"), el("dd", {}, `in ${fmt.int(s.input_tokens)}, out ${fmt.int(s.output_tokens)}, ` +
        `cache read ${fmt.int(s.cache_read_tokens)}, cache write ${fmt.int(s.cache_write_tokens)}`),
      el("dt", {}, "cost $"), el("dd", {}, fmt.usd(s.cost_usd))));
  const byId = Object.fromEntries(data.calls.map((c) => [c.call_id, c]));
  const callRow = (c) => el("tr", {
    class: `clickable call${c.ok ? "" : " failed"}${c.call_id === callId ? " selected" : ""}`, "data-call": c.call_id,
    onclick: () => { location.hash = callHref(sid, c.call_id); } },
    el("td", { class: "num" }, c.turn), el("td", { title: fmt.time(c.t_start) }, fmt.clock(c.t_start)),
    clipped(c.model_returned || c.model_requested, "model"), el("td", { class: "num" }, fmt.ms(c.t_start, c.t_end)),
    el("td", { class: "num" }, `${fmt.int(c.input_tokens)} / ${fmt.int(c.output_tokens)}`),
    el("td", { class: "num" }, fmt.int(c.cache_read_tokens)), el("td", { class: "num" }, fmt.usd(c.cost_usd)),
    c.ok ? clipped(c.stop_reason, "stop") : clipped(c.error || `HTTP ${c.status}`, "stop error-line"));
  const callTable = (calls) => el("table", { class: "calls" },
    el("tr", {}, ["#", "start", "model", "time", "in / out", "cache rd", "cost $", "stop"].map((h) => el("th", {}, h))),
    calls.map(callRow));
  const segments = data.segments.map((g) => el("div", { class: "segment", "data-segment": g.index },
    el("h2", {}, `Segment ${g.index}: ${g.reason}`,
      g.parent != null ? el("span", { class: "muted" }, ` (from segment ${g.parent} after ${g.parent_position} calls)`) : "",
      " ", el("a", { href: sessionHref(sid, `/tokens/${g.index}`), class: "token-link" }, "token view")),
    callTable(g.calls.map((id) => byId[id]))));
  const unplaced = data.calls.filter((c) => c.segment_index == null);
  if (unplaced.length) segments.push(el("div", { class: "segment" }, el("h2", {}, "Calls without a model turn"),
    callTable(unplaced)));
  const detail = el("section", { id: "detail" },
    el("p", { class: "muted" }, "Pick a call to read it, or a segment's token view."));
  app.replaceChildren(el("p", {}, el("a", { href: "#/" }, "← sessions")), head,
    el("div", { class: "session-layout" },
      el("div", { class: "session-side" }, trajectory(sid, data.tool_calls, byId, callId),
        el("section", { id: "segments" }, segments)),
      detail));
  if (callId) await showCall(detail, { session_id: sid, ...(byId[callId] || { call_id: callId }) }, byId);
  else if (tokensSegment != null) await showTokens(detail, sid, tokensSegment);
}

// The session's tool calls in order (tool, kind, what it acted on, how its result came back, the call that made
// it), so the trajectory reads without opening each call.
function trajectory(sid, tools, byId, callId) {
  const result = (t) => {
    if (t.failed == null) return el("span", { class: "muted" }, "no result");
    if (!t.failed) return "ok";
    return el("span", { class: "error-line" }, t.exit_code != null ? `failed (exit ${t.exit_code})` : "failed");
  };
  const kind = (t) => [t.kind, t.check_kind ? ` · ${t.check_kind}` : "",
    t.writes_file && t.kind !== "write" ? " · writes" : ""];
  const rows = tools.map((t, i) => el("tr", {
    class: `clickable tool${t.failed ? " failed" : ""}${t.call_id === callId ? " selected" : ""}`,
    "data-call": t.call_id, onclick: () => { location.hash = callHref(sid, t.call_id); } },
    el("td", { class: "num" }, i + 1), el("td", { class: "num" }, byId[t.call_id] ? byId[t.call_id].turn : "-"),
    clipped(t.via ? `${t.tool_name} (via ${t.via})` : t.tool_name, "tool"), el("td", {}, kind(t)),
    clipped(t.target, "target", t.kind !== "shell"), el("td", {}, result(t))));
  return el("section", { id: "trajectory" }, el("h2", {}, `Tool calls (${tools.length})`),
    tools.length ? el("table", { class: "tools" },
      el("tr", {}, ["#", "call", "tool", "kind", "target", "result"].map((h) => el("th", {}, h))), rows)
      : el("p", { class: "muted" }, "The model called no tools."));
}

function partNode(p, results, sid) {
  if (p.type === "text") return el("div", { class: "part text" }, p.text || "");
  if (p.type === "reasoning")
    return el("div", { class: "part reasoning" }, p.redacted ? "(redacted reasoning)" : `thinking: ${p.text || ""}`);
  if (p.type === "tool_call") {
    let args = p.arguments || "";
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* shown as sent */ }
    return el("div", { class: "part tool_call" }, `→ ${p.tool_name} (${p.call_id})\n${args}`);
  }
  if (p.type === "tool_result") {
    const r = results[p.call_id];
    const failed = p.is_error || (r && r.failed);
    const text = p.text ?? (p.content || []).map((c) => c.text || `[${c.type}]`).join("\n");
    const images = (p.content || []).filter((c) => c.type === "image").map((c) => partNode(c, results, sid));
    return el("div", { class: `part tool_result${failed ? " error" : ""}` },
      `← ${p.call_id}${failed ? " FAILED" : ""}${r && r.exit_code != null ? ` (exit ${r.exit_code})` : ""}\n${text}`,
      images);
  }
  if (p.type === "image") {
    const src = p.blob_hash ? `/api/blob?session=${encodeURIComponent(sid)}&hash=${encodeURIComponent(p.blob_hash)}`
      : p.url;
    return el("div", { class: "part image" }, el("img", { src, alt: p.media_type || "image" }));
  }
  return el("div", { class: "part other" }, JSON.stringify(p));
}

// `where`: "history" (repeated from an earlier call), "new" (what this call adds) or "output". A system prompt is
// folded to its first line and size: it is the same every call, and reading starts below it.
function messageNode(m, results, sid, where) {
  const parts = m.parts.map((p) => partNode(p, results, sid));
  const cls = `message ${m.role}${where === "history" ? " history" : ""}`;
  if (m.role !== "system" && m.role !== "developer") {
    return el("div", { class: cls, "data-where": where }, el("div", { class: "role" }, m.role), parts);
  }
  const text = m.parts.map((p) => p.text || "").join("\n");
  const first = text.trim().split("\n")[0].slice(0, 120);
  return el("details", { class: cls, "data-where": where },
    el("summary", { class: "role" }, `${m.role} prompt, ${fmt.int(text.length)} characters`,
      first ? el("span", { class: "muted" }, ` — ${first}${first.length < text.trim().length ? "…" : ""}`) : null),
    parts);
}

// What the raw request shows in place of its images: each long base64 as the image's size (the whole request,
// images put back, one link away), and images whose bytes were not kept as such.
function requestNote(r, callId, sid) {
  const bySize = r.images.filter((i) => i.kept && !i.inline).length;
  const unkept = r.images.filter((i) => !i.kept).length;
  if (!bySize && !unkept) return null;
  const href = `/api/request?id=${encodeURIComponent(callId)}&session=${encodeURIComponent(sid)}`;
  return el("p", { class: "muted", id: "raw-images" },
    bySize ? `${bySize} image${bySize > 1 ? "s" : ""} shown by size, not base64` : null,
    bySize && !unkept ? [": ", el("a", { href, target: "_blank" },
                                  `the whole request as sent (${fmt.int(r.request_bytes)} bytes)`)] : null,
    unkept ? `${bySize ? "; " : ""}${unkept} image${unkept > 1 ? "s" : ""} recorded without bytes` : null);
}

// The tools a call offered, as a count that unfolds to their names (a harness offers dozens, on every call).
function toolsOffered(tools) {
  if (!tools.length) return "-";
  const names = tools.map((t) => t.name || (t.function && t.function.name) || t.type);
  return el("details", { id: "tools-offered" }, el("summary", {}, `${names.length} tool${names.length > 1 ? "s" : ""}`),
    names.join(", "));
}

// A call page leads with what the call adds: its new input, then its output. The history it repeats from an
// earlier call (`repeated` messages, the server's count) is one folded line, built when first opened.
async function showCall(detail, row, byId) {
  const c = await api("call", { id: row.call_id, session: row.session_id });
  const newFrom = c.repeated;
  const from = c.repeats && byId[c.repeats] ? ` (call ${byId[c.repeats].turn} sent or got them)` : "";
  const history = el("details", { id: "history" },
    el("summary", {}, `${newFrom} earlier message${newFrom === 1 ? "" : "s"} this call repeats${from}`));
  history.ontoggle = () => {
    if (history.open && history.childElementCount === 1)
      history.append(...c.input.slice(0, newFrom).map((m) => messageNode(m, c.tool_results, c.session_id, "history")));
  };
  const raw = el("div", { id: "raw" });
  const rawButton = el("button", { id: "show-raw", onclick: async () => {
    const r = await api("raw", { id: row.call_id, session: c.session_id });
    raw.replaceChildren(el("h2", {}, "Request (as sent, redacted when recorded)"), requestNote(r, row.call_id, c.session_id),
      el("pre", {}, r.request_raw ?? "(none)"),
      el("h2", {}, "Response (as received)"), el("pre", {}, r.response_raw ?? "(none)"));
    rawButton.hidden = true;
  } }, "raw request and response");
  detail.replaceChildren(...[
    el("h2", {}, `Call ${row.turn ?? ""} `, el("span", { class: "muted" }, row.call_id)),
    el("dl", { class: "kv", id: "call-facts" },
      el("dt", {}, "status"), el("dd", {}, row.ok === false ? el("span", { class: "error-line" },
        `${row.error || ""} HTTP ${row.status ?? "-"}`) : `HTTP ${row.status ?? "-"} ${row.stop_reason || ""}`),
      el("dt", {}, "endpoint"), el("dd", {}, `${c.method} ${c.path} (${row.api || "-"})`),
      el("dt", {}, "timing"), el("dd", {}, `first byte ${fmt.ms(row.t_start, row.t_first_byte)}, ` +
        `total ${fmt.ms(row.t_start, row.t_end)}${row.streamed ? ", streamed" : ""}`),
      el("dt", {}, "tokens"), el("dd", {}, `in ${fmt.int(row.input_tokens)}, out ${fmt.int(row.output_tokens)}, ` +
        `reasoning ${fmt.int(row.reasoning_tokens)}`),
      el("dt", {}, "cache"), el("dd", {}, `read ${fmt.int(row.cache_read_tokens)}, write ${fmt.int(row.cache_write_tokens)}`),
      el("dt", {}, "cost $"), el("dd", {}, row.unpriced ? "unpriced model" : fmt.usd(row.cost_usd)),
      el("dt", {}, "segment"), el("dd", {}, row.segment_index == null ? "-" : `${row.segment_index} (${row.segment_reason})`),
      el("dt", {}, "tools offered"), el("dd", {}, toolsOffered(c.tools))),
    newFrom ? history : null,
    el("h2", {}, newFrom ? "New input" : "Input"),
    newFrom && newFrom === c.input.length ? el("p", { class: "muted" }, "(none: it resends that history unchanged)")
      : c.input.slice(newFrom).map((m) => messageNode(m, c.tool_results, c.session_id, "new")),
    el("h2", {}, "Output"),
    c.output.length ? c.output.map((m) => messageNode(m, c.tool_results, c.session_id, "output"))
      : el("p", { class: "muted" }, "(no output)"),
    el("p", {}, rawButton), raw].flat().filter((node) => node != null));
}

// --- token view ----------------------------------------------------------------------------------

function tokenStrip(side, driftRanges, id) {
  const inDrift = new Uint8Array(side.ids.length);
  for (const [a, b] of driftRanges) inDrift.fill(1, a, b);
  const strip = el("div", { class: "tokens", id });
  const frag = document.createDocumentFragment();
  for (let i = 0; i < side.ids.length; i++) {
    const cls = `tok${side.mask[i] ? " loss" : ""}${inDrift[i] ? " drift" : ""}`;
    const span = document.createElement("span");
    span.className = cls;
    span.title = `#${i} id ${side.ids[i]}${side.mask[i] ? " (trained)" : ""}`;
    span.textContent = side.text ? side.text[i] : `${side.ids[i]} `;
    frag.append(span);
  }
  strip.append(frag);
  return strip;
}

async function showTokens(detail, sid, segment) {
  const v = await api("tokens", { session: sid, segment });
  const drift = v.drift || [];
  const parts = [el("h2", {}, `Segment ${segment} as a training sample (${v.calls} calls, ${v.reason})`),
    el("p", { class: "legend" }, el("span", { class: "tok loss" }, "trained (loss mask 1)"),
      el("span", { class: "tok" }, "context (mask 0)"), el("span", { class: "tok drift" }, "drift: engine ≠ re-rendered"))];
  if (!v.tokenizer) parts.push(el("p", { class: "muted" }, "Start the viewer with --tokenizer to decode tokens and re-render the sample."));
  if (v.drift) {
    const kinds = {};
    for (const d of drift) kinds[d.kind] = (kinds[d.kind] || 0) + 1;
    parts.push(el("p", { id: "drift-summary" }, drift.length ? `${drift.length} differences: ` +
      Object.entries(kinds).map(([k, n]) => `${k} ×${n}`).join(", ") : "engine ids and re-rendered ids agree"));
  }
  const columns = el("div", { class: "token-columns" });
  if (v.engine) columns.append(el("div", {}, el("h2", {}, `Engine ids (${v.engine.ids.length})`),
    tokenStrip(v.engine, drift.map((d) => d.engine), "engine-tokens")));
  else columns.append(el("div", {}, el("h2", {}, "Engine ids"), el("p", { class: "muted" }, "not every call of this segment has engine ids")));
  if (v.rendered) columns.append(el("div", {}, el("h2", {}, `Re-rendered by the chat template (${v.rendered.ids.length})` +
    (v.template_consistent === false ? ", per-message ≠ whole render" : "")),
    tokenStrip(v.rendered, drift.map((d) => d.rendered), "rendered-tokens")));
  detail.replaceChildren(...parts, columns);
}

// --- routing -------------------------------------------------------------------------------------

async function route() {
  const hash = location.hash || "#/";
  const [path, query] = hash.slice(1).split("?");
  const m = path.match(/^\/session\/([^/]+)(?:\/(call|tokens)\/([^/]+))?$/);
  try {
    if (m) {
      const sid = decodeURIComponent(m[1]);
      await showSession(sid, m[2] === "call" ? decodeURIComponent(m[3]) : null,
        m[2] === "tokens" ? Number(m[3]) : null);
    } else {
      await showList(new URLSearchParams(query || ""));
    }
    document.body.dataset.ready = hash;
  } catch (e) {
    app.replaceChildren(el("p", { class: "error-line", id: "load-error" }, `Cannot load: ${e.message}`));
    document.body.dataset.ready = hash;
  }
}

window.addEventListener("hashchange", route);
route();
