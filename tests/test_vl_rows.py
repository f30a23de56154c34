"""Screenshots in the data: stored once, kept or withheld as `--images` says, and VL rows veRL loads.

GUI sessions are recorded through the real `forge-record serve` with the anthropic and openai SDKs
(Claude Code + Playwright MCP's and browser-use's shapes, every call resending every screenshot);
the checks are `vl_checks.check_vl_dataset`: blobs once per session, verl-sft image rows through
veRL's loader with a Qwen2.5-VL processor, and veRL's ids equal to the `tokens` rows' for every sample.
"""

from __future__ import annotations

import base64
import json

import pyarrow.compute as pc
import pytest

from forgerl.converters.cli import main as convert_main
from forgerl.recorder.images import restore_request
from forgerl.schema import store
from forgerl.schema.records import decompress

from conftest import RecorderProcess, session_calls
from convert_fixtures import convert, rows
from gui_sessions import drive_anthropic, drive_chat, gui_script, screenshot
from vl_checks import check_vl_dataset, stored_images, vl_tokenizer_dir

STEPS = 5


@pytest.fixture(scope="module")
def gui_data(tmp_path_factory):
    """Two GUI sessions (Anthropic tool-result screenshots, Chat data URLs), and the upstream's log."""
    from scripted_upstream import ScriptedUpstream

    root = tmp_path_factory.mktemp("gui") / "data"
    with ScriptedUpstream(gui_script(STEPS)) as up:
        rec = RecorderProcess(root, up.url).start()
        try:
            drive_anthropic(rec.base("gui-claude"), STEPS)
            drive_chat(rec.base("gui-chat"), STEPS)
            session_calls(root, "gui-claude", STEPS)
            session_calls(root, "gui-chat", STEPS)
        finally:
            rec.stop()
        return root, [ex.body for ex in up.log]


def _table(root, name, session):
    table = store.read_table(root, name)
    return table.filter(pc.equal(table.column("session_id"), session)).to_pylist()


def test_vl_rows_load_through_verl_with_the_tokens_ids(gui_data, tmp_path):
    root, _ = gui_data
    summary = check_vl_dataset(root, tmp_path)
    # one thread sample per session, each with all its screenshots; one blob per distinct screenshot
    assert summary["samples"] == summary["samples_with_images"] == 2
    assert summary["blobs"] == 2 * STEPS and summary["image_parts"] == 2 * STEPS
    assert summary["image_pads"] > 2 * STEPS * 100  # 640x400 screenshots are hundreds of tokens each


def test_each_screenshot_is_stored_once_and_raw_requests_reference_it(gui_data):
    root, sent = gui_data
    blobs = {b["blob_hash"]: b["data"] for b in _table(root, "blobs", "gui-claude")}
    calls = sorted(_table(root, "calls", "gui-claude"), key=lambda c: c["seq"])
    assert len(blobs) == STEPS and len(calls) == STEPS
    for call in calls:
        raw = decompress(call["request_raw"])
        assert b"forgerl-blob:sha256:" in raw and base64.b64encode(screenshot(0))[:200] not in raw
        assert restore_request(raw, blobs.get) in sent  # the exact bytes the SDK sent, screenshots back in
    assert sum(map(len, sent)) > 3 * sum(len(c["request_raw"]) for c in calls)


def _image_parts(root) -> list[dict]:
    return [image for p in _table(root, "messages", "s") for image in stored_images(json.loads(p["part"]))]


def _record(tmp_path, mode: str):
    from scripted_upstream import ScriptedUpstream

    root = tmp_path / mode
    with ScriptedUpstream(gui_script(3)) as up:
        rec = RecorderProcess(root, up.url, "--images", mode).start()
        try:
            drive_anthropic(rec.base("s"), 3)
            session_calls(root, "s", 3)
        finally:
            rec.stop()
    return root


