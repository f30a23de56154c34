"""Converters: recorded datasets to training shards (veRL SFT/RL, tokens, ATIF).

May import `forgerl.schema` and `forgerl.recorder`; never the runners or trainer.
"""
