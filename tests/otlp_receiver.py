"""A light OTLP/HTTP trace receiver for the fast tests: a real HTTP server on a socket that decodes each POST to
`/v1/traces` with opentelemetry-proto's own `ExportTraceServiceRequest` (protobuf, or OTLP/JSON with hex ids).

MLflow's tracking server is the receiver of the end-to-end tests
(`mlflow_server.py`), but it takes 20-40 s to start on this 2-core machine and
lives in a venv of its own; the tests of a collector that is down, slow or
failing need one that can be made to fail, and start four recorders, so they
use this one. The decoding is the reference implementation's generated code.
`status` makes it answer an error instead (a failing collector), `delay` answer late (a slow one).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def parse_otlp_json(text: str) -> ExportTraceServiceRequest:
    """An OTLP/JSON request (hex ids) as the protobuf message."""
    value = json.loads(text)
    for resource in value.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ID_FIELDS:
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return json_format.ParseDict(value, ExportTraceServiceRequest())


def spans_of(requests: list[ExportTraceServiceRequest]) -> list[Span]:
    return [span for r in requests for rs in r.resource_spans for ss in rs.scope_spans for span in ss.spans]


class OtlpReceiver:
    """`url` is the base (the exporter adds /v1/traces); `requests` the decoded requests; `headers` each one's."""

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        self.status, self.delay = status, delay
        self.requests: list[ExportTraceServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                time.sleep(receiver.delay)
                if self.path != "/v1/traces" or receiver.status != 200:
                    self.send_response(404 if self.path != "/v1/traces" else receiver.status)
                    self.end_headers()
                    return
                if self.headers.get("Content-Type") == "application/json":
                    request = parse_otlp_json(body.decode())
                else:
                    request = ExportTraceServiceRequest.FromString(body)
                receiver.requests.append(request)
                receiver.headers.append(dict(self.headers))
                answer = ExportTraceServiceResponse().SerializeToString()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the exporter gave up waiting (`delay` past its timeout)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def spans(self) -> list[Span]:
        return spans_of(self.requests)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
