"""Redaction rules on their own: what is removed, and what replay needs left byte-identical."""

from __future__ import annotations

import pytest

from forgerl.errors import UserError
from forgerl.recorder.redact import Redactor

KEY = b"sk-proj-abcdefghijklmnopqrstuvwxyz0123"


def test_opaque_replay_values_are_kept_but_other_data_fields_are_not():
    body = (b'{"data":"' + KEY + b'","thinking":{"type":"redacted_thinking","data":"QUJD+/=="},'
            b'"signature":"sk-ant-looksLikeAKeyButIsASignature00","encrypted_content":"gAAAA-_sk-xyzxyzxyzxyzxyzxyzxyz"}')
    out = Redactor().body(body)
    assert KEY not in out
    assert b'"data":"QUJD+/=="' in out
    assert b'"signature":"sk-ant-looksLikeAKeyButIsASignature00"' in out
    assert b'"encrypted_content":"gAAAA-_sk-xyzxyzxyzxyzxyzxyzxyz"' in out


def test_env_lines_inside_json_strings_keep_their_names():
    out = Redactor().body(b'{"output":"DB_PASSWORD=hunter2hunter2\\nAPI_TOKEN=abc123def\\nDEBUG=1"}')
    assert out == b'{"output":"DB_PASSWORD=[REDACTED]\\nAPI_TOKEN=[REDACTED]\\nDEBUG=1"}'


def test_header_secrets_are_redacted_and_then_found_in_bodies():
    r = Redactor()
    headers = r.headers([("Authorization", "Bearer tok_plain_but_secret_1234"), ("X-Api-Key", "k" * 24),
                         ("Content-Type", "application/json")])
    assert headers == {"authorization": "Bearer [REDACTED]", "x-api-key": "[REDACTED]",
                       "content-type": "application/json"}
    assert r.body(b'{"echo":"tok_plain_but_secret_1234"}') == b'{"echo":"[REDACTED]"}'
    assert r.path("/v1/models?key=abcdef&x=1") == "/v1/models?key=[REDACTED]&x=1"


def test_rule_files(tmp_path):
    rules = tmp_path / "rules"
    rules.write_text("# ids\nEMP-[0-9]{6}\n\n")
    assert Redactor.from_file(rules).body(b"user EMP-123456") == b"user [REDACTED]"
    rules.write_text("EMP-[0-9\n")
    with pytest.raises(UserError, match="bad redaction rule"):
        Redactor.from_file(rules)
