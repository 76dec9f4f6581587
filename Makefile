# Quick start: `make train` (set up + train VR-edge with defaults), `make test` (set up + all tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev,ray,export,experiments
space := $(subst ,, )

.PHONY: setup train resume evaluate need-run test lint wheels clean

# each step says what it installs first; pip is quiet, so while any step works a line says how long setup has run
# (torch alone can take a minute on a busy machine); the beat ends with setup, however setup ends, its nap too
SETUP_BEAT_S := 15
$(VENV)/.installed: pyproject.toml
	@set -e; \
	( trap 'kill $$nap 2>/dev/null; wait $$nap 2>/dev/null; exit 0' TERM; s=0; while :; do \
	    sleep $(SETUP_BEAT_S) </dev/null >/dev/null 2>&1 & nap=$$!; wait $$nap; \
	    s=$$((s + $(SETUP_BEAT_S))); echo "setup: still installing ($$s s so far)"; done ) & \
	beat=$$!; trap 'rc=$$?; kill $$beat 2>/dev/null; wait $$beat || :; exit $$rc' EXIT; trap 'echo "setup: stopped; make setup finishes it"; exit 130' INT TERM; \
	echo "setup: a virtual environment in $(VENV), with the newest pip"; \
	test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	$(PY) -m pip install --quiet --upgrade pip; \
	if ! $(PY) -c "import torch" 2>/dev/null; then \
	    echo "setup: torch 2.13.0 as the package index serves it (a CPU build where that is what it serves)"; \
	    $(PY) -m pip install --quiet "torch==2.13.0" || $(PY) -m pip install --quiet "torch>=2.4,<3"; \
	fi; \
	echo "setup: parallel-rollouts and its dependencies, with the extras $(EXTRAS)"; \
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"; \
	touch $@
	@echo "setup: done ($(VENV))"

setup: $(VENV)/.installed

train: setup
	$(PY) -m trainer.train $(ARGS)

need-run:
	@test -n "$(RUN)" || { echo 'set RUN to a run directory, e.g. make $(MAKECMDGOALS) RUN=runs/VREdge-v0-s1-...'; exit 2; }

resume: need-run setup  # make resume RUN=runs/<dir> [ARGS="--total-steps N"]
	$(PY) -m trainer.train --resume $(RUN) $(ARGS)

evaluate: need-run setup  # make evaluate RUN=runs/<dir> [ARGS="--episodes 50"]
	$(PY) -m trainer.evaluate --checkpoint $(RUN) $(ARGS)

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -m "" $(PYTEST_ARGS)

# for an offline GPU node whose image has torch, numpy, cloudpickle, psutil, tqdm and pytest but not the rest: those
# runtime dependencies as wheels in .whl/, at the versions installed here (docs/device.md, "Running the device check")
OFFLINE_WHEELS := tensordict pyvers gymnasium farama-notifications
wheels: setup
	rm -rf .whl
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: -d .whl \
		$$($(PY) -m pip freeze | grep -iE '^($(subst $(space),|,$(OFFLINE_WHEELS)))==')
	ls .whl

clean:
	rm -rf $(VENV) runs .pytest_cache .whl
