"""The Ape-X tier's measured targets (docs/benchmarks.md, "Ape-X").

    python -m benchmarks.apex cartpole --seeds 1 2 3 4 5      # greedy return over seeds, local mode (async)
    python -m benchmarks.apex cartpole --backend sync --threads 2 --deterministic-algorithms   # other settings
    python -m benchmarks.apex ingestion --actors 1 2 4         # replay ingestion and learner updates on a local Ray
    python -m benchmarks.apex vr-edge --seconds 300            # Ape-X vs PPO at equal wall clock, and the baselines

Every training run is a fresh ``python -m trainer.train`` process timed from outside (imports and start-up
included). ``vr-edge`` stops both trainers with SIGTERM after the same wall clock (the trainer saves the last
completed iteration) and plays both greedy policies and the baselines on the same held-out episodes, paired.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym

import envs
from benchmarks.machine import print_machine
from collectors.resources import usable_cores
from trainer.evaluation import paired_difference, policy_actions, run_episodes, summarize
from trainer.evaluation.policies import trained_model

# docs/apex.md's Ape-X CartPole command (tests/test_apex.py trains with it too); n = 5 and lr 1e-3 annealed: with the
# target network copied every 500 learner steps, values spread only n steps per copy, and n = 3 left some seeds
# on a ~150 plateau (the cart drifting off) for most of the run (docs/benchmarks.md, "Ape-X")
CARTPOLE = ["--algo", "apex", "--env", "CartPole-v1", "--num-envs", "8", "--num-steps", "16", "--total-steps", "400000",
            "--gamma", "0.99", "--lr", "1e-3", "--n-step", "5", "--max-grad-norm", "10", "--learning-starts", "1000"]
CARTPOLE_VALIDATION = ["--eval-every", "125", "--eval-episodes", "8"]  # a best checkpoint every 16k steps
# Ape-X's VR-edge defaults: 16 x 16 steps, lr 5e-4 constant (measured before --anneal-lr applied to Ape-X)
VR_APEX = ["--algo", "apex", "--env", "VREdge-v0", "--checkpoint-every", "50", "--device", "cpu"]
VR_PPO = ["--env", "VREdge-v0", "--checkpoint-every", "10", "--device", "cpu"]


# trainer.train with torch.use_deterministic_algorithms(True): one of the float paths a result must survive
DETERMINISTIC_TRAIN = ("import sys, torch; torch.use_deterministic_algorithms(True); "
                       "from trainer.train import main; main(sys.argv[1:])")


def _train(args: list[str], run_dir: Path, seconds: float | None = None, deterministic: bool = False) -> float:
    """Run ``trainer.train`` in a fresh process (stopped with SIGTERM after ``seconds``); its wall clock."""
    entry = ["-c", DETERMINISTIC_TRAIN] if deterministic else ["-m", "trainer.train"]
    cmd = [sys.executable, *entry, *args, "--run-dir", str(run_dir)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the trainer saves the last completed iteration and exits 143
        _, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 128 + signal.SIGTERM):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
    return wall


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def greedy_return(run_dir: Path, pick: str, episodes: int) -> float:
    """Mean greedy return of a run's ``pick`` checkpoint on ``episodes`` held-out CartPole episodes."""
    model, _, _ = trained_model(run_dir, pick)
    records = run_episodes(policy_actions(model, True), functools.partial(gym.make, "CartPole-v1"), episodes, seed=0)
    return summarize(records)["mean_return"]


def cartpole(seeds: list[int], episodes: int, backend: str, threads: int, deterministic: bool) -> None:
    extra = ["--backend", backend, "--threads", str(threads), "--checkpoint-every", "1000", "--device", "cpu"]
    print(f"{' '.join(CARTPOLE + CARTPOLE_VALIDATION + extra)}{' (deterministic algorithms)' if deterministic else ''}"
          f"; greedy return over "
          f"{episodes} held-out episodes of the final network and of the best --eval-every checkpoint")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            run_dir = Path(tmp) / f"s{seed}"
            wall = _train(CARTPOLE + CARTPOLE_VALIDATION + extra + ["--seed", str(seed)], run_dir,
                          deterministic=deterministic)
            final, best = greedy_return(run_dir, "latest", episodes), greedy_return(run_dir, "best", episodes)
            results.append((final, best, wall))
            print(f"seed {seed}: final {final:.1f}, best {best:.1f}; {wall:.0f} s wall clock "
                  f"({_rows(run_dir)[-1]['learner_steps']:,} learner steps)", flush=True)
    for name, k in (("final network", 0), ("best checkpoint", 1)):
        values = [r[k] for r in results]
        print(f"{name}: >= 475 on {sum(v >= 475 for v in values)}/{len(values)} seeds; median "
              f"{statistics.median(values):.1f} [{min(values):.1f} - {max(values):.1f}]")
    walls = [r[2] for r in results]
    print(f"wall clock (with validation): median {statistics.median(walls):.0f} s "
          f"[{min(walls):.0f} - {max(walls):.0f}]")


