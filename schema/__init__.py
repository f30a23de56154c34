"""Schema: the canonical message model, the versioned table schemas, thread segments, and the on-disk store.

The lowest layer: imports nothing else from forgerl but `forgerl.errors` (the one user-error type).
"""