def test_hash_only_keeps_references_and_sizes_but_no_bytes(tmp_path, capsys):
    root = _record(tmp_path, "hash-only")
    assert _table(root, "blobs", "s") == []
    parts = _image_parts(root)
    assert len(parts) == 3 and all(p["blob_hash"] and (p["width"], p["height"]) == (640, 400) for p in parts)
    for call in _table(root, "calls", "s"):
        assert base64.b64encode(screenshot(0))[:200] not in decompress(call["request_raw"])
    # tokens rows need only the sizes; veRL's image rows need the bytes: refused in one line, nothing written
    convert(root, tmp_path / "tok", "--to", "tokens", "--tokenizer", str(vl_tokenizer_dir(tmp_path / "vl")))
    (row,) = rows(tmp_path / "tok")
    assert len(row["images"]) == 3
    capsys.readouterr()
    assert convert_main([str(root), "--out", str(tmp_path / "sft"), "--to", "verl-sft"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hash-only" in err and not (tmp_path / "sft").exists()


def test_drop_keeps_only_that_an_image_was_there(tmp_path, capsys):
    root = _record(tmp_path, "drop")
    assert _table(root, "blobs", "s") == []
    parts = _image_parts(root)
    assert len(parts) == 3 and all("blob_hash" not in p and p["media_type"] == "image/png" for p in parts)
    for call in _table(root, "calls", "s"):
        raw = decompress(call["request_raw"])
        assert b"forgerl-image-dropped" in raw and b"forgerl-blob" not in raw
    tokenizer = str(vl_tokenizer_dir(tmp_path / "vl"))
    assert convert_main([str(root), "--out", str(tmp_path / "tok"), "--to", "tokens", "--tokenizer", tokenizer]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no bytes" in err


def test_images_need_a_vl_tokenizer(gui_data, tmp_path, capsys):
    from convert_fixtures import TOKENIZER_DIR

    root, _ = gui_data
    assert convert_main([str(root), "--out", str(tmp_path / "t"), "--to", "tokens", "--tokenizer", TOKENIZER_DIR]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "preprocessor_config.json" in err


def test_bad_images_mode_is_one_line(tmp_path):
    import subprocess

    from conftest import FORGE_RECORD

    done = subprocess.run([FORGE_RECORD, "serve", "--out", str(tmp_path / "d"), "--images", "blur"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--images" in done.stderr and "Traceback" not in done.stderr


def test_images_recorded_without_sizes_are_counted_from_their_bytes(gui_data, tmp_path):
    """Datasets recorded before parts carried sizes: the same rows, each image's size read from its blob."""
    from dataclasses import replace

    from forgerl.schema.messages import Exchange, Message
    from forgerl.schema.records import CallRecord, call_messages
    from forgerl.schema.writer import DatasetWriter

    root, _ = gui_data
    blobs = {b["blob_hash"]: b["data"] for b in _table(root, "blobs", "gui-claude")}
    parts = {p["part_hash"]: p["part"] for p in _table(root, "messages", "gui-claude")}
    calls = sorted(_table(root, "calls", "gui-claude"), key=lambda c: c["seq"])

    def unsized(message: Message) -> Message:
        def strip(part):
            if part.type == "image":
                return replace(part, width=None, height=None)
            return replace(part, content=tuple(map(strip, part.content))) if part.content else part
        return replace(message, parts=tuple(map(strip, message.parts)))

    old = tmp_path / "old"
    with DatasetWriter(old) as writer:
        writer.add_session("gui-claude", harness="anthropic-python")
        for call in calls:
            ex = Exchange(input=[unsized(m) for m in call_messages(call, parts)],
                          output=call_messages(call, parts, "output"), tools=json.loads(call["tools"]),
                          blobs=blobs)
            writer.add_call(CallRecord(call_id=call["call_id"], session_id="gui-claude", api=call["api"],
                                       method="POST", path=call["path"], t_start=call["t_start"], status=200,
                                       complete=True, exchange=ex, seq=call["seq"]))
    assert not any("width" in image for p in _table(old, "messages", "gui-claude")
                   for image in stored_images(json.loads(p["part"])))
    tokenizer = str(vl_tokenizer_dir(tmp_path / "vl"))
    convert(root, tmp_path / "new-tok", "--to", "tokens", "--tokenizer", tokenizer, "--harness", "anthropic-python")
    convert(old, tmp_path / "old-tok", "--to", "tokens", "--tokenizer", tokenizer)
    (new_row,), (old_row,) = rows(tmp_path / "new-tok"), rows(tmp_path / "old-tok")
    assert old_row["input_ids"] == new_row["input_ids"] and len(old_row["images"]) == STEPS


def _spoil_data_pages(path) -> None:
    """Make a blobs file's `data` column unreadable (its first page header overwritten), footer intact."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    column = meta.schema.to_arrow_schema().get_field_index("data")
    with open(path, "r+b") as f:
        for g in range(meta.num_row_groups):
            f.seek(meta.row_group(g).column(column).data_page_offset)
            f.write(b"\xff" * 16)


def test_a_sample_reads_only_the_blobs_it_refers_to(tmp_path):
    """verl-sft reads a sample's images where its session's blob index says they lie: the other sessions' blob
    files (here unreadable past their footers) are never read for it, as every file holding the hash was,
    once per sample."""
    import pyarrow.parquet as pq

    from forgerl.schema.messages import Exchange, Message, Part, sha256_hex
    from forgerl.schema.records import CallRecord
    from forgerl.schema.files import data_files
    from forgerl.schema.writer import DatasetWriter
    from datetime import datetime, timezone

    root, kept = tmp_path / "data", screenshot(2)
    with DatasetWriter(root, flush_interval=3600) as writer:
        for s in range(4):  # a flush per session: a blobs file each, as a recorder flushing every few seconds
            sid = f"s{s}"
            writer.add_session(sid, harness="keep" if s == 2 else "other")
            # every session starts on the same page: each stores its own copy of that screenshot
            shots = [kept] + ([] if s == 2 else [screenshot(10 + s)])
            images = tuple(Part("image", blob_hash=sha256_hex(d), media_type="image/png", width=640, height=400)
                           for d in shots)
            ex = Exchange(input=[Message("user", (Part("text", text=f"task {s}"), *images))],
                          output=[Message("assistant", (Part("text", text="done"),))],
                          blobs={sha256_hex(d): d for d in shots})
            writer.add_call(CallRecord(call_id=f"{sid}-0", session_id=sid, api="chat", method="POST",
                                       path="/v1/chat/completions", t_start=datetime(2026, 12, 1, tzinfo=timezone.utc),
                                       status=200, complete=True, exchange=ex, seq=writer.next_seq()))
            writer.flush()
    files = data_files(root, "blobs")
    assert len(files) == 4
    for path in files:
        if pq.read_table(path, columns=["session_id"]).column(0)[0].as_py() != "s2":
            _spoil_data_pages(path)
    convert(root, tmp_path / "sft", "--to", "verl-sft", "--harness", "keep")
    (row,) = [r for f in sorted((tmp_path / "sft").glob("*/*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert [image["bytes"] for image in row["images"]] == [kept]
