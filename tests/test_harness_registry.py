"""The harness registry (`harnesses/`): complete specs, tables derived from them, pins that match the installers,
and tools found where the user says, else where the project installs them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

from forgerl.analysis.kinds import KINDS
from forgerl.errors import UserError
from forgerl.harnesses import (FINGERPRINTS, HARNESSES, LAUNCHERS, SUBAGENT_TOOLS, TOOL_KINDS, HarnessError, Pin,
                               get_harness, launch, locate, pins, readme_table)
from forgerl.harnesses.locate import Tool

from conftest import REPO

TABLE = re.compile(r"<!-- harness table: .*? -->\n(.*?)\n<!-- end of the harness table -->", re.S)


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_every_spec_is_complete(name):
    """Every field is set, or declared not applicable with a reason."""
    assert HARNESSES[name].missing() == []


def test_readme_table_is_the_generated_one():
    found = TABLE.search((REPO / "README.md").read_text())
    assert found, "README.md lacks the generated harness table (python -m forgerl.harnesses table)"
    assert found.group(1) == readme_table()


def test_pins_agree_with_the_installers():
    npm = json.loads((REPO / "package.json").read_text())["dependencies"]
    locks = {name: dict(line.split("==", 1) for line in (REPO / name).read_text().splitlines()
                        if "==" in line and not line.startswith("#"))
             for name in ("requirements-mini.lock", "requirements-browser.lock")}
    for harness in HARNESSES.values():
        pin = harness.pin
        assert isinstance(pin, Pin), harness.name
        if pin.registry == "npm":
            assert (pin.installer, npm.get(pin.package)) == ("package.json", pin.version), harness.name
        elif pin.registry == "pypi":
            assert locks[pin.installer].get(pin.package) == pin.version, harness.name
        else:
            assert pin.installer == "", f"{harness.name}: nothing here installs {pin}"
    out = subprocess.run([sys.executable, "-m", "forgerl.harnesses", "pins", "npm"], capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == [str(p) for p in pins("npm")] and "@openai/codex@0.171.0" in out


def test_derived_tables():
    """Launchers by command file name, the fingerprint order (a harness whose calls also match another's is tried
    first), tool kinds in the analysis' vocabulary, and the subagent tools the segmenter reads."""
    from forgerl.schema.segments import SUBAGENT_TOOLS as SEGMENTER_SUBAGENT_TOOLS

    assert LAUNCHERS["claude"].name == "claude-code" and LAUNCHERS["zeroclaw"].name == "zeroclaw"
    order = [name for name, _ in FINGERPRINTS]
    assert order.index("opencode") < order.index("pi") and order.index("qwen-code") < order.index("gemini-cli")
    assert set(TOOL_KINDS.values()) <= set(KINDS) and TOOL_KINDS["sessions_spawn"] == "subagent"
    assert SEGMENTER_SUBAGENT_TOOLS is SUBAGENT_TOOLS  # the segmenter reads the registry's, no copy


def test_zeroclaw_is_aimed_by_forge_record_run(tmp_path):
    aimed = launch(["/opt/bin/zeroclaw", "agent", "--model", "qwen3", "-m", "hi"], "http://127.0.0.1:8787", "s1",
                   tmp_path)
    assert aimed.argv == ["/opt/bin/zeroclaw", "agent", "--model", "qwen3", "-m", "hi"]
    config = tomllib.loads((tmp_path / "zeroclaw" / "config.toml").read_text())
    assert config == {"default_provider": "custom:http://127.0.0.1:8787/s/s1/v1", "default_model": "qwen3"}
    assert aimed.env["ZEROCLAW_CONFIG_DIR"] == str(tmp_path / "zeroclaw")


def test_browser_use_script_is_aimed_through_its_python(tmp_path):
    aimed = launch(["/venv/bin/python3", "-P", "/x/browser_use_cli.py", "--task", "t"], "http://h:1", "s1", tmp_path)
    assert aimed.env["ANONYMIZED_TELEMETRY"] == "false" and aimed.env["OPENAI_BASE_URL"] == "http://h:1/s/s1/v1"
    plain = launch(["python3", "other.py"], "http://h:1", "s1", tmp_path)
    assert "ANONYMIZED_TELEMETRY" not in plain.env and plain.env["OPENAI_BASE_URL"] == "http://h:1/s/s1/v1"


def _tool(folder, name: str) -> str:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho \"$0\"\n")
    path.chmod(0o755)
    return str(path)


def test_tools_are_found_from_env_then_path_then_config_then_the_project(tmp_path, monkeypatch):
    tool = Tool("frob", "frob", "bin/frob")
    project = tmp_path / "checkout"
    pinned = _tool(project, "bin/frob")
    configured = _tool(tmp_path / "configured", "frob")
    on_path = _tool(tmp_path / "path", "frob")
    chosen = _tool(tmp_path / "chosen", "frob")
    config = tmp_path / "tools.toml"
    config.write_text(f'[tools]\nfrob = "{configured}"\n')
    monkeypatch.setenv("FORGE_PROJECT_ROOT", str(project))
    monkeypatch.setenv("FORGE_CONFIG", str(config))
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    monkeypatch.setenv("FORGE_FROB", chosen)
    assert locate(tool) == chosen
    monkeypatch.delenv("FORGE_FROB")
    assert locate(tool) == on_path
    monkeypatch.setenv("PATH", "/nonexistent")
    assert locate(tool) == configured
    config.write_text("[tools]\n")
    assert locate(tool) == pinned
    os.remove(pinned)
    with pytest.raises(HarnessError) as missing:
        locate(tool)
    assert str(missing.value) == (f"frob not found: looked in $FORGE_FROB, PATH, {config}, {project}/bin/frob "
                                  "(run `make harnesses` in the project root, or set one of them)")
    monkeypatch.setenv("FORGE_FROB", str(tmp_path / "nowhere"))
    with pytest.raises(HarnessError, match=r"frob: .*nowhere \(from \$FORGE_FROB\) is not an executable file"):
        locate(tool)
    config.write_text("[tools\n")
    monkeypatch.delenv("FORGE_FROB")
    with pytest.raises(UserError, match=r"tools.toml: not valid TOML"):
        locate(tool)


