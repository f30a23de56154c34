"""forgerl: record harness traffic, convert it to veRL shards, run tasks, train, analyse.

The top-level folders of the repository are mapped into this namespace
(`recorder/` is `forgerl.recorder`, and so on); see pyproject.toml.
"""

__version__ = "0.1.0"
