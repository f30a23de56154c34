"""`forge-analyze view`: a local, read-only web app over one dataset.

`queries.py` pages the sessions list and reads one session, call, raw exchange
or blob from DuckDB; `tokens.py` shows a segment as the converters' training
sample, token by token; `server.py` serves both and the page in `static/`
(plain HTML, CSS and JavaScript, no build step). Unlike the rest of
`analysis`, the token view imports `forgerl.converters` (its peer layer; it
never imports analysis), so the sample shown is the one `forge-convert` writes.
"""
