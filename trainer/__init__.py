"""Trainer: veRL SFT launcher and the online RL agent loop.

The top layer: may import every other forgerl package; nothing imports it.
"""
