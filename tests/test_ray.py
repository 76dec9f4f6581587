import pytest
import torch

from collectors import RolloutCollector
from tests import factories as f
from trainer.model import ActorCritic

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="session")
def cluster():
    """One two-node Ray cluster on this host for all Ray tests: small CPUs and object stores."""
    from ray.cluster_utils import Cluster
    if ray.is_initialized():
        ray.shutdown()
    store = {"object_store_memory": 80 * 2**20}  # loopback only: see conftest.py
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False, **store})
    second = c.add_node(num_cpus=2, resources={"second_node": 1}, **store)
    ray.init(address=c.address, log_to_driver=False)
    yield c, second
    ray.shutdown()
    c.shutdown()


def vr_spaces():
    env = f.vr_edge()
    return env.observation_space, env.action_space


def batches(backend, policy_fn, rollouts=2, **kw):
    with RolloutCollector([f.vr_edge] * 4, policy_fn(), backend=backend, horizon=30, seed=3, **kw) as c:
        return [c.collect() for _ in range(rollouts)]


def test_sync_ray_matches_serial_for_a_deterministic_policy(cluster):
    policy = lambda: f.greedy_policy(*vr_spaces())  # noqa: E731
    serial = batches("serial", policy)
    remote = batches("ray", policy, num_workers=2, envs_per_worker=2, cpus_per_worker=0.25)
    assert any(a["final_observation_mask"].any() for a in serial)
    for a, b in zip(serial, remote):
        for k in ("observations", "actions", "rewards", "terminated", "truncated", "final_observations",
                  "final_observation_mask"):
            assert torch.equal(a[k], b[k]), k
        for k in ("log_probs", "values"):
            assert torch.allclose(a[k], b[k], atol=1e-5), k


def test_stochastic_ray_runs_are_reproducible(cluster):
    policy = lambda: ActorCritic(*vr_spaces(), seed=0)  # noqa: E731
    kw = dict(num_workers=2, envs_per_worker=2, cpus_per_worker=0.25)
    a, b = batches("ray", policy, **kw), batches("ray", policy, **kw)
    for x, y in zip(a, b):
        assert torch.equal(x["actions"], y["actions"]) and torch.equal(x["log_probs"], y["log_probs"])


def test_worker_pinned_to_the_second_node(cluster):
    _, second = cluster
    with RolloutCollector([f.vr_edge] * 2, ActorCritic(*vr_spaces()), backend="ray", num_workers=2, horizon=5,
                          cpus_per_worker=0.25, worker_options=[{}, {"resources": {"second_node": 0.5}}]) as c:
        c.collect()
        assert ray.get(c.backend.actors[1].node_id.remote()) == second.node_id


def test_killed_actor_is_replaced_and_the_rollout_retried(cluster, caplog):
    with RolloutCollector([f.vr_edge] * 4, ActorCritic(*vr_spaces()), backend="ray", num_workers=2, horizon=10,
                          cpus_per_worker=0.25) as c:
        c.collect()
        ray.kill(c.backend.actors[1])
        with caplog.at_level("WARNING", logger="collectors.ray"):
            batch = c.collect()
        assert batch.batch_size == torch.Size([10, 4])
        assert c.backend.restarts == 1 and "died" in c.backend.events[0]
        assert "replaced" in caplog.text
        assert c.collect().batch_size == torch.Size([10, 4])  # and it keeps going


def test_async_mode_returns_worker_slices_with_policy_versions(cluster):
    with RolloutCollector([f.vr_edge] * 4, ActorCritic(*vr_spaces()), backend="ray", num_workers=2, horizon=8,
                          cpus_per_worker=0.25, sync=False) as c:
        lags = []
        for _ in range(6):
            batch = c.collect()
            assert batch.batch_size == torch.Size([8, 2]) and "log_probs" in batch.keys()
            assert c.last_observations.shape[0] == 2
            lags.append(c.policy_version - c.batch_version)
        assert all(lag >= 0 for lag in lags) and max(lags) >= 1  # stale batches do occur


def test_bad_worker_layout_is_rejected(cluster):
    with pytest.raises(ValueError, match="must equal the number of env factories"):
        RolloutCollector([f.vr_edge] * 4, ActorCritic(*vr_spaces()), backend="ray", num_workers=3,
                         envs_per_worker=2)



@pytest.mark.parametrize("mode", [[], ["--ray-async", "true", "--max-lag", "1", "--scale-rewards", "true"]])
def test_training_on_ray_sync_and_async_then_resume(cluster, tmp_path, mode):
    import json

    import checkpoints
    from trainer.config import parse_args
    from trainer.train import train
    cli = parse_args(["--backend", "ray", "--num-workers", "2", "--cpus-per-worker", "0.25",
                      "--num-envs", "4", "--num-steps", "16", "--total-steps", "512", "--checkpoint-every", "2",
                      "--run-dir", str(tmp_path), *mode])
    summary = train(cli.config, progress=False, max_iterations=4)
    assert summary["iterations"] == 4
    saved = checkpoints.latest_loadable(tmp_path)[1]["collector"]
    assert len(saved["env_states"]) == 4 and all(s is not None for s in saved["env_states"])  # per env
    resumed = parse_args(["--resume", str(tmp_path)])
    summary = train(resumed.config, progress=False, resume=resumed.resume, given=resumed.given)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    last = rows[-1]["env_steps"]
    assert summary["env_steps"] == last and last == (512 if not mode else len(rows) * 2 * 16)
    if mode:
        assert all(r["policy_lag"] <= 1 for r in rows)
    else:
        assert summary["lags"] == {0: len(rows) - 4}
