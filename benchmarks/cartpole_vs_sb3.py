"""Learning bar on CartPole-v1: this trainer vs Stable-Baselines3 PPO, same hyperparameters, same run.

    python -m benchmarks.cartpole_vs_sb3 --seeds 1 2 3 4 5 --sb3-seeds 1

8 envs x 128 steps, 4 epochs, minibatches of 64, 200k steps, linear LR annealing from
3e-4, gamma 0.99, lambda 0.95, clip 0.2, entropy 0.01, value 0.5, grad-norm 0.5,
64-64 tanh MLPs, no observation normalisation, on the CPU. Each trained policy is
evaluated greedily on 20 held-out episodes. Stable-Baselines3 runs only when installed.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import multiprocessing
import statistics
import tempfile
import time

import gymnasium as gym
import numpy as np

from benchmarks.machine import print_machine
from trainer.config import parse_config
from trainer.evaluate import load_policy, policy_actions
from trainer.evaluation import run_episodes, summarize
from trainer.train import train

STEPS, ENVS, HORIZON, EPOCHS, MINIBATCH, LR = 200_000, 8, 128, 4, 64, 3e-4


def ours(seed: int, episodes: int) -> tuple[float, float]:
    """(wall-clock SPS of the whole run, mean greedy evaluation return)."""
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = parse_config(["--env", "CartPole-v1", "--num-envs", str(ENVS), "--num-steps", str(HORIZON),
                            "--epochs", str(EPOCHS), "--batch-size", str(MINIBATCH), "--total-steps", str(STEPS),
                            "--lr", str(LR), "--gamma", "0.99", "--gae-lambda", "0.95", "--ent-coef", "0.01",
                            "--clip-coef", "0.2", "--vf-coef", "0.5", "--max-grad-norm", "0.5",
                            "--normalize-obs", "false", "--device", "cpu", "--seed", str(seed),
                            "--run-dir", run_dir])
        start = time.perf_counter()
        summary = train(cfg, progress=False)
        sps = summary["env_steps"] / (time.perf_counter() - start)
        model, _, _ = load_policy(summary["checkpoint"])
    act = policy_actions(model, deterministic=True)
    return sps, summarize(run_episodes(act, functools.partial(gym.make, "CartPole-v1"), episodes, seed))["mean_return"]


def sb3(seed: int, episodes: int) -> tuple[float, float]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    venv = make_vec_env("CartPole-v1", n_envs=ENVS, seed=seed)
    model = PPO("MlpPolicy", venv, n_steps=HORIZON, batch_size=MINIBATCH, n_epochs=EPOCHS,
                learning_rate=lambda frac: LR * frac, gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.01,
                vf_coef=0.5, max_grad_norm=0.5, policy_kwargs={"net_arch": [64, 64]}, seed=seed, device="cpu",
                verbose=0)
    start = time.perf_counter()
    model.learn(STEPS)
    sps = STEPS / (time.perf_counter() - start)
    act = lambda obs: model.predict(obs, deterministic=True)[0]  # noqa: E731
    return sps, summarize(run_episodes(act, functools.partial(gym.make, "CartPole-v1"), episodes, seed))["mean_return"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--sb3-seeds", type=int, nargs="*", default=[1], help="seeds for SB3 (its SPS is the yardstick)")
    p.add_argument("--episodes", type=int, default=20)
    args = p.parse_args()
    print_machine()
    if importlib.util.find_spec("stable_baselines3") is None:
        print("stable-baselines3 is not installed: pip install stable-baselines3 to compare")
        args.sb3_seeds = []
    # interleaved (ours, SB3, ours, SB3, ...) so that slow phases of a shared machine hit both alike
    jobs = [("parallel-rollouts", ours, s) for s in args.seeds]
    for i, seed in enumerate(args.sb3_seeds):
        jobs.insert(2 * i + 1, ("stable-baselines3", sb3, seed))
    rows = []
    # each run in a fresh interpreter: neither trainer pays for the other's imports (SB3 loads
    # ~1,000 more modules, and every garbage collection then has more objects to walk)
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        for name, run, seed in jobs:
            rows.append((name, seed, *pool.apply(run, (seed, args.episodes))))
            print(f"{name} seed {seed}: {rows[-1][2]:,.0f} SPS, eval return {rows[-1][3]:.1f}", flush=True)
    print("\n| trainer | seed | SPS | greedy eval return |\n|---|---|---|---|")
    for name, seed, sps, ret in rows:
        print(f"| {name} | {seed} | {sps:,.0f} | {ret:.1f} |")
    ours_rows = [r for r in rows if r[0] == "parallel-rollouts"]
    passed = sum(r[3] >= 475 for r in ours_rows)
    print(f"\nparallel-rollouts: {passed}/{len(ours_rows)} seeds with eval return >= 475")
    sb3_rows = [r for r in rows if r[0] == "stable-baselines3"]
    if sb3_rows:
        ratio = statistics.median(r[2] for r in ours_rows) / statistics.median(r[2] for r in sb3_rows)
        print(f"SPS ratio (median ours / median SB3): {ratio:.2f}x")
    print(f"eval returns: {np.round([r[3] for r in ours_rows], 1).tolist()}")


if __name__ == "__main__":
    main()
