"""Test-only faults for `test_trainer_torch_sft.py`: a tokens shard's `loss_mask` rewritten as a slip in a converter
would leave it, never a switch in the product.

`rewrite_masks(src, dest, edit)` copies a `forge-convert --to tokens` folder and rewrites every train row's
`loss_mask` (and `response_mask`) with `edit(ids, mask) -> mask`: `shifted(by)` moves the mask by `by` tokens,
`tool_results(tool_response_id, start_id, end_id)` also masks each tool-result turn, `nothing` clears it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

Edit = Callable[[list[int], list[int]], list[int]]


def rewrite_masks(src: Path, dest: Path, edit: Edit) -> Path:
    shutil.copytree(src, dest)
    for path in sorted((dest / "train").glob("*.parquet")):
        table = pq.read_table(path)
        masks = [edit(ids, mask) for ids, mask in zip(table["input_ids"].to_pylist(), table["loss_mask"].to_pylist())]
        for name in ("loss_mask", "response_mask"):
            column = pa.array(masks, table.schema.field(name).type)
            table = table.set_column(table.schema.get_field_index(name), name, column)
        pq.write_table(table, path)
    return dest


def shifted(by: int) -> Edit:
    """The mask moved `by` tokens later (earlier when negative), zeros filling in."""
    def edit(ids: list[int], mask: list[int]) -> list[int]:
        return ([0] * by + mask[:-by]) if by > 0 else (mask[-by:] + [0] * -by)
    return edit


def tool_results(tool_response_id: int, start_id: int, end_id: int) -> Edit:
    """The mask also on each turn holding a tool result, from after its `<|im_start|>` to its `<|im_end|>`."""
    def edit(ids: list[int], mask: list[int]) -> list[int]:
        out = list(mask)
        for at, token in enumerate(ids):
            if token == tool_response_id:
                start = max(i for i in range(at) if ids[i] == start_id)
                end = ids.index(end_id, at)
                out[start + 1:end + 1] = [1] * (end - start)
        return out
    return edit


def nothing(ids: list[int], mask: list[int]) -> list[int]:
    return [0] * len(mask)
