"""The device backend's snapshot for exact resume (issue 63): its envs' states stay a few ``[N, ...]`` arrays (the
batched form of ``collectors.env_group.EnvStates``), whatever the number of envs; a resume from it is exact, and
one from the per-env form older versions wrote too."""

import functools
import shutil

import numpy as np
import pytest
import torch

import checkpoints
import envs
from collectors import DeviceCollector, RolloutCollector
from collectors.collector import merge_states, split_state
from collectors.env_group import (
    batched_env_states,
    env_state_count,
    env_states_of,
    joined_env_states,
    per_env_states,
)
from tests import factories as f
from tests.test_device_backend import _numbers, _trained
from trainer.config import TrainConfig
from trainer.ppo.algorithm import PPO
from trainer.run_files import resume_state
from trainer.run_layout import Machine, run_layout

ENV = {"num_users": 3, "max_steps": 12, "abandon_stall_s": 2.0}  # short episodes: both kinds of ends occur
T = 24


def collector(num_envs: int, seed: int = 5) -> DeviceCollector:
    space = envs.VREdgeVectorEnv(1, **ENV)
    policy = f.greedy_policy(space.single_observation_space, space.single_action_space)
    return DeviceCollector([functools.partial(envs.VREdgeTorchEnv, num_envs, **ENV)], policy, num_steps=T, seed=seed)


