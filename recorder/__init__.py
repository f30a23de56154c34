"""Recorder: a mitmproxy addon and `forge-record`, capturing harness-to-model traffic.

May import `forgerl.schema` only.
"""
