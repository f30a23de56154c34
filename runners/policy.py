"""Which policy version the endpoint is serving, for `forge-run --watch` (online refresh).

By default the version is the served model's `root` (else its `id`) from the
upstream's `GET /v1/models`: vLLM reports the weights it loaded there (the
folder), the project's policy server (`trainer/policy_server.py`) the
checkpoint's version. A `root` that is a checkpoint folder written by
forge-train gives the `policy_version` of its `forgerl_policy.json`. A trainer
that swaps weights in place publishes a version instead, in a file, a
checkpoint folder or at a URL, and `--policy-version-from` reads that.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from forgerl.errors import UserError
from forgerl.schema.templates import POLICY_FILE

TIMEOUT_S = 10


class PolicyVersionError(UserError, RuntimeError):
    pass


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:  # noqa: S310 - the user's own endpoint
            return r.read().decode("utf-8", errors="replace")
    except OSError as e:
        raise PolicyVersionError(f"cannot read the policy version from {url}: {e}") from None


@dataclass(frozen=True)
class PolicyVersionSource:
    upstream: str = ""
    version_from: str = ""  # a file path or an http(s) URL whose body is the version

    def current(self) -> str:
        if self.version_from:
            if self.version_from.startswith(("http://", "https://")):
                text = _get(self.version_from)
            elif Path(self.version_from).is_dir():
                return checkpoint_version(Path(self.version_from))
            else:
                try:
                    text = Path(self.version_from).read_text()
                except OSError as e:
                    raise PolicyVersionError(f"cannot read the policy version file: {e}") from None
            if not text.strip():
                raise PolicyVersionError(f"{self.version_from} is empty")
            return text.strip()
        body = _get(f"{self.upstream.rstrip('/')}/v1/models")
        try:
            models = json.loads(body)["data"]
            model = models[0]
            served = str(model.get("root") or model["id"])
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise PolicyVersionError(f"{self.upstream}/v1/models lists no model") from None
        return checkpoint_version(Path(served)) if (Path(served) / POLICY_FILE).is_file() else served


def checkpoint_version(folder: Path) -> str:
    """The `policy_version` a forge-train checkpoint folder's `forgerl_policy.json` names."""
    try:
        version = json.loads((folder / POLICY_FILE).read_text())["policy_version"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PolicyVersionError(f"{folder}: no policy_version in {POLICY_FILE} ({type(e).__name__})") from None
    if not isinstance(version, str) or not version:
        raise PolicyVersionError(f"{folder}/{POLICY_FILE}: policy_version must be a non-empty string")
    return version
