"""The runnable examples in docstrings stay true: every module of the project that has one is run."""

import doctest
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "collectors", "trainer", "checkpoints", "benchmarks")


def modules_with_examples() -> list[str]:
    """Dotted names of the modules whose source holds a doctest prompt (found by reading, not importing)."""
    names = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if ">>> " in path.read_text():
                parts = path.relative_to(REPO).with_suffix("").parts
                names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_modules_with_examples_are_found():
    found = modules_with_examples()
    assert {"trainer.ppo.pipeline", "trainer.ppo.model", "collectors.rollout", "envs.vr_edge"} <= set(found)


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no examples left"
    assert result.failed == 0
