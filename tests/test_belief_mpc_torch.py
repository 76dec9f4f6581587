"""The torch BeliefMPC (envs.belief_mpc_torch), its rollout on tensors and fused (envs.belief_mpc_kernel): the NumPy
BeliefMPC's levels on many states of a fixed cell, a varying cell with churn and one of short segments (several
seeds, states deep into episodes and near their end), the same expected returns to the last bit (fixed and masked
cells, below and above 8 users, short segments, one thread or several, in a forked child), NumPy's sums in NumPy's
order, the low-buffer bound of fair_share's reading, and what it does not do refused in one line."""

import multiprocessing

import numpy as np
import pytest
import torch

import envs
from envs.belief_mpc import BeliefMPC
from envs.belief_mpc_torch import (
    TorchBeliefMPC,
    _low_as_read,
    low_buffer_bound,
    numpy_order_sum,
    running_sum_in_order,
)
from envs.settings import ConfigError

# States whose levels may differ from NumPy's: none. The rollout does NumPy's floating-point operations in NumPy's
# order (its sums included), so a difference is a bug, not a tie; a tie would be two levels whose expected returns
# differ by rounding alone, and there is no rounding of its own to break one differently.
TIES_AT_MOST = 0

# short segments: a buffer can be low after a round (at the defaults it never is: a round leaves at least a segment,
# 1 s, and fair_share's mark is 1 s), so the rollout's rarer way through a round is played too
CELLS = {"fixed": {"num_users": 6, "max_steps": 20},
         "churn": {"num_users": 8, "users": "2-8", "churn": "0-0.1", "max_steps": 20},
         "short segments": {"num_users": 6, "segment_s": 0.5, "max_steps": 20}}


def _states_and_levels(kwargs: dict, seed: int, steps: int, device: str = "cpu", fused: bool | None = None,
                       **settings) -> tuple[int, int]:
    """``(states, states whose levels differ)`` over ``steps`` steps of 16 envs: both experts see the same
    observations, the envs played by random levels (buffers low and high, stalls, switches) then by NumPy's."""
    venv = envs.VREdgeVectorEnv(16, seed=seed, **kwargs)
    obs, _ = venv.reset()
    numpy_mpc = BeliefMPC(venv.config, seed=seed, **settings)
    torch_mpc = TorchBeliefMPC(venv.config, seed=seed, device=device, fused=fused, **settings)
    rng = np.random.default_rng(seed)
    states = differ = 0
    for step in range(steps):
        want, got = numpy_mpc(obs), torch_mpc(obs)
        assert got.dtype == np.int64 and got.shape == want.shape
        states, differ = states + len(obs), differ + int((want != got).any(axis=1).sum())
        random = rng.integers(0, venv.config.num_levels, size=want.shape)
        obs, *_ = venv.step(random if step % 3 == 0 else want)
    return states, differ


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "tensors"])
@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("seed", [0, 1])
def test_the_levels_are_numpys_on_many_states(cell, seed, fused):
    # 20-step episodes played 24 steps: autoresets, the last steps (horizon past the end) and a new episode
    states, differ = _states_and_levels(CELLS[cell], seed, 24, fused=fused, horizon=5, scenarios=4, sweeps=2)
    assert states == 16 * 24
    assert differ <= TIES_AT_MOST, f"{differ} of {states} states differ"


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [{}, {"num_users": 12, "users": "2-12", "churn": "0-0.05"}])
def test_the_levels_are_numpys_with_the_default_settings(kwargs):  # the default cell and the cells recipe's
    states, differ = _states_and_levels(kwargs, 3, 12)
    assert differ <= TIES_AT_MOST, f"{differ} of {states} states differ"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_levels_are_numpys_on_a_gpu():
    states, differ = _states_and_levels(CELLS["churn"], 4, 12, device="cuda")
    assert differ <= TIES_AT_MOST, f"{differ} of {states} states differ"


RETURN_CELLS = {"5 users": {"num_users": 5}, "9 users": {"num_users": 9},
                "12 slots, churn": {"num_users": 12, "users": "2-12", "churn": "0-0.1"},
                "short segments": {"num_users": 5, "segment_s": 0.5}}


def _rollout_inputs(kwargs: dict, fused: bool | None = None) -> tuple:
    """``(NumPy's expected returns, the torch expert, its start, cell and plans)``: 8 envs of ``kwargs`` 6 steps in,
    4 random plans each, on 8 scenarios of 5 rounds both roll out."""
    venv = envs.VREdgeVectorEnv(8, seed=5, max_steps=40, **kwargs)
    obs, _ = venv.reset()
    numpy_mpc, torch_mpc = BeliefMPC(venv.config, seed=5), TorchBeliefMPC(venv.config, seed=5, fused=fused)
    for _ in range(6):
        obs, *_ = venv.step(numpy_mpc(obs))
    numpy_mpc.filter.update(obs)
    futures = numpy_mpc.filter.futures(obs, 8, 5)
    plans = np.random.default_rng(0).integers(0, venv.config.num_levels, size=(8, 4, venv.config.num_users))
    want = numpy_mpc.expected_return(numpy_mpc_start(venv, obs), futures, plans)
    start = torch_mpc._start(obs)
    return want, torch_mpc, start, torch_mpc._cell(obs, futures, start), torch.as_tensor(plans)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "tensors"])
