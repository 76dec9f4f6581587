"""CartPole-v1 PPO as whole processes: this trainer (alternating and ``--overlap``) vs Stable-Baselines3.

    python -m benchmarks.cartpole_vs_sb3 --seeds 1 2 3 4 5

CleanRL's configuration: 8 envs x 128 steps, 4 epochs of 4 minibatches of 256, 200k steps,
linear LR annealing from 2.5e-4, gamma 0.99, lambda 0.95, clip 0.2, entropy 0.01, value
0.5, grad-norm 0.5, advantage normalisation, 64-64 tanh MLPs, no observation
normalisation, on the CPU (no value clipping: Stable-Baselines3 has no equivalent). Each
run is a fresh process timed from outside, imports and start-up included: that is what a
user waits for. Runs are interleaved by seed so that slow phases of a shared machine hit
every trainer alike. Each trained policy is evaluated greedily on 20 held-out episodes.
Stable-Baselines3 runs only when installed (``pip install stable-baselines3``).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym

from benchmarks.machine import print_machine
from trainer.evaluation import policy_actions, run_episodes, summarize
from trainer.evaluation.policies import trained_model

STEPS, ENVS, HORIZON, EPOCHS, MINIBATCH, LR = 200_000, 8, 128, 4, 256, 2.5e-4
OURS = ["--env", "CartPole-v1", "--num-envs", str(ENVS), "--num-steps", str(HORIZON), "--epochs", str(EPOCHS),
        "--minibatch-size", str(MINIBATCH), "--total-steps", str(STEPS), "--lr", str(LR), "--gamma", "0.99",
        "--gae-lambda", "0.95", "--ent-coef", "0.01", "--clip-coef", "0.2", "--max-grad-norm", "0.5",
        "--config", str(Path(__file__).with_name("cleanrl_cartpole.toml")), "--device", "cpu"]
VARIANTS = {"alternating": [], "overlap": ["--overlap", "true"]}


def _sb3_main(seed: int, out: str) -> None:
    """What the Stable-Baselines3 process runs: train with the same hyperparameters, save."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    venv = make_vec_env("CartPole-v1", n_envs=ENVS, seed=seed)
    model = PPO("MlpPolicy", venv, n_steps=HORIZON, batch_size=MINIBATCH, n_epochs=EPOCHS,
                learning_rate=lambda frac: LR * frac, gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.01,
                vf_coef=0.5, max_grad_norm=0.5, policy_kwargs={"net_arch": [64, 64]}, seed=seed, device="cpu",
                verbose=0)
    model.learn(STEPS)
    model.save(out)


def timed(argv: list[str]) -> float:
    """Wall-clock seconds of one fresh process."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *argv], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def ours(variant: str, seed: int, episodes: int, root: Path) -> tuple[float, float]:
    """(env steps per second of the whole process, mean greedy evaluation return)."""
    run_dir = root / f"{variant}-{seed}"
    seconds = timed(["-m", "trainer.train", *OURS, *VARIANTS[variant], "--seed", str(seed), "--run-dir", str(run_dir)])
    model, _, _ = trained_model(run_dir)
    act = policy_actions(model, deterministic=True)
    return STEPS / seconds, summarize(run_episodes(act, functools.partial(gym.make, "CartPole-v1"), episodes,
                                                   seed))["mean_return"]


def sb3(seed: int, episodes: int, root: Path) -> tuple[float, float]:
    out = root / f"sb3-{seed}.zip"
    seconds = timed(["-m", "benchmarks.cartpole_vs_sb3", "--sb3-process", str(seed), str(out)])
    from stable_baselines3 import PPO
    model = PPO.load(out, device="cpu")
    act = lambda obs: model.predict(obs, deterministic=True)[0]  # noqa: E731
    return STEPS / seconds, summarize(run_episodes(act, functools.partial(gym.make, "CartPole-v1"), episodes,
                                                   seed))["mean_return"]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cartpole_vs_sb3", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--variants", nargs="+", default=[*VARIANTS, "sb3"], choices=[*VARIANTS, "sb3"])
    p.add_argument("--sb3-process", nargs=2, metavar=("SEED", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sb3_process:
        _sb3_main(int(args.sb3_process[0]), args.sb3_process[1])
        return
    print_machine()
    variants = list(args.variants)
    if "sb3" in variants and importlib.util.find_spec("stable_baselines3") is None:
        print("stable-baselines3 is not installed: pip install stable-baselines3 to compare")
        variants.remove("sb3")
    rows: dict[str, list[tuple[int, float, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for v in variants:
                sps, ret = sb3(seed, args.episodes, Path(tmp)) if v == "sb3" else \
                    ours(v, seed, args.episodes, Path(tmp))
                rows[v].append((seed, sps, ret))
                print(f"{v} seed {seed}: {sps:,.0f} steps/s (whole process), eval return {ret:.1f}", flush=True)
    print("\n| trainer | seed | steps/s, whole process | greedy eval return |\n|---|---|---|---|")
    for v, rs in rows.items():
        for seed, sps, ret in rs:
            print(f"| {v} | {seed} | {sps:,.0f} | {ret:.1f} |")
    med = {v: statistics.median(r[1] for r in rs) for v, rs in rows.items()}
    print()
    for v, rs in rows.items():
        spread = f"{min(r[1] for r in rs):,.0f}-{max(r[1] for r in rs):,.0f}"
        print(f"{v}: median {med[v]:,.0f} steps/s ({spread}); {sum(r[2] >= 475 for r in rs)}/{len(rs)} seeds "
              f"with eval return >= 475")
    for a, b in (("overlap", "alternating"), ("overlap", "sb3"), ("alternating", "sb3")):
        if a in med and b in med:
            paired = [x[1] / y[1] for x, y in zip(rows[a], rows[b])]
            print(f"{a} / {b}: {med[a] / med[b]:.2f}x (per seed {min(paired):.2f}-{max(paired):.2f}x)")


if __name__ == "__main__":
    main()