def test_the_checkout_is_found_from_the_working_directory(tmp_path, monkeypatch):
    """Run from the checkout (or a folder in it), with no configuration, the pinned installs are found."""
    monkeypatch.delenv("FORGE_PROJECT_ROOT", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("FORGE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.chdir(REPO / "tests")
    assert locate(Tool("claude", "claude", "node_modules/.bin/claude")) == str(REPO / "node_modules/.bin/claude")


@pytest.mark.skipif(shutil.which("node") is None, reason="needs a node on PATH")
def test_a_runtime_too_old_is_one_line(monkeypatch):
    """PATH's Node (20 here) is older than OpenClaw's engines ask for: `find` says which it found and needs."""
    node = shutil.which("node")
    found = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    if int(found.lstrip("v").split(".")[0]) >= 24:
        pytest.skip(f"PATH's node is {found}, new enough for every harness")
    monkeypatch.setenv("FORGE_NODE", node)
    with pytest.raises(HarnessError) as err:
        get_harness("openclaw").find()
    assert str(err.value) == (f"openclaw needs node >= 24.16.0, found {found.lstrip('v')} at {node} "
                              "(set FORGE_NODE, or run `make harnesses` for the pinned Node)")


@pytest.mark.parametrize("header", ["| harness | MCP wiring |", "| harness | next user turn |"])
def test_runners_readme_tables_name_every_harness(header):
    """runners/README.md's MCP wiring and resume tables (hand-written: they say more than the specs) have a row
    for each registered harness, and none for another."""
    text = (REPO / "runners" / "README.md").read_text()
    rows = text[text.index(header):].split("\n\n")[0].splitlines()[2:]
    assert set(re.findall(r"`([a-z-]+)`", "\n".join(row.split("|")[1] for row in rows))) == set(HARNESSES)


NEW_HARNESS = '''
"""A harness added the way runners/README.md says: this module, and nothing else."""
from dataclasses import dataclass

from .locate import Tool
from .spec import OPENAI_KEY, Fingerprints, Harness, NotApplicable, Pin, RunContext, Table


@dataclass
class NewClaw(Harness):
    name: str = "newclaw"
    cli: Tool = Tool("newclaw", "newclaw", "")
    runtime: NotApplicable = NotApplicable("a static binary")
    pin: Pin = Pin("cargo", "newclaw", "1.0.0", "")
    api: str = "chat"
    default_model: str = "policy"
    key: object = OPENAI_KEY
    fingerprints: Fingerprints = Fingerprints(user_agents=("newclaw/",), prompts=("You are NewClaw",),
                                              tools=(frozenset({"nc_shell", "nc_read"}),))
    commands: tuple = ("newclaw",)
    offline: dict = None
    headless: str = "`newclaw run PROMPT`"
    mcp_wiring: NotApplicable = NotApplicable("no MCP client")
    resumes: NotApplicable = NotApplicable("cannot resume")
    transcript: NotApplicable = NotApplicable("keeps none")
    final_answer_from: str = "stdout"
    tool_kinds: Table = Table({"nc_shell": "shell", "nc_read": "read"})
    plan_tools: NotApplicable = NotApplicable("none")
    subagent_tools: frozenset = frozenset({"nc_spawn"})

    def __post_init__(self):
        self.offline = {"NEWCLAW_TELEMETRY": "0"}

    def command(self, exe: str, ctx: RunContext):
        return [exe, "run", ctx.prompt], self.base_env(ctx)


HARNESS = NewClaw()
'''


def test_a_new_harness_is_one_module(tmp_path):
    """A copy of the package with one more module: every derived table (the `--harness` names, launchers,
    fingerprints, tool kinds, subagent tools, `--help` lists, the README table) has it, with no other edit."""
    package = tmp_path / "probe_harnesses"
    shutil.copytree(REPO / "harnesses", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "newclaw.py").write_text(NEW_HARNESS)
    probe = ("import probe_harnesses as h\n"
             "n = h.get_harness('newclaw')\n"
             "assert n.missing() == [], n.missing()\n"
             "assert h.LAUNCHERS['newclaw'] is n and dict(h.FINGERPRINTS)['newclaw'].prompts == ('You are NewClaw',)\n"
             "assert h.TOOL_KINDS['nc_shell'] == 'shell' and h.TOOL_KINDS['nc_spawn'] == 'subagent'\n"
             "assert 'nc_spawn' in h.SUBAGENT_TOOLS and '  newclaw: no MCP client' in h.mcp_help().splitlines()\n"
             "assert '| `newclaw` |' in h.readme_table() and 'newclaw (newclaw)' in h.recorded_commands()\n"
             "print(len(h.HARNESSES))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(HARNESSES) + 1
