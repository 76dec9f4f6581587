"""The runnable examples in public docstrings stay true."""

import doctest
import importlib

import pytest

MODULES = ["envs.vr_edge", "envs.vector", "envs.baselines", "envs.planner", "envs.traces", "trainer.validation",
           "collectors.collector", "collectors.resources",
           "trainer.model", "trainer.flat_params", "trainer.layout", "trainer.export", "trainer.replay",
           "trainer.nstep", "trainer.dqn"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no examples left"
    assert result.failed == 0
