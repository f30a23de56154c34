"""Checks on screenshot-carrying (GUI) datasets, shared by the VL tests and the web end-to-end tests.

`check_vl_dataset(root, work)` asserts what every recorded GUI session must give:
- each image is stored once per session in `blobs` (by hash), and every image part's hash is there
  with the part's recorded size;
- `forge-convert --to verl-sft` image rows load through veRL's own loader (`ForgeSFTDataset`, veRL's
  `MultiTurnSFTDataset`) with a Qwen2.5-VL processor built offline: the offline Qwen tokenizer (its
  vision tokens), transformers' default Qwen2-VL image processor, the real Qwen2.5-VL chat template
  (test data) and `qwen_vl_utils` from PyPI;
- veRL's input_ids and loss masks equal the `forge-convert --to tokens` rows' for 100 % of the samples.

veRL runs in a subprocess (`vl_verl_load.py`) with `.venv/vl-site` (qwen-vl-utils and torchvision,
`make test` installs them from requirements-vl.lock) on its path, so no other test sees torchvision.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from forgerl.schema import store

from convert_fixtures import TOKENIZER_DIR, convert, rows

REPO = Path(__file__).resolve().parent.parent
VL_SITE = REPO / ".venv" / "vl-site"
VL_TEMPLATE = Path(__file__).parent / "fixtures" / "qwen2_5_vl" / "chat_template.jinja"
LOADER = Path(__file__).parent / "vl_verl_load.py"


def vl_tokenizer_dir(into: Path) -> Path:
    """A Qwen2.5-VL-style tokenizer directory: the offline Qwen tokenizer (it has the vision tokens), the
    Qwen2.5-VL chat template, and transformers' default Qwen2-VL image processor config."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    into.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        shutil.copy(Path(TOKENIZER_DIR) / name, into / name)
    config = json.loads((Path(TOKENIZER_DIR) / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)  # the VL template replaces the text one
    (into / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.copy(VL_TEMPLATE, into / "chat_template.jinja")
    Qwen2VLImageProcessorPil().to_json_file(str(into / "preprocessor_config.json"))
    return into


def check_blobs_once(root: Path) -> dict[str, int]:
    """Every image part's bytes are in `blobs` once per session, with the size the part records."""
    from PIL import Image
    import io

    blobs = store.read_table(root, "blobs")
    keys = list(zip(blobs.column("session_id").to_pylist(), blobs.column("blob_hash").to_pylist()))
    repeated = [k for k, n in Counter(keys).items() if n > 1]
    assert not repeated, f"blobs stored more than once per session: {repeated[:3]}"
    by_key = dict(zip(keys, blobs.column("data").to_pylist()))
    messages = store.read_table(root, "messages").select(["session_id", "part"]).to_pylist()
    images = [(row["session_id"], image) for row in messages for image in stored_images(json.loads(row["part"]))]
    for session_id, image in images:
        data = by_key.get((session_id, image["blob_hash"]))
        assert data, f"an image part of {session_id}: no blob {image['blob_hash']}"
        assert (image.get("width"), image.get("height")) == Image.open(io.BytesIO(data)).size
    return {"image_parts": len(images), "blobs": len(keys), "sessions": len({s for s, _ in keys})}


def stored_images(part: dict) -> list[dict]:
    """The image parts in a stored part, those inside tool results included."""
    if part["type"] == "image":
        return [part]
    return [image for inner in part.get("content") or [] for image in stored_images(inner)]


def verl_view(tokenizer_dir: Path, shards: list[Path], out: Path) -> dict[str, dict]:
    """veRL's ids, loss masks and image grids for every row of some verl-sft shards, by sample id."""
    assert (VL_SITE / "qwen_vl_utils").is_dir(), f"{VL_SITE} is missing: run `make test` (its vl target)"
    cmd = [sys.executable, str(LOADER), str(VL_SITE), str(tokenizer_dir), str(out), *map(str, shards)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def check_vl_dataset(root: Path, work: Path, *convert_args: str) -> dict[str, int]:
    """The whole check (see the module docstring); returns the counts it checked."""
    summary = check_blobs_once(root)
    tokenizer_dir = vl_tokenizer_dir(work / "qwen2_5_vl")
    convert(root, work / "sft", "--to", "verl-sft", *convert_args)
    convert(root, work / "tok", "--to", "tokens", "--tokenizer", str(tokenizer_dir), *convert_args)
    tokens = {r["sample_id"]: r for r in rows(work / "tok")}
    shards = sorted((work / "sft").glob("*/*.parquet"))
    verl = verl_view(tokenizer_dir, shards, work / "verl_view.json")
    assert set(verl) == set(tokens), (sorted(verl), sorted(tokens))
    with_images = 0
    for sample_id, seen in verl.items():
        row = tokens[sample_id]
        assert seen["input_ids"] == row["input_ids"], f"{sample_id}: veRL's ids differ from the tokens row"
        assert seen["loss_mask"] == row["loss_mask"], f"{sample_id}: veRL's loss mask differs"
        assert seen["images"] == len(row["images"] or [])
        assert seen["image_pads"] == seen["grid_patches"] // 4  # the processor's own count, merge size 2
        with_images += bool(seen["images"])
    return {**summary, "samples": len(verl), "samples_with_images": with_images,
            "image_pads": sum(v["image_pads"] for v in verl.values())}
