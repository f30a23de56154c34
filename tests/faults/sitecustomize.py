"""Fault injection for `test_writer_failures.py`: a codec bug, in the process where codecs run.

On PYTHONPATH, Python imports this module as it starts (`site`), so it
reaches `forge-record serve` and the writer process it spawns. With
`FORGERL_TEST_CODEC_BUG=MARKER` set, the chat codec raises on any request or
response body that holds MARKER, as a bug in a codec would; without it, this
does nothing. It lives in tests/, never in the wheel.
"""

import json
import os

MARKER = os.environ.get("FORGERL_TEST_CODEC_BUG")

if MARKER:
    from forgerl.recorder.apis.chat import ChatCodec

    def _tripping(method):
        def tripped(self, body, *args):
            if MARKER in json.dumps(body):
                raise RuntimeError(f"injected codec bug in {method.__name__}")
            return method(self, body, *args)
        return tripped

    ChatCodec.parse_request = _tripping(ChatCodec.parse_request)
    ChatCodec.parse_response = _tripping(ChatCodec.parse_response)
