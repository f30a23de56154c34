"""Runners: tasks x attempts with a harness pointed at the recorder, locally or on Kubernetes.

May import `forgerl.schema`, `forgerl.recorder` and `forgerl.analysis`.
"""
