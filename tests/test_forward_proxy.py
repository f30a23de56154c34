"""Forward-proxy mode: a client that cannot change its base URL, over HTTPS, trusting mitmproxy's CA."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import time

import httpx
import openai
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from conftest import RecorderProcess, session_calls
from scripted_upstream import ScriptedUpstream, Turn, sequence


def self_signed(tmp_path) -> tuple[ssl.SSLContext, str]:
    """A server context for 127.0.0.1 and the PEM that trusts it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "scripted-upstream")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_pem, key_pem = tmp_path / "up.pem", tmp_path / "up.key"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_pem, key_pem)
    return ctx, str(cert_pem)


def test_forward_proxy_with_mitmproxy_ca(tmp_path):
    server_ctx, upstream_pem = self_signed(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "data"
    with ScriptedUpstream(sequence(Turn(text="over https")), ssl_context=server_ctx) as up:
        rec = RecorderProcess(out, None, "--forward", "--upstream-ca", upstream_pem, env={"HOME": str(home)}).start()
        try:
            ca = home / ".mitmproxy" / "mitmproxy-ca-cert.pem"
            for _ in range(50):
                if ca.exists():
                    break
                time.sleep(0.1)
            http = httpx.Client(proxy=rec.url, verify=str(ca), timeout=10)
            client = openai.OpenAI(base_url=up.url + "/v1", api_key="sk-proj-forwardforwardforwardfw",
                                   http_client=http, default_headers={"X-Forge-Session": "fwd"})
            reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].message.content == "over https"
            # Without mitmproxy's CA the client refuses the intercepted connection.
            try:
                httpx.Client(proxy=rec.url, timeout=10).get(up.url + "/v1/models")
                raise AssertionError("TLS interception was accepted without trusting the CA")
            except httpx.ConnectError as e:
                assert "CERTIFICATE_VERIFY_FAILED" in str(e)
            row = session_calls(out, "fwd", 1)[0]
            assert row["api"] == "chat" and row["complete"] and row["upstream"].startswith("https://127.0.0.1")
            assert "sk-proj-forward" not in row["request_headers"]
        finally:
            rec.stop()