def leaves(x) -> int:
    """How many arrays, tensors and containers ``x`` holds (a snapshot's host objects)."""
    if isinstance(x, dict):
        return 1 + sum(leaves(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return 1 + sum(leaves(v) for v in x)
    return 1


def test_the_trainers_snapshot_holds_as_many_objects_at_any_number_of_envs():
    """What the loop takes after every iteration (``PPO.snapshot``) with the device backend: its size in objects does
    not grow with the envs (before issue 63 it held one dict of ~17 arrays per env), and its envs' states are one
    ``[N, ...]`` array per name."""
    counts = {}
    for n in (8, 64):
        cfg = TrainConfig(env="VREdge-v0", backend="device", num_envs=n, num_steps=8, device="cpu", compile="off",
                          total_steps=n * 8)
        layout = run_layout(cfg, Machine(cores=1))
        run = PPO.new(cfg, layout)
        with DeviceCollector(layout.env_factories(), run.acting, num_steps=8, seed=cfg.seed) as c:
            run.attach(c)
            run.iterate((0, 0.0))
            snapshot = run.snapshot()
        states = snapshot["collector"]["env_states"]
        assert isinstance(states, dict) and env_state_count(states) == n
        assert all(isinstance(v, np.ndarray) and v.shape[0] == n for v in states.values())
        counts[n] = leaves(snapshot)
    assert counts[8] == counts[64]


def test_a_state_is_taken_with_no_dict_per_env(monkeypatch):
    """Taking the state splits nothing per env (``per_env_states`` is what a restore into another backend uses)."""
    import collectors.env_group as env_group
    calls = []
    monkeypatch.setattr(env_group, "per_env_states", lambda states: calls.append(states) or [])
    with collector(16) as c:
        c.collect()
        state = c.get_state()
    assert calls == [] and isinstance(state["env_states"], dict)


def test_a_state_in_either_form_continues_exactly_and_moves_to_the_sync_backend():
    with collector(6) as c:
        c.collect()
        state = c.get_state()
        want = c.collect()
    older = {**state, "env_states": per_env_states(state["env_states"])}  # as versions before issue 63 kept it
    assert isinstance(older["env_states"], list) and len(older["env_states"]) == 6
    for saved in (state, older):
        with collector(6) as c:
            assert c.set_state(saved)
            got = c.collect()
        assert all(torch.equal(want.batch[k], got.batch[k]) for k in want.batch.keys())
        assert want.episodes == got.episodes
    space = envs.VREdgeVectorEnv(1, **ENV)
    with RolloutCollector([functools.partial(envs.VREdgeVectorEnv, 6, **ENV)],
                          f.greedy_policy(space.single_observation_space, space.single_action_space),
                          num_steps=T, seed=5) as c:
        assert c.set_state(state)  # batched: split once, for envs hosted in groups
        got = c.collect()
    assert torch.equal(torch.as_tensor(got.batch["rewards"]), want.batch["rewards"])


def test_by_global_env_index_either_form_splits_and_joins_back():
    """What torchrun ranks do (``split_state`` on resume, ``merge_states`` on a snapshot), in both forms."""
    with collector(8) as c:
        c.collect()
        state = c.get_state()
    parts = [split_state(state, slice(0, 3)), split_state(state, slice(3, 8))]
    assert [env_state_count(p["env_states"]) for p in parts] == [3, 5]
    merged = merge_states(parts)
    assert isinstance(merged["env_states"], dict)
    assert all(np.array_equal(merged["env_states"][k], v) for k, v in state["env_states"].items())
    # a part per env and a part batched (a run resumed from an older checkpoint): joined per env, same states
    mixed = joined_env_states([per_env_states(parts[0]["env_states"]), parts[1]["env_states"]])
    assert isinstance(mixed, list) and len(mixed) == 8
    rejoined = batched_env_states(mixed)
    assert all(np.array_equal(rejoined[k], v) for k, v in state["env_states"].items())
    assert env_states_of(mixed, slice(3, 8))[0]["t"] == state["env_states"]["t"][3]
    assert batched_env_states([None, *mixed[1:]]) is None  # an env without a state: no batched form


def test_a_state_of_other_envs_is_refused():
    with collector(4) as c:
        c.collect()
        state = c.get_state()
    with collector(6) as c, pytest.raises(ValueError, match="4 env states for 6 envs"):
        c.set_state({**state, "observations": np.zeros((6, *state["observations"].shape[1:]), np.float32)})


def test_a_device_run_resumes_exactly_from_a_checkpoint_in_either_form(tmp_path):
    """A device-backend run stopped after 2 iterations and resumed has the numbers of one that never stopped; so has
    the same run whose checkpoint holds its envs' states per env, as versions before issue 63 wrote them."""
    flags = ["--num-envs", "4", "--num-steps", "16", "--total-steps", "256", "--device", "cpu", "--seed", "5",
             "--compile", "off", "--backend", "device"]
    stopped, older, straight = tmp_path / "stopped", tmp_path / "older", tmp_path / "straight"
    _trained([*flags, "--run-dir", str(stopped)], max_iterations=2)
    shutil.copytree(stopped, older)
    path, saved, _ = checkpoints.latest_loadable(older)
    assert isinstance(saved["collector"]["env_states"], dict)  # batched in the file too
    saved["collector"]["env_states"] = per_env_states(saved["collector"]["env_states"])
    checkpoints.save(path, saved)
    for run_dir in (stopped, older):
        _trained(["--resume", str(run_dir)])
    _trained([*flags, "--run-dir", str(straight)])
    assert [r["iteration"] for r in _numbers(stopped)] == [1, 2, 3, 4]
    assert _numbers(stopped) == _numbers(straight) == _numbers(older)
    last = [checkpoints.latest_loadable(d)[1] for d in (stopped, older, straight)]
    assert all(torch.equal(a["model"][k], last[2]["model"][k]) for a in last[:2] for k in a["model"])


def test_a_checkpoint_whose_config_asks_for_other_envs_than_its_batched_states_hold_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    _trained(["--num-envs", "4", "--num-steps", "8", "--total-steps", "32", "--device", "cpu", "--compile", "off",
              "--backend", "device", "--run-dir", str(run_dir)])
    path, saved, _ = checkpoints.latest_loadable(run_dir)
    assert resume_state(str(run_dir), {})[0].num_envs == 4  # as saved: resumes
    saved["config"]["num_envs"] = 64
    checkpoints.save(path, saved)
    with pytest.raises(ValueError, match="num_envs=64 but its collector state holds 4 envs"):
        resume_state(str(run_dir), {})


@pytest.mark.slow  # two ranks started
def test_a_device_run_of_two_ranks_resumes_in_one_process_as_if_never_stopped(tmp_path):
    """Each rank's batched share joined by global env index in the checkpoint (``merge_states``), and a resume at
    another world size takes the run's envs whole."""
    from tests.test_data_parallel import RUN, alone, ranks
    device_run = {**RUN, "backend": "device"}
    straight = alone({**device_run, "run_dir": str(tmp_path / "straight")})
    run = {**device_run, "run_dir": str(tmp_path / "run")}
    ranks(2, run, max_iterations=2)
    saved = checkpoints.latest_loadable(run["run_dir"])[1]["collector"]["env_states"]
    assert isinstance(saved, dict) and env_state_count(saved) == RUN["num_envs"]
    weights = alone(run, resume=run["run_dir"])  # 2 ranks -> 1 process
    assert (weights - straight).abs().max().item() < 1e-5


def test_a_landed_run_of_per_env_states_goes_on_on_the_device_backend_as_on_sync(tmp_path):
    """A run directory an older version wrote (``tests/data/landed``: its checkpoints hold one state per env)
    resumed on the device backend has the numbers of the same run resumed on the sync backend it was started on."""
    from tests.test_landed_runs import landed
    numbers = {}
    for backend in ("sync", "device"):
        run_dir = landed("ppo-vredge", tmp_path / backend)
        assert isinstance(checkpoints.latest_loadable(run_dir)[1]["collector"]["env_states"], list)
        _trained(["--resume", str(run_dir), "--total-steps", "384", "--backend", backend, "--compile", "off"])
        numbers[backend] = _numbers(run_dir)
    assert [r["iteration"] for r in numbers["device"]] == [1, 2, 3, 4, 5, 6]
    assert numbers["device"] == numbers["sync"]
