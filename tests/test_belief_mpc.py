"""The causal reference (envs.belief_mpc.BeliefMPC): its rollout is the env's rounds, its rollout never lowers the base
plan's expected return, it counts active users, its settings are checked, and filter_episodes shows
it every env at every step."""

import functools

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.belief import Futures
from envs.belief_mpc import BeliefMPC, BeliefMPCSettings, state_from_observation
from envs.settings import ConfigError
from envs.vr_edge import step_state
from trainer.evaluation import filter_episodes, run_episodes


def _true_future(venv: envs.VREdgeVectorEnv, horizon: int, base) -> tuple[Futures, np.ndarray]:
    """The env's own next ``horizon`` rounds as a single scenario of weight 1, and the rewards it pays the ``base``
    policy over them, summed (from a copy of its state: the env itself does not move)."""
    state = venv.get_state()
    rounds, total = [], np.zeros(venv.num_envs)
    for _ in range(horizon):
        actions = base(envs.vr_edge.observe(venv.config, state))
        state, reward, *_, parts = step_state(venv.config, state, actions)
        rounds.append((parts["capacity_mbps"], state["channel_logit"], state["regime"], state["fade"]))
        total += reward
    capacity, logit, regime, fade = (np.stack(x, axis=1)[:, None] for x in zip(*rounds))
    return Futures(capacity, logit, regime, fade, np.ones((venv.num_envs, 1))), total


@pytest.mark.parametrize("kwargs", [{}, {"num_users": 4, "users": "2-3"}, {"reveal_hidden_state": True}])
def test_the_rollout_of_a_known_future_is_the_env(kwargs):
    venv = envs.VREdgeVectorEnv(3, seed=2, **{"num_users": 3, "max_steps": 50, **kwargs})
    obs, _ = venv.reset()
    base = envs.make_baseline("fair_share", venv.config)
    for _ in range(7):  # a few steps in: buffers, levels and stalls of their own
        obs, *_ = venv.step(base(obs))
    futures, paid = _true_future(venv, 4, base)
    mpc = BeliefMPC(venv.config, horizon=4)
    value = mpc.expected_return(state_from_observation(venv.config, obs), futures, base(obs)[:, None])
    np.testing.assert_allclose(value[:, 0], paid, atol=1e-4)  # (float32 observations)


def test_the_rollout_never_lowers_the_base_plans_expected_return():
    venv = envs.VREdgeVectorEnv(4, seed=5, num_users=4, max_steps=60)
    obs, _ = venv.reset()
    base = envs.make_baseline("fair_share", venv.config)
    mpc = BeliefMPC(venv.config, horizon=3, scenarios=8)
    for _ in range(5):
        mpc.filter.update(obs)
        futures = mpc.filter.futures(obs, 8, 3)
        start = state_from_observation(venv.config, obs)
        plan = base(obs)
        improved = mpc._improved(start, futures, plan.copy())
        before, after = (mpc.expected_return(start, futures, p[:, None])[:, 0] for p in (plan, improved))
        assert (after >= before - 1e-12).all()
        obs, *_ = venv.step(improved)
    assert (improved != plan).any()  # it does change plans (the check above is not vacuous)


def test_it_beats_a_weak_base_policy_it_improves():
    # a base that always plays the top level stalls; one user at a time the rollout finds lower levels
    cfg = envs.VREdgeConfig(num_users=3, max_steps=30)
    env_fn = functools.partial(gym.make, "VREdge-v0", num_users=3, max_steps=30)
    top = lambda obs: np.full((len(obs), 3), cfg.num_levels - 1)  # noqa: E731
    mpc = BeliefMPC(cfg, base=top, horizon=3, scenarios=4)
    rollout = filter_episodes(mpc, env_fn, 4, 0, num_envs=4)
    plain = run_episodes(top, env_fn, 4, 0)
    assert all(r["reward_per_step"] > p["reward_per_step"] + 0.1 for r, p in zip(rollout, plain))


