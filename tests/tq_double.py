"""A stand-in for the `transfer_queue` package (TransferQueue), which veRL 0.9.1's V1 trainer imports.

TransferQueue 0.1.10+ needs tensordict >= 0.10 (whose `pyvers` wants
packaging < 26), which the locked veRL stack (tensordict 0.8.3, packaging
26.4) excludes, so the CPU tests cannot install it; veRL's own
`list_of_dict_to_tensordict` refuses tensordict 0.8 for the same reason.
veRL's TQ worker only puts its rows (`async_kv_put`, `async_kv_batch_put`);
this double keeps the row dicts veRL built (`keep_rows` stands in for the
tensordict packing), so a test reads exactly the fields veRL would store and
feeds them to veRL's own advantage and loss functions. Installed into
`sys.modules` only where the real package is missing.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVBatchMeta:
    keys: list[str] = field(default_factory=list)
    tags: list[dict] = field(default_factory=list)
    partition_id: str = "train"
    fields: Any = None
    extra_info: dict = field(default_factory=dict)


class Store:
    """What veRL put: key -> (fields as a dict of one row, tag)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[dict[str, Any], dict]] = {}
        self.prompts: dict[str, dict] = {}

    def init(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def async_kv_put(self, key: str, partition_id: str, tag: dict, **kwargs: Any) -> None:
        self.prompts[key] = tag

    async def async_kv_batch_put(self, keys: list[str], fields: list[dict], tags: list[dict],
                                 partition_id: str) -> None:
        for key, row, tag in zip(keys, fields, tags):
            self.rows[key] = (row, tag)


def keep_rows(rows: list[dict]) -> list[dict]:
    """In place of veRL's `list_of_dict_to_tensordict` (tensordict >= 0.10): the row dicts as built."""
    return rows


store = Store()


def install() -> Store:
    """The double as `transfer_queue` (if the real package is absent), and its store, emptied."""
    if importlib.util.find_spec("transfer_queue") is None or getattr(sys.modules.get("transfer_queue"), "store", None):
        module = types.ModuleType("transfer_queue")
        module.KVBatchMeta = KVBatchMeta
        module.BatchMeta = KVBatchMeta
        module.store = store
        for name in ("init", "async_kv_put", "async_kv_batch_put"):
            setattr(module, name, getattr(store, name))
        sys.modules["transfer_queue"] = module
    store.rows.clear()
    store.prompts.clear()
    return store
