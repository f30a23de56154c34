"""The recorder holds the keys (`forge-record serve --hold-keys`): a real recorder process, real SDK clients and
the scripted upstream, which sees what the recorder forwards."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from conftest import FORGE_RECORD, RecorderProcess, session_calls
from test_recorder_durability import every_value_on_disk

from forgerl.recorder.control import BarrierError, RecorderControl
from forgerl.recorder.credentials import PREFIX, Tokens
from forgerl.recorder.redact import Redactor

SECRET = "s3cret-" + "7" * 40
REAL = {"ANTHROPIC_API_KEY": "sk-ant-real-" + "a" * 30, "OPENAI_API_KEY": "sk-real-" + "b" * 30,
        "GEMINI_API_KEY": "AIza" + "c" * 35}
GEMINI = "/v1beta/models/gemini-2.5-flash:generateContent"
GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
MESSAGE = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def held(scripted, tmp_path):
    """A started `--hold-keys` recorder in front of a scripted upstream: (recorder, upstream, control)."""
    upstream = scripted()
    rec = RecorderProcess(tmp_path / "data", upstream.url, "--hold-keys",
                          env={"FORGE_RECORDER_SECRET": SECRET, **REAL}, secret=SECRET).start()
    yield rec, upstream, RecorderControl(rec.url, secret=SECRET)
    rec.stop()


def _nothing_secret_on_disk(root: Path, *tokens: str) -> None:
    """No real key, token, secret or token prefix in any value of the dataset (decompressed) or any other file."""
    values = list(every_value_on_disk(root))
    assert values, "nothing recorded"
    found = {secret: [where for where, data in values if secret.encode() in data]
             for secret in (*REAL.values(), *tokens, SECRET, PREFIX)}
    assert not any(found.values()), found


def test_a_token_works_for_its_session_in_each_key_place(held):
    rec, upstream, control = held
    token = control.register("s1")
    assert token.startswith(PREFIX)

    reply = anthropic.Anthropic(api_key=token, base_url=rec.base("s1"), max_retries=0).messages.create(**MESSAGE)
    assert reply.content[0].text
    assert upstream.log[-1].headers["x-api-key"] == REAL["ANTHROPIC_API_KEY"]

    chat = openai.OpenAI(api_key=token, base_url=rec.base("s1") + "/v1", max_retries=0).chat.completions.create(
        model="gpt-x", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content
    assert upstream.log[-1].headers["authorization"] == f"Bearer {REAL['OPENAI_API_KEY']}"

    r = httpx.post(rec.base("s1") + GEMINI, json=GEMINI_BODY, headers={"x-goog-api-key": token}, timeout=10)
    assert r.status_code == 200, r.text
    assert upstream.log[-1].headers["x-goog-api-key"] == REAL["GEMINI_API_KEY"]

    r = httpx.post(f"{rec.base('s1')}{GEMINI}?key={token}", json=GEMINI_BODY, timeout=10)
    assert r.status_code == 200, r.text
    assert upstream.log[-1].path == f"{GEMINI}?key={REAL['GEMINI_API_KEY']}"
    assert all(token not in str(ex.headers) + ex.path for ex in upstream.log)

    assert control.flush("s1", now=True) == 4
    control.close("s1")
    assert [c["status"] for c in session_calls(rec.out, "s1", 4)] == [200] * 4
    rec.stop()
    _nothing_secret_on_disk(rec.out, token)


def test_anything_but_a_valid_token_gets_the_apis_own_401(held):
    rec, upstream, control = held
    other = control.register("other")
    short = control.register("s2", ttl_s=1)
    revoked = control.register("s2")
    anthropic_client = anthropic.Anthropic(api_key=revoked, base_url=rec.base("s2"), max_retries=0)
    anthropic_client.messages.create(**MESSAGE)  # valid until its session is closed
    control.close("s2")
    time.sleep(1.1)  # `short` has expired

    cases = {"another session's": other, "expired": short, "revoked": revoked,
             "garbage": PREFIX + "garbage.1.2.xyz", "a vendor key instead of a": REAL["ANTHROPIC_API_KEY"]}
    for what, key in cases.items():
        with pytest.raises(anthropic.AuthenticationError) as e:
            anthropic.Anthropic(api_key=key, base_url=rec.base("s2"), max_retries=0).messages.create(**MESSAGE)
        body = e.value.response.json()
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error", what
    messages = [r.json()["error"]["message"] for r in (
        httpx.post(rec.base("s2") + "/v1/messages", json=MESSAGE, headers={"x-api-key": k}) for k in cases.values())]
    assert "another session" in messages[0] and "expired" in messages[1] and "revoked" in messages[2]
    assert "invalid" in messages[3] and "no forgerl token" in messages[4]

    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(api_key=revoked, base_url=rec.base("s2") + "/v1", max_retries=0).chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "hi"}])
    assert e.value.response.json()["error"]["code"] == "invalid_api_key"
    assert e.value.response.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{rec.base('s2')}{GEMINI}?key={other}", json=GEMINI_BODY, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
    r = httpx.post(rec.base("s2") + GEMINI, json=GEMINI_BODY, timeout=10)  # no key at all
    assert r.status_code == 401 and r.json()["error"]["code"] == 401

    assert len(upstream.log) == 1  # only the call made while the token was valid was forwarded
    assert control.flush("s2", now=True) == 1 + len(cases) * 2 + 3
    statuses = [c["status"] for c in session_calls(rec.out, "s2", 1 + len(cases) * 2 + 3)]
    assert statuses.count(200) == 1 and statuses.count(401) == len(cases) * 2 + 3
    rec.stop()
    _nothing_secret_on_disk(rec.out, other, short, revoked)


def test_control_endpoints_want_the_secret(held):
    rec, _, control = held
    for path in ("/_forge/sessions/s1/token", "/_forge/sessions/s1/close", "/_forge/sessions/s1/flush"):
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {SECRET}"}):
            r = httpx.post(rec.url + path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.json()["error"]["type"] == "forgerl_unauthorized"
    assert httpx.get(rec.url + "/_forge/ready").json() == {"ready": True}  # a kubelet's probe holds no secret
    with pytest.raises(BarrierError, match="401"):
        RecorderControl(rec.url).register("s1")
    token = control.register("s1")  # a session's own token opens its flush barrier (a pod's), and nothing else
    assert RecorderControl(rec.url, secret=token).flush("s1", now=True) == 0
    for path in ("/_forge/sessions/s2/flush", "/_forge/sessions/s1/token", "/_forge/sessions/s1/close"):
        assert httpx.post(rec.url + path, headers={"authorization": f"Bearer {token}"}).status_code == 401
    control.close("s1")
    with pytest.raises(BarrierError, match="401"):
        RecorderControl(rec.url, secret=token).flush("s1")
    assert httpx.post(rec.url + "/_forge/sessions/s1/token?ttl=999999",
                      headers={"authorization": f"Bearer {SECRET}"}).status_code == 400


def test_tokens_outlive_a_restart_and_work_at_every_recorder_with_the_secret(held):
    """Stateless: a token from `forge-record token` (no recorder involved) is accepted."""
    rec, upstream, _ = held
    token = subprocess.run([FORGE_RECORD, "token", "--session", "cli"], capture_output=True, text=True, check=True,
                           env={**os.environ, "FORGE_RECORDER_SECRET": SECRET}).stdout.strip()
    anthropic.Anthropic(api_key=token, base_url=rec.base("cli"), max_retries=0).messages.create(**MESSAGE)
    assert upstream.log[-1].headers["x-api-key"] == REAL["ANTHROPIC_API_KEY"]


def test_without_hold_keys_keys_pass_through_and_tokens_are_not_issued(scripted, recorder):
    upstream = scripted()
    rec = recorder(upstream.url)
    anthropic.Anthropic(api_key="sk-ant-own-" + "d" * 30, base_url=rec.base("p"), max_retries=0).messages.create(
        **MESSAGE)
    assert upstream.log[-1].headers["x-api-key"] == "sk-ant-own-" + "d" * 30
    r = httpx.post(rec.url + "/_forge/sessions/p/token")
    assert r.status_code == 409 and "--hold-keys" in r.json()["error"]["message"]


def test_bad_input_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FORGE_RECORDER_SECRET"}
    secret = {**env, "FORGE_RECORDER_SECRET": SECRET}
    out = ["--out", str(tmp_path / "d")]
    forge_run = [str(Path(FORGE_RECORD).with_name("forge-run")), str(tmp_path), "--harness", "codex",
                 "--recorder-url", "http://127.0.0.1:9", *out]
    for args, environ, said in (
            ([FORGE_RECORD, "serve", "--hold-keys", *out], env, "FORGE_RECORDER_SECRET must hold a secret"),
            ([FORGE_RECORD, "token", "--session", "s"], env, "FORGE_RECORDER_SECRET must hold a secret"),
            ([FORGE_RECORD, "token", "--session", "s", "--ttl", "0"], secret, "token lifetime must be"),
            ([FORGE_RECORD, "serve", "--upstream-key-env", "openai=X", *out], secret, "goes with --hold-keys"),
            ([FORGE_RECORD, "serve", "--hold-keys", "--upstream-key-env", "mistral=X", *out], secret, "unknown API"),
            (forge_run, env, "FORGE_RECORDER_SECRET must hold a secret"),
            ([*forge_run, "--runner", "kubernetes"], env, "FORGE_RECORDER_SECRET must hold a secret")):
        done = subprocess.run(args, capture_output=True, text=True, env=environ, timeout=60)
        assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done
    assert not (tmp_path / "d").exists()


def test_tokens_are_redacted_and_checked_offline():
    tokens = Tokens(SECRET)
    token, _ = tokens.issue("a/b c")
    tokens.check(token, "a/b c")
    assert Redactor().body(f'{{"k": "{token}"}}'.encode()) == b'{"k": "[REDACTED]"}'
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for bad, session in ((forged, "a/b c"), (token, "a/b"), (Tokens(SECRET + "x").issue("a/b c")[0], "a/b c")):
        with pytest.raises(Exception, match="invalid|another session"):
            tokens.check(bad, session)


@pytest.mark.slow
def test_forge_run_gives_the_harness_a_token_and_the_upstream_the_key(scripted, tmp_path):
    """Claude Code under forge-run (holding the keys is its default): its key variable holds a token (its shell says so), the recorder
    swaps it, the upstream gets the real key, and neither the key nor a token is in what forge-run wrote."""
    from runner_fixtures import BENCH, NOVEL_ANSWER, NOVEL_SCORE, NOVEL_TASK, shell_call
    from scripted_upstream import Turn, saw_tool_result

    from forgerl.schema.store import read_table

    check = 't=TOKEN o=ELSE; case "$ANTHROPIC_API_KEY" in forge-c?p-*) echo HOLDS-A-$t;; *) echo HOLDS-$o;; esac'

    def script(request):
        if saw_tool_result(request):
            return Turn(text=NOVEL_ANSWER)
        return Turn(text="Checking my key.", tool_calls=[shell_call(request, check)])

    up = scripted(script)
    out = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != "FORGE_RECORDER_SECRET"}
    r = subprocess.run([str(Path(FORGE_RECORD).with_name("forge-run")), str(BENCH), "--task", NOVEL_TASK,
                        "--harness", "claude-code", "--upstream", up.url, "--out", str(out)],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                       env={**env, "ANTHROPIC_API_KEY": REAL["ANTHROPIC_API_KEY"]})
    assert r.returncode == 0, r.stderr[-3000:]
    [row] = read_table(out, "outcomes").to_pylist()
    assert row["reward"] == pytest.approx(NOVEL_SCORE), row["error"]
    assert any(b"HOLDS-A-TOKEN" in ex.body for ex in up.log)
    assert not any(b"HOLDS-ELSE" in ex.body for ex in up.log)
    assert len(up.log) >= 2 and {ex.headers.get("x-api-key") for ex in up.log} == {REAL["ANTHROPIC_API_KEY"]}
    _nothing_secret_on_disk(out)
