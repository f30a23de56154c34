"""Keep secrets off disk: headers, key-shaped strings, and user-configured patterns.

Redaction works on raw bytes, so what is stored keeps the exact formatting
the harness sent, and it runs before anything is parsed or written, so every
derived column inherits it. Values replay needs — Anthropic thinking
`signature`, redacted_thinking `data`, Responses `encrypted_content` — are
opaque base64 and are never touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from forgerl.errors import UserError

from .credentials import PREFIX as TOKEN_PREFIX

REDACTED = "[REDACTED]"
SECRET_HEADERS = frozenset({
    "authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "set-cookie",
    "x-goog-api-key", "openai-organization", "chatgpt-account-id",
})
SECRET_QUERY = re.compile(rb"(?i)([?&](?:key|api_key|api-key|access_token|token)=)[^&#\s\"]+")

# Key shapes of the vendors harnesses talk to, and the generic forms they take,
# each with the literals one of which every match contains: `bytes.find` on
# those is ~100x faster than a regex scan, and most bodies hold none of them.
KEY_PATTERNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r"sk-(?:ant-|proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}", ("sk-",)),   # Anthropic, OpenAI
    (r"AKIA[0-9A-Z]{16}", ("AKIA",)),                                         # AWS access key id
    (r"gh[pousr]_[A-Za-z0-9]{30,}", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),  # GitHub
    (r"github_pat_[A-Za-z0-9_]{40,}", ("github_pat_",)),
    (r"xox[baprs]-[A-Za-z0-9\-]{10,}", ("xox",)),                             # Slack
    (r"AIza[0-9A-Za-z_\-]{35}", ("AIza",)),                                  # Google
    (r"hf_[A-Za-z0-9]{30,}", ("hf_",)),                                       # Hugging Face
    (r"(?i:bearer)\s+[A-Za-z0-9._~+/\-]{16,}=*", ("bearer", "Bearer", "BEARER")),
    (re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_.\-]+", (TOKEN_PREFIX,)),           # forgerl's own tokens
    (r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----", ("PRIVATE KEY",)),
)
# `.env`-style lines whose name says secret: keep the name, drop the value. They may
# sit inside JSON strings, after an escaped newline.
ENV_LINE = (r"(?:(?<=\\[nrt])|(?<![A-Za-z0-9_]))((?:export\s+)?[A-Z][A-Z0-9_]*"
            r"(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD)[A-Z0-9_]*\s*=\s*)[^\s\"'\\]+")
ENV_ANCHORS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD")

# Opaque values replay needs. `data` (images, redacted_thinking) only when it is
# plain base64, so a secret in some tool's own "data" field is still redacted.
_PROTECTED = re.compile(rb'"(?:signature|encrypted_content)"\s*:\s*"(?:[^"\\]|\\.)*"'
                        rb'|"data"\s*:\s*"[A-Za-z0-9+/=]*"')


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[bytes]
    anchors: tuple[bytes, ...]  # empty: always scan
    replacement: bytes

    def may_match(self, data: bytes) -> bool:
        return not self.anchors or any(a in data for a in self.anchors)


@dataclass
class Redactor:
    """Applies the built-in patterns plus `extra` regexes (whole match replaced)."""

    extra: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        mask = REDACTED.encode()
        self._rules = [_Rule(re.compile(p.encode()), tuple(a.encode() for a in anchors), mask)
                       for p, anchors in KEY_PATTERNS]
        self._rules.append(_Rule(re.compile(ENV_LINE.encode()), tuple(a.encode() for a in ENV_ANCHORS),
                                 rb"\1" + mask))
        self._rules += [_Rule(re.compile(p.encode()), (), mask) for p in self.extra]
        self._literals: list[bytes] = []

    @classmethod
    def from_file(cls, path: str | Path) -> Redactor:
        """One regex per line; blank lines and lines starting with # are ignored."""
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as e:
            raise UserError(f"redaction rules {path}: {e.strerror or e}") from None
        rules = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
        for rule in rules:
            try:
                re.compile(rule)
            except re.error as e:
                raise UserError(f"{path}: bad redaction rule {rule!r}: {e}") from None
        return cls(extra=rules)

    def add_literals(self, secrets: Iterable[str]) -> None:
        """Secrets seen in headers are also removed wherever they reappear in bodies."""
        for s in secrets:
            if len(s) >= 8 and s.encode() not in self._literals and len(self._literals) < 1000:
                self._literals.append(s.encode())

    def headers(self, headers: Iterable[tuple[str, str]]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in headers:
            lower = name.lower()
            if lower in SECRET_HEADERS:
                scheme = value.split(" ", 1)[0] if " " in value else ""
                self.add_literals([value.split(" ", 1)[-1]])
                value = f"{scheme} {REDACTED}".strip()
            out[lower] = f"{out[lower]}, {value}" if lower in out else value
        return out

    def path(self, path: str) -> str:
        return SECRET_QUERY.sub(rb"\1" + REDACTED.encode(), path.encode()).decode()

    def text(self, text: str | None) -> str | None:
        """`body` for text that is not a call's (what a runner keeps of a harness's own output)."""
        return self.body(text.encode()).decode() if text else text

    def body(self, data: bytes | None) -> bytes | None:
        """Redact a body; spans of replay-critical opaque values are left byte-identical."""
        if not data:
            return data
        for literal in self._literals:
            data = data.replace(literal, REDACTED.encode())
        rules = [r for r in self._rules if r.may_match(data) and r.pattern.search(data)]
        if not rules:
            return data
        out, last = [], 0
        for start, end in (m.span() for m in _PROTECTED.finditer(data)):
            out.append(_apply(rules, data[last:start]))
            out.append(data[start:end])
            last = end
        out.append(_apply(rules, data[last:]))
        return b"".join(out)


def _apply(rules: list[_Rule], data: bytes) -> bytes:
    for rule in rules:
        data = rule.pattern.sub(rule.replacement, data)
    return data
