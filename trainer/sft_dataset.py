"""veRL's `MultiTurnSFTDataset` for `forge-convert --to verl-sft` shards, named by their `data.custom_cls`.

A Parquet struct column cannot hold arbitrary JSON Schema (empty objects,
keys one tool has and another lacks, mixed-type `enum`/`default`, int vs
float), so the converter writes each row's tools as the JSON text of what
the chat template gets. This class decodes it (`json.loads` keeps key
order: the template's `tojson` prints the tools as the harness sent them);
and it puts loss only on the assistant messages the row's segment generated
(`trained_messages`): a segment that inherits earlier answers (a subagent's
parent history, a token break, a compaction) would otherwise train them once
more, and its ids and masks equal `forge-convert --to tokens`. Everything
else is veRL's own class. veRL's stock class given these shards fails on the
first row (a string is no tool list) rather than training without tools.
"""

from __future__ import annotations

import json

from typing import Any

from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

TRAINED_KEY = "trained_messages"


class ForgeSFTDataset(MultiTurnSFTDataset):
    def _read_files_and_process(self) -> None:
        super()._read_files_and_process()
        if self.tools is not None:
            self.tools = [json.loads(text) for text in self.tools]
        self._trained: set[int] | None = None

    def __getitem__(self, item: int) -> dict[str, Any]:
        column = self.dataframe[TRAINED_KEY] if TRAINED_KEY in self.dataframe else None
        self._trained = None if column is None else {int(i) for i in column.iloc[item]}
        return super().__getitem__(item)

    def _process_single_message(self, index: int, message: dict[str, Any], *args: Any, **kwargs: Any):
        input_ids, loss_mask, attention_mask, inputs = super()._process_single_message(index, message, *args,
                                                                                       **kwargs)
        if self._trained is not None and index not in self._trained:
            loss_mask = loss_mask * 0  # inherited history: context, not trained again
        return input_ids, loss_mask, attention_mask, inputs
