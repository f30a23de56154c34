"""Analysis: DuckDB views and behaviour metrics over a dataset root.

May import `forgerl.schema`; the runners and trainer build on it, not the reverse.
"""