def ingestion(actors: list[int], steps: int, replay_ratio: float) -> None:
    cores = usable_cores()
    print(f"local Ray on {cores} cores (more actors than cores share them); CartPole, 4 envs x 32 steps per actor "
          f"chunk, replay ratio {replay_ratio:g}, {steps:,} env steps per run")
    with tempfile.TemporaryDirectory() as tmp:
        for n in actors:
            run_dir, settings = Path(tmp) / f"a{n}", Path(tmp) / f"a{n}.toml"
            settings.write_text(f"cpus_per_worker = {min(1.0, cores / n)!r}\n")  # more actors than cores share them
            args = ["--algo", "apex", "--env", "CartPole-v1", "--backend", "ray", "--num-envs", str(4 * n),
                    "--num-workers", str(n), "--config", str(settings), "--num-steps", "32",
                    "--total-steps", str(steps), "--gamma", "0.99",
                    "--replay-ratio", str(replay_ratio), "--learning-starts", "1000", "--threads", "1",
                    "--checkpoint-every", "100000", "--device", "cpu"]
            wall = _train(args, run_dir)
            rows = _rows(run_dir)
            first, last = rows[len(rows) // 5], rows[-1]  # the first fifth: start-up and learning_starts
            # sps is measured from the loop's start: the time between two rows is the difference of env_steps / sps
            t = last["env_steps"] / last["sps"] - first["env_steps"] / first["sps"]
            inserted = (last["env_steps"] - first["env_steps"]) / t
            updates = (last["learner_steps"] - first["learner_steps"]) / t
            lags = sorted(r["policy_lag"] for r in rows[len(rows) // 5:])
            print(f"{n} actor(s): {inserted:,.0f} transitions/s into the replay, {updates:,.0f} learner updates/s "
                  f"({updates * 128:,.0f} sampled transitions/s), policy lag median {lags[len(lags) // 2]} learner "
                  f"steps; process {wall:.0f} s", flush=True)


def vr_edge(seconds: float, episodes: int, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"apex": Path(tmp) / "apex", "ppo": Path(tmp) / "ppo"}
        walls = {"apex": _train(VR_APEX + ["--seed", str(seed), "--total-steps", "100000000"], runs["apex"], seconds),
                 "ppo": _train(VR_PPO + ["--seed", str(seed), "--total-steps", "100000000"], runs["ppo"], seconds)}
        env_fn = functools.partial(gym.make, "VREdge-v0")
        config = envs.VREdgeConfig()
        played = {}
        for name, run_dir in runs.items():
            model, _, _ = trained_model(run_dir, "latest")
            played[name] = run_episodes(policy_actions(model, True), env_fn, episodes, seed=0)
            last = _rows(run_dir)[-1]
            print(f"{name}: {walls[name]:.0f} s wall clock, {last['env_steps']:,} env steps"
                  + (f", {last['learner_steps']:,} learner steps" if "learner_steps" in last else ""))
        for name in envs.BASELINES:
            played[name] = run_episodes(envs.make_baseline(name, config), env_fn, episodes, seed=0)
    print(f"\nreward per step over {episodes} held-out episodes (mean ± 95% CI):")
    for name, records in played.items():
        s = summarize(records)
        print(f"  {name:<14}{s['reward_per_step']:+.4f} ± {s['reward_per_step_ci95']:.4f}")
    print("\nApe-X minus each, paired over the same episodes (mean ± 95% CI, Ape-X better in):")
    for name in played:
        if name != "apex":
            d = paired_difference(played["apex"], played[name])
            print(f"  vs {name:<14}{d['mean']:+.4f} ± {d['ci95']:.4f}   {d['wins']}/{d['episodes']}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.apex", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    # no dest: a missing benchmark is named by its choices ("required: {cartpole,...}"), not by a variable
    sub = p.add_subparsers(required=True)
    c = sub.add_parser("cartpole")
    c.set_defaults(what="cartpole")
    c.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    c.add_argument("--episodes", type=int, default=20)
    c.add_argument("--backend", default="async", choices=("sync", "async"))
    c.add_argument("--threads", type=int, default=1, help="torch threads of the trainer (0: from the run layout)")
    c.add_argument("--deterministic-algorithms", action="store_true",
                   help="train with torch.use_deterministic_algorithms(True)")
    i = sub.add_parser("ingestion")
    i.set_defaults(what="ingestion")
    i.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    i.add_argument("--steps", type=int, default=100_000)
    i.add_argument("--replay-ratio", type=float, default=1.0)
    v = sub.add_parser("vr-edge")
    v.set_defaults(what="vr-edge")
    v.add_argument("--seconds", type=float, default=300)
    v.add_argument("--episodes", type=int, default=50)
    v.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    print_machine()
    if args.what == "cartpole":
        cartpole(args.seeds, args.episodes, args.backend, args.threads, args.deterministic_algorithms)
    elif args.what == "ingestion":
        ingestion(args.actors, args.steps, args.replay_ratio)
    else:
        vr_edge(args.seconds, args.episodes, args.seed)


if __name__ == "__main__":
    main()