def test_inactive_slots_play_level_0_and_count_for_nothing():
    venv = envs.VREdgeVectorEnv(4, seed=1, num_users=5, users="2-3", churn=0.05, max_steps=40)
    obs, _ = venv.reset()
    mpc = BeliefMPC(venv.config, horizon=2, scenarios=4)
    for _ in range(10):
        actions = mpc(obs)
        active = venv.get_state()["active"]
        assert (actions[~active] == 0).all() and (actions[active] > 0).any()
        obs, *_ = venv.step(actions)
    start = state_from_observation(venv.config, obs)
    mpc.filter.update(obs)
    futures = mpc.filter.futures(obs, 4, 2)
    plan = mpc.base(obs)
    moved = plan.copy()
    moved[~start["active"]] = venv.config.num_levels - 1  # an inactive slot's level changes nothing
    np.testing.assert_array_equal(mpc.expected_return(start, futures, plan[:, None]),
                                  mpc.expected_return(start, futures, moved[:, None]))


@pytest.mark.parametrize("kwargs", [{"horizon": 0}, {"scenarios": 1}, {"sweeps": 2.5}, {"horizon": "4"}])
def test_a_bad_setting_is_one_line(kwargs):
    with pytest.raises(ConfigError) as e:
        BeliefMPC(envs.VREdgeConfig(num_users=2), **kwargs)
    assert "\n" not in str(e.value) and next(iter(kwargs)) in str(e.value)


def test_settings_are_declared_with_help_and_limits():
    from dataclasses import fields

    from envs.settings import help_of, limits_of
    for f in fields(BeliefMPCSettings):
        assert help_of(f) and (limits_of(f).at_least is not None)


def test_filter_episodes_shows_every_env_at_every_step():
    seen = []

    def act(obs):
        seen.append(len(obs))
        return np.zeros((len(obs), 2), dtype=np.int64)

    env_fn = functools.partial(gym.make, "VREdge-v0", num_users=2, max_steps=5)
    records = filter_episodes(act, env_fn, 5, 0, num_envs=3)
    assert len(records) == 5 and set(seen) == {3}
    seen.clear()
    run_episodes(act, env_fn, 5, 0, num_envs=3)
    assert min(seen) < 3  # without it, idle envs are left out
    with pytest.raises(ValueError, match="batched"):
        filter_episodes(act, functools.partial(gym.make, "CartPole-v1"), 1, 0)


