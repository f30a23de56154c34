"""Schema: the canonical message model, the versioned table schemas, and the on-disk store.

The lowest layer: imports nothing else from forgerl.
"""
