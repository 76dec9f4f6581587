"""The torch BeliefMPC (envs.belief_mpc_torch): the NumPy BeliefMPC's levels on many states of a fixed and of a varying
cell with churn (several seeds, states deep into episodes and near their end), the same expected returns to the last
bit, NumPy's sums in NumPy's order, the low-buffer bound of fair_share's reading, and a base it does not port refused
in one line."""

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

CELLS = {"fixed": {"num_users": 6, "max_steps": 20},
         "churn": {"num_users": 8, "users": "2-8", "churn": "0-0.1", "max_steps": 20}}


def _states_and_levels(kwargs: dict, seed: int, steps: int, device: str = "cpu", **settings) -> tuple[int, int]:
    """``(states, states whose levels differ)`` over ``steps`` steps of 16 envs: both experts see the same
    observations, the envs played by random levels (buffers low and high, stalls, switches) then by NumPy's."""
    venv = envs.VREdgeVectorEnv(16, seed=seed, **kwargs)
    obs, _ = venv.reset()
    numpy_mpc = BeliefMPC(venv.config, seed=seed, **settings)
    torch_mpc = TorchBeliefMPC(venv.config, seed=seed, device=device, **settings)
    rng = np.random.default_rng(seed)
    states = differ = 0
    for step in range(steps):
        want, got = numpy_mpc(obs), torch_mpc(obs)
        assert got.dtype == np.int64 and got.shape == want.shape
        states, differ = states + len(obs), differ + int((want != got).any(axis=1).sum())
        random = rng.integers(0, venv.config.num_levels, size=want.shape)
        obs, *_ = venv.step(random if step % 3 == 0 else want)
    return states, differ


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("seed", [0, 1])
def test_the_levels_are_numpys_on_many_states(cell, seed):
    # 20-step episodes played 24 steps: autoresets, the last steps (horizon past the end) and a new episode
    states, differ = _states_and_levels(CELLS[cell], seed, 24, horizon=5, scenarios=4, sweeps=2)
    assert states == 384
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


def test_the_expected_returns_are_numpys_to_the_last_bit():
    venv = envs.VREdgeVectorEnv(8, seed=5, num_users=5, max_steps=40)
    obs, _ = venv.reset()
    numpy_mpc, torch_mpc = BeliefMPC(venv.config, seed=5), TorchBeliefMPC(venv.config, seed=5)
    for _ in range(6):
        obs, *_ = venv.step(numpy_mpc(obs))
    numpy_mpc.filter.update(obs)
    futures = numpy_mpc.filter.futures(obs, 8, 5)  # the scenarios both roll out
    plans = np.random.default_rng(0).integers(0, venv.config.num_levels, size=(8, 4, 5))
    want = numpy_mpc.expected_return(numpy_mpc_start(venv, obs), futures, plans)
    start = torch_mpc._start(obs)
    got = torch_mpc.expected_return(start, torch_mpc._cell(obs, futures, start), torch.as_tensor(plans))
    assert np.array_equal(got.numpy(), want)


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