# ---------------------------------------------------------------- trainer.evaluate --reference belief

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny VR-edge run: 3 users, episodes of 20 steps."""
    from trainer.flags import parse_args
    from trainer.train import train

    run = tmp_path_factory.mktemp("belief") / "run"
    train(parse_args(["--env", "VREdge-v0", "--env-kwargs", "num_users=3,max_steps=20", "--num-envs", "2",
                      "--num-steps", "8", "--total-steps", "16", "--threads", "1", "--run-dir", str(run)]).config,
          progress=False)
    return run


def test_evaluate_plays_the_causal_ceiling_paired_and_reports_capture_and_causal_share(tiny_run, capsys):
    import json

    from trainer import evaluate as evaluate_cli
    from trainer.evaluation import gap_closed, policy_actions, summarize
    from trainer.evaluation.policies import trained_model

    evaluate_cli.main(["--checkpoint", str(tiny_run), "--episodes", "3", "--baselines", "buffer",
                       "--reference", "clairvoyant,belief", "--json"])
    out, table = capsys.readouterr()
    payload = json.loads(out)
    cfg = envs.VREdgeConfig(num_users=3, max_steps=20)
    env_fn = functools.partial(gym.make, "VREdge-v0", num_users=3, max_steps=20)
    belief = filter_episodes(BeliefMPC(cfg), env_fn, 3, 0, num_envs=64)  # what it should have played
    fair = run_episodes(envs.make_baseline("fair_share", cfg), env_fn, 3, 0)
    policy = run_episodes(policy_actions(trained_model(tiny_run, "best")[0], True), env_fn, 3, 0)
    clairvoyant = payload["reference"]["clairvoyant"]
    assert payload["reference"]["belief"] == summarize(belief) and set(payload["baselines"]) == {"buffer"}
    paired = payload["paired_reward_per_step"]["belief"]["mean"]
    assert paired == pytest.approx(summarize(policy)["reward_per_step"] - summarize(belief)["reward_per_step"])
    capture, causal = gap_closed(policy, fair, belief), payload["causal_share"]
    assert payload["capture"]["fraction"] == pytest.approx(capture["fraction"], nan_ok=True)
    assert payload["capture"]["ceiling_tight"] == (paired <= 0)
    lead = summarize(belief)["reward_per_step"] - summarize(fair)["reward_per_step"]
    if causal["fraction"] is not None:
        clairvoyant_lead = clairvoyant["reward_per_step"] - summarize(fair)["reward_per_step"]
        assert causal["fraction"] == pytest.approx(lead / clairvoyant_lead)
    assert "capture" in table and "causal share" in table and "belief" in table


def test_a_ceiling_the_policy_beats_is_said_to_be_no_ceiling():
    from trainer.evaluation.contenders import capture_figures
    from trainer.evaluation.report import format_capture

    episodes = lambda *scores: [{"reward_per_step": s} for s in scores]  # noqa: E731
    played = {"policy": episodes(0.80, 0.82, 0.79), "fair_share": episodes(0.70, 0.71, 0.70),
              "belief": episodes(0.75, 0.76, 0.74), "clairvoyant": episodes(0.85, 0.86, 0.84)}
    capture, causal = capture_figures(played, "policy")
    assert capture["fraction"] > 1 and not capture["ceiling_tight"]
    assert causal["fraction"] == pytest.approx((0.75 - 0.7033333) / (0.85 - 0.7033333), rel=1e-4)
    said = format_capture(capture, causal)
    assert "not tight" in said and "the policy reaches" not in said
    played["belief"] = episodes(0.90, 0.91, 0.90)
    capture, _ = capture_figures(played, "policy")
    assert capture["ceiling_tight"] and 0 < capture["fraction"] < 1
    assert "not tight" not in format_capture(capture, None)


@pytest.mark.parametrize("reference, things", [("bleief", ["bleief", "belief"]), ("clairvoyant,x", ["x"])])
def test_an_unknown_reference_is_one_line_before_anything_loads(reference, things, capsys, tmp_path):
    from tests.messages import exits
    from trainer import evaluate as evaluate_cli

    with exits(2, "--reference", *things, capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(tmp_path / "none"), "--reference", reference])


def test_the_causal_ceiling_refuses_a_trace_driven_cell_in_one_line(tiny_run, capsys, tmp_path):
    from tests.messages import exits
    from trainer import evaluate as evaluate_cli

    trace = tmp_path / "t.log"
    trace.write_text("\n".join(f"{i} {50 + i % 7}" for i in range(40)))
    with exits(2, "--reference", "belief", "capacity_trace", capsys=capsys):
        evaluate_cli.main(["--checkpoint", str(tiny_run), "--reference", "belief", "--capacity-trace", str(trace),
                           "--episodes", "1"])


def test_the_ceiling_on_the_policy_improves_on_the_policy_itself(tiny_run, capsys):
    import json

    from trainer import evaluate as evaluate_cli
    from trainer.evaluation import policy_actions, summarize
    from trainer.evaluation.policies import trained_model

    evaluate_cli.main(["--checkpoint", str(tiny_run), "--episodes", "2", "--baselines", "none", "--reference",
                       "belief", "--belief-base", "policy", "--json"])
    payload = json.loads(capsys.readouterr().out)
    cfg = envs.VREdgeConfig(num_users=3, max_steps=20)
    env_fn = functools.partial(gym.make, "VREdge-v0", num_users=3, max_steps=20)
    act = policy_actions(trained_model(tiny_run, "best")[0], True)
    direct = filter_episodes(BeliefMPC(cfg, base=act), env_fn, 2, 0, num_envs=64)
    assert payload["belief_base"] == "policy" and payload["reference"]["belief"] == summarize(direct)
    assert payload["paired_reward_per_step"]["belief"]["mean"] < 0  # the rollout improves on its base: the policy
    assert payload["capture"]["ceiling_tight"]
