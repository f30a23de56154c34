"""veRL's multimodal SFT loader on `forge-convert --to verl-sft` shards, in a process of its own.

`python vl_verl_load.py VL_SITE TOKENIZER_DIR OUT.json SHARD...` loads each shard with
`ForgeSFTDataset` (veRL's `MultiTurnSFTDataset`, strict sanity check) and a `Qwen2_5_VLProcessor`
built offline from TOKENIZER_DIR (tokenizer, chat_template.jinja, preprocessor_config.json, read by
transformers' PIL Qwen2-VL image processor; the processor also wants transformers' default video
processor, unused here), and writes each row's input_ids, loss mask, image count,
image-pad count and image-grid patches to OUT.json by sample id (`vl_checks.verl_view` reads it).

VL_SITE holds qwen-vl-utils and torchvision from PyPI (requirements-vl.lock). PyPI's torchvision is
built against CUDA torch: its C ops cannot load against the CPU torch of this venv, and its import
registers fake kernels for two of them (`nms`, `qnms`), which fails unless they exist. Their schemas
are defined here, as torchvision's C library defines them, so the pure-Python image code that
qwen_vl_utils.fetch_image uses imports; no torchvision op runs on this path (fetch_image resizes with PIL).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _torchvision_without_c_ops() -> object:
    import torch

    library = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    return library  # the definitions live as long as the library object


def vl_processor(site: str, tokenizer_dir: str) -> tuple:
    """(tokenizer, Qwen2_5_VLProcessor, torchvision op library to keep alive), with `site` on the path."""
    sys.path.insert(0, site)
    library = _torchvision_without_c_ops()
    import qwen_vl_utils  # noqa: F401 - veRL's process_image imports it; fail here if it cannot
    from transformers import AutoTokenizer, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    processor = Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessorPil.from_pretrained(tokenizer_dir),
                                    tokenizer=tokenizer, video_processor=Qwen2VLVideoProcessor(),
                                    chat_template=(Path(tokenizer_dir) / "chat_template.jinja").read_text())
    return tokenizer, processor, library


def vl_dataset(shards: list[str], tokenizer, processor):
    """veRL's view of some verl-sft shards: ForgeSFTDataset, strict sanity check, no padding."""
    from forgerl.trainer.sft_dataset import ForgeSFTDataset

    return ForgeSFTDataset(shards, tokenizer, {"pad_mode": "no_padding", "max_length": 1 << 22, "truncation": "error",
                                               "ignore_input_ids_mismatch": False}, processor=processor)


def main(argv: list[str]) -> None:
    site, tokenizer_dir, out, *shards = argv
    tokenizer, processor, keep = vl_processor(site, tokenizer_dir)  # noqa: F841 - keep: the ops' library
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    seen: dict[str, dict] = {}
    for shard in shards:
        dataset = vl_dataset([shard], tokenizer, processor)
        for i in range(len(dataset)):
            item = dataset[i]
            row = dataset.dataframe.iloc[i]
            ids = item["input_ids"].tolist()
            grid = item.get("multi_modal_inputs", {}).get("image_grid_thw")
            images = row["images"] if "images" in dataset.dataframe else None
            seen[str(row["sample_id"])] = {
                "input_ids": ids, "loss_mask": item["loss_mask"].tolist(),
                "images": 0 if images is None else len(images), "image_pads": ids.count(pad),
                "grid_patches": 0 if grid is None else int(grid.prod(dim=-1).sum()),
                "position_ids_rows": int(item["position_ids"].shape[0]) if item["position_ids"].dim() > 1 else 1,
            }
    Path(out).write_text(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1:])
