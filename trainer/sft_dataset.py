"""veRL's `MultiTurnSFTDataset` for `forge-convert --to verl-sft` shards, named by their `data.custom_cls`.

A Parquet struct column cannot hold arbitrary JSON Schema (empty objects,
keys one tool has and another lacks, mixed-type `enum`/`default`, int vs
float), so the converter writes each row's tools as the JSON text of what
the chat template gets. This class decodes it (`json.loads` keeps key
order: the template's `tojson` prints the tools as the harness sent them);
everything else is veRL's own class. veRL's stock class given these shards
fails on the first row (a string is no tool list) rather than training
without tools.
"""

from __future__ import annotations

import json

from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset


class ForgeSFTDataset(MultiTurnSFTDataset):
    def _read_files_and_process(self) -> None:
        super()._read_files_and_process()
        if self.tools is not None:
            self.tools = [json.loads(text) for text in self.tools]
