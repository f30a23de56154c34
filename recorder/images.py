"""Images in recorded calls: stored once per session, and what `--images keep|hash-only|drop` keeps of them.

GUI harnesses resend every earlier screenshot in every call. The codecs already turn each base64 image
into a part that names its bytes by sha256 (`Exchange.blobs`), and the writer stores each blob once per
session. This module does the rest, once per call, in the writer process:

- each image part gets its `width` and `height` (read from the image header), which `tokens` rows need
  to know how many image tokens it becomes, with or without the bytes;
- the raw request stops repeating the pixels: each base64 payload in `request_raw` becomes
  `forgerl-blob:sha256:<hex>`, which `restore_request` turns back into the exact bytes sent;
- `hash-only` keeps the reference and the size but not the bytes, `drop` neither reference nor bytes
  (only that an image was there, and its media type). Redaction regexes cannot see secrets in pixels;
  these modes are the way to keep them off disk.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Callable, Mapping
from dataclasses import replace

from forgerl.schema.messages import Exchange, Message, Part

IMAGE_MODES = ("keep", "hash-only", "drop")
_REFERENCE = "forgerl-blob:sha256:{}"
_DROPPED = "forgerl-image-dropped"
# Where the recorder took an image out of a raw request: a reference (group 1: the blob's hash) or the drop marker.
_PLACE_RE = re.compile(rb"forgerl-blob:sha256:([0-9a-f]{64})|" + re.escape(_DROPPED.encode()))


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the image's header; None for bytes PIL does not know as an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except (UnidentifiedImageError, OSError, ValueError):
        return None


def _map_parts(messages: list[Message], change: Callable[[Part], Part]) -> list[Message]:
    def walk(part: Part) -> Part:
        if part.type == "image":
            return change(part)
        if part.type == "tool_result" and part.content is not None:
            return replace(part, content=tuple(walk(p) for p in part.content))
        return part

    return [replace(m, parts=tuple(walk(p) for p in m.parts)) for m in messages]


def apply_mode(exchange: Exchange, mode: str) -> None:
    """Sizes on the exchange's image parts, then what `mode` keeps (`hash-only` and `drop` empty its blobs)."""
    if not exchange.blobs:
        return
    sizes = {digest: image_size(data) for digest, data in exchange.blobs.items()}

    def change(part: Part) -> Part:
        size = sizes.get(part.blob_hash or "")
        if size is None:
            return part
        if mode == "drop":
            return Part("image", media_type=part.media_type, extra=part.extra)
        return replace(part, width=size[0], height=size[1])

    exchange.input = _map_parts(exchange.input, change)
    if mode != "keep":
        exchange.blobs = {}


def strip_request(raw: bytes, blobs: Mapping[str, bytes], mode: str) -> bytes:
    """The raw request with each stored image's base64 replaced by its reference (`drop`: by a marker)."""
    for digest, data in blobs.items():
        payload = base64.b64encode(data)
        if len(payload) > 64:  # shorter than a reference: nothing to gain
            raw = raw.replace(payload, (_DROPPED if mode == "drop" else _REFERENCE.format(digest)).encode())
    return raw


def fill_images(raw: bytes, fill: Callable[[str | None], bytes | None]) -> bytes:
    """A stored `request_raw` with each place the recorder took an image out of given what `fill` returns for
    it: called with the blob's hash, or None where `drop` left only a marker; None leaves the place as stored."""
    def put(match: re.Match) -> bytes:
        got = fill(match.group(1).decode() if match.group(1) else None)
        return match.group(0) if got is None else got

    return _PLACE_RE.sub(put, raw)


def restore_request(raw: bytes, blob: Callable[[str], bytes | None]) -> bytes:
    """The request as sent, from a stored `request_raw` and a blob lookup (references whose blob has no bytes,
    as under `hash-only`, stay references)."""
    def base64_of(digest: str | None) -> bytes | None:
        data = blob(digest) if digest else None
        return base64.b64encode(data) if data else None

    return fill_images(raw, base64_of)
