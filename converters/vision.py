"""Images in token rows: how many image-pad tokens each image becomes, as veRL's multimodal SFT path computes.

veRL 0.9.1's `MultiTurnSFTDataset` (with a Qwen2-VL-style processor) turns each `<image>` placeholder into a
`{"type": "image"}` content item, resizes the image with `qwen_vl_utils.fetch_image` (each side to a
multiple of patch x merge, between 4 and 16384 merged patches), and the processor's chat template writes
`<|vision_start|><|image_pad|><|vision_end|>`, whose pad the processor repeats once per merged patch of
the image as its image processor resizes it again (within its own min/max pixels). A tokenizer directory
with a `preprocessor_config.json` (as every VL model repository has) names that image processor; the
counts come from transformers' own `get_number_of_image_patches`, so `tokens` rows hold veRL's ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgerl.errors import UserError
from forgerl.recorder.images import image_size
from forgerl.schema.chat import IMAGE_PLACEHOLDER
from forgerl.schema.messages import Part

# qwen_vl_utils.vision_process (0.0.14): fetch_image's defaults, in merged patches
_FETCH_MIN_TOKENS, _FETCH_MAX_TOKENS = 4, 16384
IMAGE_PAD = "<|image_pad|>"  # what the Qwen2-VL templates write for an image, and the processor repeats
_VERL_SPLIT = re.compile("(<image>|<video>)")  # MultiTurnSFTDataset._build_messages splits content on these


class ImagesError(UserError):
    """Rows with images that cannot be built: no image processor, or the image's bytes were not recorded."""


@dataclass(frozen=True)
class ImagePads:
    """The image-pad token and the image processor of a VL tokenizer directory."""

    token_id: int
    processor: Any  # transformers' Qwen2VLImageProcessorPil, configured from preprocessor_config.json

    @classmethod
    def from_tokenizer_dir(cls, name: str | None, tokenizer: Any) -> ImagePads | None:
        """None when the tokenizer is not a VL one (no preprocessor_config.json beside it)."""
        config_file = Path(name or "") / "preprocessor_config.json"
        if not name or not config_file.is_file():
            return None
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        config = json.loads(config_file.read_text())
        keys = ("size", "min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size")
        processor = Qwen2VLImageProcessorPil(**{k: config[k] for k in keys if k in config})
        token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        if token_id is None:
            raise ImagesError(f"--tokenizer {name}: has a preprocessor_config.json but no {IMAGE_PAD} token")
        return cls(token_id, processor)

    def count(self, width: int, height: int) -> int:
        """Pad tokens for an image of this size: fetch_image's resize, then the image processor's."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        factor = self.processor.patch_size * self.processor.merge_size
        fetched_h, fetched_w = smart_resize(height, width, factor, min_pixels=_FETCH_MIN_TOKENS * factor ** 2,
                                            max_pixels=_FETCH_MAX_TOKENS * factor ** 2)
        return self.processor.get_number_of_image_patches(fetched_h, fetched_w, {}) // self.processor.merge_size ** 2


@dataclass(frozen=True)
class SampleImages:
    """A sample's images as pad counts, in placeholder order: what its rendered ids expand."""

    pads: ImagePads
    counts: tuple[int, ...]

    def expand(self, ids: list[int], counts: Iterator[int] | None = None) -> list[int]:
        """Each pad id repeated as many times as its image needs (the tokenizer cuts text at added tokens,
        so expanding ids equals expanding the text, as the processor does); `counts` shared across pieces."""
        counts = iter(self.counts) if counts is None else counts
        out: list[int] = []
        for token in ids:
            if token == self.pads.token_id:
                out.extend([token] * next(counts))
            else:
                out.append(token)
        return out


def verl_content(chat: list[dict]) -> list[dict]:
    """Chat messages as veRL hands them to the processor when a row has images: content split on the
    placeholders into text and image items (empty text dropped), so the template renders the same text."""
    out = []
    for message in chat:
        content = message.get("content")
        if not isinstance(content, str):
            out.append(message)
            continue
        items = [{"type": "image"} if piece == IMAGE_PLACEHOLDER else {"type": "text", "text": piece}
                 for piece in _VERL_SPLIT.split(content) if piece != ""]
        out.append({**message, "content": items})
    return out


def _unkept(part: Part, session_id: str) -> ImagesError:
    what = f"image sha256:{part.blob_hash[:12]}" if part.blob_hash else f"image {part.url}" if part.url else "an image"
    return ImagesError(f"session {session_id}: {what} has no bytes in the dataset (recorded with forge-record --images "
                       f"hash-only or drop, or passed by URL), and image rows need them: leave the session out "
                       f"(--harness, --since) or record with --images keep")


def image_bytes(parts: list[Part], blobs: Mapping[str, bytes | None], session_id: str) -> list[bytes]:
    """Each image's bytes, in placeholder order; refused (one line) when any was not kept."""
    out = []
    for part in parts:
        data = blobs.get(part.blob_hash) if part.blob_hash else None
        if not data:
            raise _unkept(part, session_id)
        out.append(data)
    return out


def sample_images(pads: ImagePads | None, parts: list[Part], blobs: Mapping[str, bytes | None], session_id: str,
                  tokenizer: str | None) -> SampleImages | None:
    """Pad counts for a sample's images, from the sizes the recorder kept or else the bytes; None without images."""
    if not parts:
        return None
    if pads is None:
        raise ImagesError(f"session {session_id} holds images, and --tokenizer {tokenizer} has no image processor "
                          f"(a preprocessor_config.json beside tokenizer.json, as VL models ship): use a VL tokenizer")
    counts = []
    for part in parts:
        size = (part.width, part.height) if part.width and part.height else \
            image_size(blobs.get(part.blob_hash) if part.blob_hash else None)
        if size is None:
            raise _unkept(part, session_id)
        counts.append(pads.count(*size))
    return SampleImages(pads, tuple(counts))
