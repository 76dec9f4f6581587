# Quick start: `make train` (set up + train VR-edge with defaults), `make test` (set up + all tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev,ray,export,experiments
space := $(subst ,, )

.PHONY: setup train resume evaluate need-run test lint wheels clean

# each step says what it installs first: pip is quiet, and the whole takes a few minutes on a fresh machine
$(VENV)/.installed: pyproject.toml
	@echo "setup: a virtual environment in $(VENV), with the newest pip"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# torch first, pinned to the CPU wheel when no torch is present, so the range below never pulls a multi-GB CUDA build
	@$(PY) -c "import torch" 2>/dev/null || echo "setup: torch"
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==2.13.0" || $(PY) -m pip install --quiet "torch>=2.4,<3"
	@echo "setup: parallel-rollouts and its dependencies, with the extras $(EXTRAS)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
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