@pytest.mark.parametrize("cell", sorted(RETURN_CELLS))
def test_the_expected_returns_are_numpys_to_the_last_bit(cell, fused):
    want, torch_mpc, start, torch_cell, plans = _rollout_inputs(RETURN_CELLS[cell], fused)
    assert torch_mpc.fused == fused
    assert np.array_equal(torch_mpc.expected_return(start, torch_cell, plans).numpy(), want)


def test_low_buffers_after_the_first_round_are_played_on_short_segments():  # (so the test above plays them)
    want, torch_mpc, start, torch_cell, plans = _rollout_inputs(RETURN_CELLS["short segments"], fused=True)
    torch_mpc._low_buffer = 0.0  # a rollout that never reads a buffer as low (the first round's levels are given)
    assert not np.array_equal(torch_mpc.expected_return(start, torch_cell, plans).numpy(), want)


@pytest.mark.parametrize("threads", [2, 3])
def test_the_fused_returns_do_not_depend_on_the_threads(threads):  # (each thread writes its own envs)
    want, torch_mpc, start, torch_cell, plans = _rollout_inputs(RETURN_CELLS["12 slots, churn"], fused=True)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert np.array_equal(torch_mpc.expected_return(start, torch_cell, plans).numpy(), want)
    finally:
        torch.set_num_threads(before)


def _returns_in_a_child(inputs: tuple, queue: multiprocessing.Queue) -> None:
    _, torch_mpc, start, torch_cell, plans = inputs
    queue.put(torch_mpc.expected_return(start, torch_cell, plans).numpy())


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform")
def test_a_forked_child_runs_the_fused_rollout_after_its_parent():  # (the parent's threads are not the child's)
    inputs = _rollout_inputs(RETURN_CELLS["9 users"], fused=True)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _, torch_mpc, start, torch_cell, plans = inputs
        torch_mpc.expected_return(start, torch_cell, plans)  # the parent's threads start
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_returns_in_a_child, args=(inputs, queue))
        child.start()
        got = queue.get(timeout=60)
        child.join(10)
    finally:
        torch.set_num_threads(before)
        if child.is_alive():
            child.kill()
    assert np.array_equal(got, inputs[0])


def test_the_fused_rollout_is_refused_off_a_cpu_in_one_line():
    with pytest.raises(ConfigError, match="fused.*CPU") as e:
        TorchBeliefMPC(envs.VREdgeConfig(), device="meta", fused=True)
    assert "\n" not in str(e.value)
    assert not TorchBeliefMPC(envs.VREdgeConfig(), device="meta").fused  # (the default there: tensors)


def test_without_numba_the_default_labels_on_tensors_and_fused_is_refused(monkeypatch):
    import envs.belief_mpc_torch as module

    monkeypatch.setattr(module, "fused_rollout", lambda: None)  # (a node that carries no Numba)
    assert not TorchBeliefMPC(envs.VREdgeConfig()).fused
    with pytest.raises(ConfigError, match="fused.*[Nn]umba") as e:
        TorchBeliefMPC(envs.VREdgeConfig(), fused=True)
    assert "\n" not in str(e.value)


def numpy_mpc_start(venv: envs.VREdgeVectorEnv, obs: np.ndarray) -> dict:
    from envs.belief_mpc import state_from_observation
    return state_from_observation(venv.config, obs)


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 12, 15, 16, 17, 24, 31, 130, 300])
def test_sums_are_numpys_to_the_last_bit(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(2000, n)) * np.exp(4 * rng.normal(size=(2000, n)))  # magnitudes apart: order shows
    assert np.array_equal(numpy_order_sum(torch.as_tensor(x)).numpy(), x.sum(axis=-1))


@pytest.mark.parametrize("n", [1, 8, 12])
def test_running_sums_are_numpys_to_the_last_bit(n):  # (the one a GPU runs: its scan may add in another order)
    rng = np.random.default_rng(n)
    x = rng.normal(size=(2000, n)) * np.exp(4 * rng.normal(size=(2000, n)))
    assert np.array_equal(running_sum_in_order(torch.as_tensor(x)).numpy(), np.cumsum(x, axis=-1))


@pytest.mark.parametrize("kwargs", [{}, {"max_buffer_s": 3.3}, {"max_buffer_s": 7.1}])
def test_a_buffer_is_low_exactly_below_the_bound(kwargs):
    cfg = envs.VREdgeConfig(**kwargs)
    bound = low_buffer_bound(cfg)
    near = [np.nextafter(bound, 0.0), bound, np.nextafter(bound, np.inf)]
    buffers = np.concatenate([near, np.random.default_rng(0).uniform(0, cfg.max_buffer_s, 500)])
    assert [_low_as_read(cfg, float(b)) for b in buffers] == [bool(b < bound) for b in buffers]


def test_a_base_it_does_not_port_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="base='robust_mpc': is not ported to torch") as e:
        TorchBeliefMPC(envs.VREdgeConfig(), base="robust_mpc")
    assert "\n" not in str(e.value)
