"""Device check: what a GPU machine has to show, as one report, within a time budget (8 minutes on one H200).

    bash benchmarks/device_check.sh                        # every part, cut at 480 s (an offline node: docs/device.md)
    python -m benchmarks.device_check                      # the same, without the shell's hard timeout
    python -m benchmarks.device_check --parts whole --budget 1800   # the whole runs alone, with time for them
    python -m benchmarks.device_check --quick              # tiny sizes on the CPU: what CI runs

The parts run in this order; each has a share of ``--budget`` and is cut (its reason recorded) where the budget
would be exceeded, so that a short window measures the first things first:

1. ``tests``: the CUDA-marked tests (``pytest -m cuda``): passed or not (the evidence ``--cuda-graphs`` needs to
   become a CUDA learner's default).
2. ``profile``: where one training iteration's time goes, for the GPU defaults (``--device cuda``: ``--backend
   device``, 4,096 envs) and for the cell recipe (``docs/cells.toml`` with ``--device cuda``): env stepping,
   acting, the snapshot kept for exact resume, GAE, the PPO update (also with TF32 matmuls, under bf16 autocast and,
   on CUDA, captured as CUDA graphs), each synchronised; and the distillation expert's labels per second.
3. ``scale``: training env steps/s with the GPU defaults at 65,536 envs, and at 65,536 and 4,096 envs with
   ``--cuda-graphs true``: with and without, side by side.
4. ``whole``: ``make train ARGS="--device cuda"`` and the cell recipe as a user runs them (``python -m
   trainer.train``: training, distillation rounds, the quality line), wall time included; each is skipped where the
   profile's estimate of its time exceeds what is left, and stopped where it runs past it.
5. The older comparisons, while time is left: ``copies`` (host-to-device copies per rollout), ``resume`` (N +
   resume + N == 2N iterations, deterministic), ``update`` (PPO update samples/s by batch, compiled, graphed),
   ``env`` (raw env steps/s up to 65,536 envs), ``backends`` (end-to-end by backend), ``precision`` (learning with
   TF32 matmuls and bf16 autocast against float32, paired over seeds) and ``torchrun`` (data-parallel ranks).

Without CUDA, ``tests`` and the CUDA-only variants are skipped with the reason; the rest runs on the CPU so that its
code stays tested. The text is printed as it goes (a line at least every 30 s); one JSON report, rewritten after
each part, goes to ``--json`` (default ``$OUT/device_check.json``, ``/tmp`` without ``OUT``). Exits 1 when a test,
a check (copies, resume), a whole run or a measurement failed; a part cut by the budget is not a failure, and is
listed as cut.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import io
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.profiler import ProfilerActivity, profile

import checkpoints
import envs
from benchmarks.env_steps import rates as raw_rates
from benchmarks.machine import machine_info
from benchmarks.revisions import steady_rate
from collectors import Rollout, RolloutCollector, make_collector
from trainer import train as train_module
from trainer.config import TrainConfig
from trainer.interrupts import Interrupted
from trainer.ppo.algorithm import PPO
from trainer.ppo.distillation import expert_device, expert_labels
from trainer.ppo.model import ActorCritic
from trainer.ppo.targets import advantages_and_returns
from trainer.ppo.update import LearnerSamples, minibatch_generator, ppo_update
from trainer.run_layout import Machine, RunLayout, run_layout


@dataclass(frozen=True)
class Sizes:
    """How big each part runs: the full check, or ``--quick`` (CI, the CPU)."""

    budget_s: float = 460.0  # the whole check; benchmarks/device_check.sh's hard timeout is 480 s
    recipe_args: tuple[str, ...] = ()  # (2), (4): flags after the recipe's own (--quick: tiny runs)
    profile_repeats: int = 3  # (2): timed rounds of each phase after one warm-up iteration; medians
    label_episodes: int = 8  # (2): episodes the expert labels (full length)
    label_kwargs: tuple[tuple[str, Any], ...] = ()  # (2): env arguments over the recipe's for the labels
    many_envs: int = 65_536  # (3)
    few_envs: int = 4096  # (3): the GPU defaults'
    iterations: int = 3  # (3), (5 backends): the first one is warm-up and not timed
    # (5): the older comparisons
    envs: tuple[int, ...] = (64, 1024)  # backends: the default config's num_envs, and 1024
    num_steps: int = 128
    workers: tuple[int, ...] = (1, 4, 8, 15)  # backends: async workers
    update_batches: tuple[tuple[int, int], ...] = ((64, 128), (1024, 128))  # update: envs x steps
    resume_envs: int = 64  # resume
    resume_iterations: int = 2  # resume: N
    raw_envs: tuple[int, ...] = (4096, 16384, 65536)  # env
    raw_steps: int = 20  # env: steps per round, 3 rounds
    compile: bool = True  # update, env: also compiled (the loss; the torch env)
    precision_seeds: tuple[int, ...] = (1, 2, 3)  # precision: paired runs
    precision_iterations: int = 12  # precision: of the GPU defaults' batch; the last third is scored
    ranks_envs: int = 4096  # torchrun: envs per rank


REPO = Path(__file__).resolve().parent.parent
CELL_RECIPE = REPO / "docs" / "cells.toml"  # users varying, churn, a set policy
TINY_RUN = ("--backend", "device", "--num-envs", "8", "--num-steps", "16", "--total-steps", "256", "--compile", "off",
            "--eval-episodes", "2")
QUICK = Sizes(budget_s=3600.0, recipe_args=TINY_RUN, profile_repeats=1, label_episodes=1,
              label_kwargs=(("max_steps", 8),), many_envs=32, few_envs=8, iterations=2, envs=(8,), num_steps=16,
              workers=(1, 2), update_batches=((8, 16),), resume_envs=4, resume_iterations=1, raw_envs=(64,),
              raw_steps=3, compile=False, precision_seeds=(1,), precision_iterations=3, ranks_envs=16)

# the recipes a user runs on a GPU (docs/device.md): flags of python -m trainer.train before --device
RECIPES = {"gpu_defaults": ("make train ARGS=\"--device cuda\"", ()),
           "cell_recipe": ("the cell recipe (docs/cells.toml)", ("--config", str(CELL_RECIPE)))}

# what share of the budget each part may take at most (what is left over goes on to the next); (4) and (5) take
# what is left
SHARES = {"tests": 0.35, "profile": 0.22, "scale": 0.15}
RESERVE_S = 10.0  # kept back for the report
HEARTBEAT_S = 20.0  # a line at least this often, so that a silent minute is never a hang in disguise
CUDA_TESTS_TIMEOUT_S = 300  # torchrun ranks: a hung run is reported (one line) and the check goes on
PRECISIONS = ("fp32", "tf32", "bf16")
NO_CUDA = "CUDA is not available here"
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------------------------
# The phases of one iteration. Every phase is timed through one adapter below, and nothing else in this file knows
# where its code lives: where a phase moves (the snapshot kept for exact resume, GAE, the expert's labels), repoint
# its adapter here.

def phase_collect(collector: Any) -> Rollout:
    """One rollout, as the trainer's pipeline takes it."""
    return collector.collect()


def phase_env(collector: Any, actions: torch.Tensor) -> None:
    """The env alone: ``actions`` (``[T, N, ...]``, a rollout's) stepped through the collector's torch env."""
    with torch.no_grad():
        for action in actions:
            collector.env.step(action)


def phase_acting(collector: Any, observations: torch.Tensor) -> None:
    """Acting alone: the collector's own acting step (compiled where the run compiles it) on each of a rollout's
    ``[T, N, ...]`` observations."""
    with torch.no_grad():
        for t, obs in enumerate(observations):
            collector._act(obs, t)  # the device collector's step: the policy, its keys, its output checks


def phase_snapshot(run: PPO) -> dict[str, Any]:
    """The state a checkpoint holds (on the CPU): model, optimiser, RNG, every env's state."""
    return run.snapshot()


def phase_gae(run: PPO, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE targets of a rollout, as ``PPO.learn`` computes them: ``(advantages, returns)``."""
    return advantages_and_returns(run.model, rollout.batch, rollout.next_observations, run.cfg.gamma,
                                  run.ppo.gae_lambda)


def phase_update(run: PPO, samples: LearnerSamples, iteration: int, step: Any = None) -> None:
    """The PPO epochs over ``samples`` with the run's minibatch step (or ``step``: another build of it)."""
    ppo_update(step or run.step, samples, minibatch_generator(run.cfg.seed, iteration, run.device))


def phase_labels(run: PPO, env_kwargs: dict[str, Any], episodes: int) -> int:
    """The distillation expert's labels on ``episodes`` episodes the run's policy plays, as a round labels them
    (a frozen CPU copy of the policy, as ``trainer.ppo.distillation.distill_run`` loads it, the expert's rollout on
    the learner's device); returns the states labelled."""
    from trainer.evaluation.policies import policy_from_state

    model, _ = policy_from_state(run.snapshot(), Path("the profiled run"))
    return len(expert_labels(model, run.cfg.env, env_kwargs, episodes, seed=0,
                             device=expert_device(str(run.device))).observations)


# ---------------------------------------------------------------------------------------------------------------

def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued kernels (CUDA), so that a timing holds the work it started."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(device: torch.device | str, fn: Callable[[], T]) -> tuple[float, T]:
    """``(seconds, fn())``, synchronised before and after on CUDA."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - start, out


@contextlib.contextmanager
def learner_precision(name: str, device: torch.device | str) -> Iterator[None]:
    """The learner's matmuls as ``name`` runs them: ``fp32`` (as today), ``tf32`` (TF32 tensor cores for float32
    matmuls, as ``torch.set_float32_matmul_precision("high")`` sets them) or ``bf16`` (``torch.autocast`` to
    bfloat16). Measured here, on nothing by default: each must first keep learning unchanged (``precision``)."""
    if name not in PRECISIONS:
        raise ValueError(f"precision {name!r}: choose one of {', '.join(PRECISIONS)}")
    if name == "bf16":
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            yield
        return
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    if name == "tf32":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def recipe_config(recipe: str, device: str, extra: Sequence[str] = ()) -> TrainConfig:
    """The config ``python -m trainer.train`` makes of a recipe (:data:`RECIPES`) with ``--device device`` and
    ``extra`` flags after it."""
    return train_module.parse_args([*RECIPES[recipe][1], "--device", device, *extra]).config


def machine_layout(cfg: TrainConfig) -> RunLayout:
    """The run layout the trainer computes for ``cfg`` on this machine."""
    return run_layout(cfg, Machine.detect(cfg.backend, cfg.ray_address, cfg.device))


def profile_recipe(cfg: TrainConfig, sizes: Sizes, cuda: bool, say: Callable[[str], None]) -> dict[str, Any]:
    """Per-phase seconds (medians of ``sizes.profile_repeats`` rounds after one warm-up iteration) of one training
    iteration of ``cfg`` with the trainer's own objects, the update under each :data:`PRECISIONS` (and, on CUDA,
    captured), and the expert's labels per second."""
    layout = machine_layout(cfg)
    build_s, run = timed(cfg.device, lambda: PPO.new(cfg, layout))
    out: dict[str, Any] = {"num_envs": cfg.num_envs, "num_steps": cfg.num_steps, "backend": cfg.backend,
                           "compile": layout.compile, "cuda_graphs": layout.cuda_graphs,
                           "iterations_of_the_whole_run": layout.iterations(cfg)}
    with make_collector(layout.env_factories(), run.acting, backend=cfg.backend, num_steps=cfg.num_steps,
                        seed=layout.collector_seed(cfg.seed), **layout.collector_kwargs(),
                        **run.collector_options()) as collector:
        run.attach(collector)
        # the first iteration compiles (acting, env step, loss) and captures: the start-up a whole run pays once
        warm_s, _ = timed(run.device, lambda: run.iterate(start=(0, time.perf_counter())))
        out["start_s"] = build_s + warm_s
        say(f"    start-up (build, first iteration: compiling) {out['start_s']:.1f} s")
        rounds: dict[str, list[float]] = {}
        for r in range(sizes.profile_repeats):
            seconds, samples = profile_round(run, collector, r)
            for k, v in seconds.items():
                rounds.setdefault(k, []).append(v)
        out["phases_s"] = {k: statistics.median(v) for k, v in rounds.items() if v}
        steps = cfg.num_envs * cfg.num_steps
        out["env_steps_per_s"] = steps / out["phases_s"]["iteration"]
        say("    per iteration (s): " + ", ".join(f"{k} {v:.4f}" for k, v in out["phases_s"].items())
            + f"; {out['env_steps_per_s']:,.0f} env steps/s")
        out["update_errors"] = {}
        out["update_samples_per_s"] = update_variants(run, samples, cfg, layout, cuda, say, out["update_errors"])
    episodes, kwargs = sizes.label_episodes, {**cfg.env_options, **dict(sizes.label_kwargs)}
    try:
        seconds, states = timed("cpu", lambda: phase_labels(run, kwargs, episodes))
    except Exception as e:  # noqa: BLE001 (the phases above are kept; the error is the labels' finding)
        out["labels"] = {"episodes": episodes, "error": error_line(e)}
        return out
    out["labels"] = {"episodes": episodes, "states": states, "seconds": seconds, "per_s": states / seconds}
    say(f"    distillation labels: {states:,} states of {episodes} episode(s) in {seconds:.1f} s, "
        f"{states / seconds:,.0f} per s")
    return out


def profile_round(run: PPO, collector: Any, r: int) -> tuple[dict[str, float], LearnerSamples]:
    """One round of the profile: seconds of a whole iteration (``PPO.iterate``), then of each phase alone (the env
    and acting where they run on the device); and the samples its update took."""
    device, out = run.device, {}
    out["iteration"], _ = timed(device, lambda: run.iterate(start=(0, time.perf_counter())))
    out["collect"], rollout = timed(device, lambda: phase_collect(collector))
    if run.cfg.backend == "device":  # the env and the policy on the device: each alone
        out["env"], _ = timed(device, lambda: phase_env(collector, rollout.batch["actions"]))
        out["acting"], _ = timed(device, lambda: phase_acting(collector, rollout.batch["observations"]))
    out["gae"], (adv, ret) = timed(device, lambda: phase_gae(run, rollout))
    samples = LearnerSamples.from_rollout(rollout.batch, adv, ret)
    out["update"], _ = timed(device, lambda: phase_update(run, samples, r))
    out["snapshot"], _ = timed(device, lambda: phase_snapshot(run))
    return out, samples


def update_variants(run: PPO, samples: LearnerSamples, cfg: TrainConfig, layout: RunLayout, cuda: bool,
                    say: Callable[[str], None], errors: dict[str, str]) -> dict[str, float]:
    """Samples/s of the update as the run makes it, under each :data:`PRECISIONS`, and (CUDA) captured as CUDA
    graphs where the run does not capture it already (a second build of the run, ``--cuda-graphs true``); a variant
    that raises is left out, its error in ``errors``."""
    epochs = run.settings.epochs
    rates: dict[str, float] = {}
    steps = {name: None for name in PRECISIONS}
    if cuda and not layout.cuda_graphs:
        graphed = cfg.replaced(cuda_graphs=True)
        steps["cuda_graphs"] = PPO.new(graphed, machine_layout(graphed)).step
    for name, step in steps.items():
        try:
            with learner_precision(name if name in PRECISIONS else "fp32", run.device):
                phase_update(run, samples, 0, step)  # warm-up: autocast's or the capture's first call
                seconds, _ = timed(run.device, functools.partial(phase_update, run, samples, 1, step))
        except Exception as e:  # noqa: BLE001 (one variant that fails is the finding: the others are still measured)
            errors[name] = error_line(e)
            continue
        rates[name] = epochs * samples.advantages.numel() / seconds
    say("    update, samples/s: " + ", ".join([*(f"{k} {v:,.0f}" for k, v in rates.items()),
                                               *(f"{k} FAILED" for k in errors)]))
    return rates


def error_line(e: BaseException) -> str:
    """An exception in one line: its type, its message's first line, and where it was raised."""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    message = next((line for line in str(e).splitlines() if line.strip()), "")[:300]
    return f"{type(e).__name__}: {message}" + (f" ({Path(where.filename).name}:{where.lineno})" if where else "")


def count_h2d_copies(num_envs: int = 64, num_steps: int = 128, backend: str = "sync",
                     compile: bool | str = False) -> int:
    """Number of host-to-device memcpy kernels during one ``collect()`` on CUDA (``backend``: sync or device;
    ``compile``: the device backend's acting step compiled, or a ``torch.compile`` mode)."""
    probe = envs.SyntheticVREdgeEnv()
    policy = ActorCritic(probe.observation_space, probe.action_space)
    if backend == "device":
        env_fn = functools.partial(envs.VREdgeTorchEnv, num_envs, compile=compile)
        policy, options = policy.to("cuda"), {"compile_policy": compile}
    else:
        env_fn, options = functools.partial(envs.VREdgeVectorEnv, num_envs), {}
    with make_collector([env_fn], policy, backend=backend, num_steps=num_steps, seed=0, device="cuda", **options) as c:
        c.collect()  # warm-up: allocation, pinned storage
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            c.collect()
            torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "HtoD" in e.name)


def _train(cfg: TrainConfig, **kw) -> dict:
    """``trainer.loop.train`` quietly (its layout lines and warnings would interleave with the report)."""
    with contextlib.redirect_stderr(io.StringIO()):
        return train_module.train(cfg, progress=False, **kw)


def training_rate(cfg: TrainConfig, iterations: int) -> tuple[float, dict]:
    """Env steps/s of ``iterations`` training iterations after the first, and the run's layout."""
    _train(cfg, max_iterations=iterations)
    rows = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    layout = json.loads((Path(cfg.run_dir) / "config.json").read_text())["layout"]
    first, last = rows[0], rows[-1]
    if len(rows) == 1:
        return last["sps"], layout
    # rows carry steps/s since the start; recover the times to leave the first (warm-up) iteration out
    elapsed = last["env_steps"] / last["sps"] - first["env_steps"] / first["sps"]
    return (last["env_steps"] - first["env_steps"]) / elapsed, layout


def update_rate(device: str, num_envs: int, num_steps: int, epochs: int = 4, compile: str = "off",
                cuda_graphs: bool = False) -> float:
    """Samples/s of one PPO update (``epochs`` passes) on a real VR-edge rollout of ``num_envs x num_steps``, with
    the trainer's own learner (``compile="on"``: the loss compiled, as ``--compile`` runs it; ``cuda_graphs``:
    each minibatch step replayed as a CUDA graph, as ``--cuda-graphs`` runs it)."""
    cfg = TrainConfig.from_dict(dict(num_envs=num_envs, num_steps=num_steps, device=device, compile=compile,
                                     epochs=epochs, target_kl=0.0, cuda_graphs=cuda_graphs))
    run = PPO.new(cfg, run_layout(cfg, Machine.detect()))  # model, fused Adam, plan, minibatch step
    fn = functools.partial(envs.VREdgeVectorEnv, num_envs)
    with RolloutCollector([fn], run.acting, backend="sync", num_steps=num_steps, seed=0, device=device) as c:
        rollout = c.collect()
    adv, ret = advantages_and_returns(run.model, rollout.batch, rollout.next_observations, cfg.gamma,
                                      cfg.algo_settings.gae_lambda)
    samples = LearnerSamples.from_rollout(rollout.batch, adv, ret)
    phase_update(run, samples, 1)  # warm-up: kernels, allocator, compiling, capturing
    seconds, _ = timed(device, lambda: phase_update(run, samples, 2))
    return epochs * rollout.numel() / seconds


def update_rates(devices: list[str], num_envs: int, num_steps: int, **kw) -> list[float]:
    """:func:`update_rate` on each of ``devices``, side by side."""
    return [update_rate(d, num_envs, num_steps, **kw) for d in devices]


def resume_matches(device: str, num_envs: int, n: int, num_steps: int, root: Path, backend: str = "sync",
                   cuda_graphs: bool = False) -> bool:
    """Whether N iterations + resume + N iterations give the same weights, bit for bit, as 2N in one go
    (``cuda_graphs``: the update captured, and captured anew after the resume; acting eagerly, so that this
    checks the captured update alone)."""
    cfg = TrainConfig.from_dict(dict(num_envs=num_envs, num_steps=num_steps, total_steps=2 * n * num_envs * num_steps,
                                     device=device, checkpoint_every=1, backend=backend, cuda_graphs=cuda_graphs,
                                     compile="off" if cuda_graphs else "auto"))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # a kernel without a deterministic variant warns
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _train(replace(cfg, run_dir=str(root / "straight")))
            _train(replace(cfg, run_dir=str(root / "split")), max_iterations=n)
            _train(cfg, resume=str(root / "split"))
    finally:
        torch.use_deterministic_algorithms(before)
    for w in {str(w.message) for w in caught if "deterministic" in str(w.message)}:
        print(f"    note: {w}")
    a, b = (checkpoints.latest_loadable(root / d)[1]["model"] for d in ("straight", "split"))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def learning_score(cfg: TrainConfig, precision: str, iterations: int) -> float:
    """Mean reward per env step over the last third of ``iterations`` training iterations of ``cfg``, its updates
    under ``precision`` (:func:`learner_precision`; collecting as always): paired over seeds, a precision that
    keeps learning unchanged scores as float32 does."""
    layout = machine_layout(cfg)
    run = PPO.new(cfg, layout)
    scored: list[float] = []
    with make_collector(layout.env_factories(), run.acting, backend=cfg.backend, num_steps=cfg.num_steps,
                        seed=layout.collector_seed(cfg.seed), **layout.collector_kwargs(),
                        **run.collector_options()) as collector:
        for it in range(1, iterations + 1):
            rollout = collector.collect()
            lr = cfg.lr * (1 - (it - 1) / iterations) if cfg.anneal_lr else cfg.lr
            with learner_precision(precision, run.device):
                run.learn(rollout, it, lr)
            collector.update_policy(run.model.state_dict())
            if it > iterations - max(1, iterations // 3):
                scored.append(float(rollout.batch["rewards"].double().mean()))
    return statistics.fmean(scored)


def torchrun_rate(ranks: int, device: str, per_rank: int, num_steps: int, iterations: int, compile: str,
                  run_dir: Path) -> float:
    """Env steps/s (after the first iteration) of VR-edge trained by ``ranks`` torchrun ranks, ``per_rank`` envs
    each, with the GPU defaults on ``device``."""
    envs_ = per_rank * ranks
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                    "-m", "trainer.train", "--env", "VREdge-v0", "--device", device, "--num-envs", str(envs_),
                    "--num-steps", str(num_steps), "--total-steps", str(envs_ * num_steps * iterations),
                    "--compile", compile, "--run-dir", str(run_dir)],
                   check=True, capture_output=True, text=True, timeout=CUDA_TESTS_TIMEOUT_S,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return steady_rate(run_dir / "metrics.jsonl")


def cuda_test_files(tests: Path) -> list[Path]:
    """The test files that mark a test (or all of theirs) ``cuda``."""
    return sorted(f for f in tests.glob("test_*.py") if re.search(r"mark\.cuda\b", f.read_text()))


def run_cuda_tests(files: Sequence[Path], timeout_s: float) -> dict[str, Any]:
    """``pytest -m cuda`` on ``files`` in one process: ``passed`` (``None`` where it ran out of ``timeout_s``), its
    summary line, and its last lines where it did not pass."""
    # without the ini's options (-n 2): a GPU node's image may have pytest, not pytest-xdist; only the files that hold
    # CUDA tests, as it may lack what the others import (optuna, wandb)
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-m", "cuda", "-q", "-p", "no:cacheprovider",
               *map(str, files)]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"passed": None, "summary": f"ran past {timeout_s:.0f} s and was stopped",
                "tail": text.strip().splitlines()[-25:]}
    lines = (run.stdout + run.stderr).strip().splitlines()
    summary = lines[-1] if lines else f"exit status {run.returncode}, nothing printed"
    return {"passed": run.returncode == 0, "exit_status": run.returncode, "summary": summary,
            "tail": [] if run.returncode == 0 else lines[-25:]}


# ---------------------------------------------------------------------------------------------- the whole runs

SAID = ("run directory", "distilling", "distilled", "checkpoint", "quality")  # what trainer.train says at the end


def whole_run(argv: Sequence[str], run_dir: Path, deadline_s: float, say: Callable[[str], None]) -> dict[str, Any]:
    """``python -m trainer.train argv --run-dir run_dir`` as a user runs it, in a process of its own: its wall time,
    exit status and end lines (:data:`SAID`); stopped (SIGTERM: it saves and ends) where it runs past
    ``deadline_s``, with the progress it had made. A line every :data:`HEARTBEAT_S` seconds while it runs."""
    command = [sys.executable, "-m", "trainer.train", *argv, "--run-dir", str(run_dir)]
    log = run_dir.with_suffix(".log")
    start, cut = time.perf_counter(), False
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        try:
            while True:
                try:
                    proc.wait(timeout=min(HEARTBEAT_S, max(deadline_s - (time.perf_counter() - start), 0.1)))
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.perf_counter() - start
                    if elapsed >= deadline_s:
                        cut = True
                        proc.terminate()  # the trainer saves the iteration under way and ends
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            proc.wait(timeout=30)  # (past that, killed below)
                        break
                    say(f"    ... {elapsed:.0f} s, {run_progress(run_dir)}")
        finally:
            if proc.poll() is None:  # stopped itself (Ctrl-C, the budget's timeout): its run goes with it
                proc.kill()
                proc.wait()
    wall = time.perf_counter() - start
    lines = log.read_text(errors="replace").splitlines()
    ends = {label: [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(label + ":")] for label in SAID}
    out: dict[str, Any] = {"command": " ".join(["python", "-m", "trainer.train", *argv]), "wall_s": wall,
                           "exit_status": proc.returncode, "progress": run_progress(run_dir),
                           "quality": (ends["quality"] or [None])[-1], "distilled": ends["distilled"],
                           "checkpoint": (ends["checkpoint"] or [None])[-1]}
    if cut:
        out["cut"] = f"stopped at the budget's end ({deadline_s:.0f} s), {out['progress']}"
    if proc.returncode and not cut:
        out["tail"] = lines[-20:]
    return out


def run_progress(run_dir: Path) -> str:
    """How far a run is, from its files: iterations and env steps of its metrics against its total."""
    try:
        rows = (run_dir / "metrics.jsonl").read_text().splitlines()
        total = json.loads((run_dir / "config.json").read_text())["config"]["total_steps"]
        done = json.loads(rows[-1])["env_steps"] if rows else 0
    except (OSError, ValueError, KeyError, IndexError):
        return "starting (no iteration completed yet)"
    return f"{len(rows)} iterations, {done:,} of {total:,} env steps"


def whole_estimate(profiled: dict[str, Any] | None, cfg: TrainConfig) -> float | None:
    """Seconds a whole run of ``cfg`` should take, from its profile: start-up, its iterations, the distillation
    rounds it asks for (labels at the profiled rate, plus as long again for validation and fine-tuning), and the
    quality line; ``None`` where it was not profiled (or its labels failed)."""
    if not profiled or "per_s" not in profiled.get("labels", {}):
        return None
    from trainer.ppo.distillation import rounds_asked

    episodes, rounds = rounds_asked(cfg.to_dict())
    steps = int(cfg.env_options.get("max_steps", 300))
    distill = 2 * rounds * episodes * steps / profiled["labels"]["per_s"] if episodes else 0.0
    return profiled["start_s"] + profiled["iterations_of_the_whole_run"] * profiled["phases_s"]["iteration"] \
        + distill + 20.0


# ---------------------------------------------------------------------------------------------- the check

PARTS = ("tests", "profile", "scale", "whole", "copies", "resume", "update", "env", "backends", "precision",
         "torchrun")
TITLES = {
    "tests": "(1) the CUDA-marked tests (pytest -m cuda)",
    "profile": "(2) per-phase profile of one training iteration: the GPU defaults and the cell recipe",
    "scale": "(3) training env steps/s at 65,536 envs, and with and without --cuda-graphs",
    "whole": "(4) the whole runs as a user runs them: training, distillation, the quality line",
    "copies": "(5) host-to-device copies per rollout (sync: must be 1; device: must be 0)",
    "resume": "(5) N + resume + N == 2N iterations, deterministic algorithms",
    "update": "(5) PPO update, samples/s (4 epochs)",
    "env": "(5) raw VR-edge steps/s, the NumPy env on the CPU vs the torch env",
    "backends": "(5) end-to-end VR-edge training by backend, env steps/s",
    "precision": "(5) learning with TF32 matmuls and bf16 autocast in the update, against float32, paired by seed",
    "torchrun": "(5) data-parallel training under torchrun, env steps/s by ranks",
}


@dataclass
class Check:
    """The parts of the device check (:data:`PARTS`), each printing its section and filling its entry of
    ``report["parts"]``, within ``sizes.budget_s`` seconds (or ``budget_s``).

    Example (a part past a budget of 1 s is cut, and listed; ``--quick`` runs them all at tiny sizes):
        >>> import contextlib, io
        >>> check = Check(QUICK, cuda=False, report_path=Path(tempfile.mkdtemp()) / "r.json", budget_s=1)
        >>> with contextlib.redirect_stdout(io.StringIO()):
        ...     check.run(["env"], Path(tempfile.mkdtemp()))
        >>> check.report["parts"]["env"]["status"], check.report["cut"]
        ('cut', ['env: the whole part: the budget is spent'])
        >>> json.loads(check.report_path.read_text())["parts"]["env"]["status"]
        'cut'
    """

    sizes: Sizes
    cuda: bool
    report_path: Path
    quick: bool = False
    budget_s: float | None = None
    failures: list[str] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.budget_s = self.budget_s or self.sizes.budget_s
        self.started = time.perf_counter()
        self.last_said = self.started
        self.part_deadline = float("inf")
        self.report = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": machine_info(), "quick": self.quick, "cuda": self.cuda, "budget_s": self.budget_s,
                       "parts": {}, "cut": [], "failures": self.failures}

    @property
    def device(self) -> str:
        return "cuda" if self.cuda else "cpu"

    @property
    def devices(self) -> list[str]:
        return ["cuda", "cpu"] if self.cuda else ["cpu"]

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.last_said = time.perf_counter()

    def left(self) -> float:
        """Seconds left of the budget, less what the report keeps back."""
        return self.budget_s - (time.perf_counter() - self.started) - RESERVE_S

    def in_time(self, what: str, part: str) -> bool:
        """Whether the part may start ``what`` (its share of the budget, and the budget, are not spent); where not,
        ``what`` is recorded as cut, with the reason."""
        now = time.perf_counter()
        if now < self.part_deadline and self.left() > 0:
            return True
        reason = "the budget is spent" if self.left() <= 0 else "the part's share of the budget is spent"
        self.cut(part, what, reason)
        return False

    def cut(self, part: str, what: str, reason: str) -> None:
        self.report["cut"].append(f"{part}: {what}: {reason}")
        self.say(f"    {what}: cut ({reason})")

    def attempt(self, label: str, run: Callable[[], T]) -> T | None:
        """``run()``; an exception is reported (its type, message and where it was raised) and counted as a
        failure, and the check goes on: one broken variant must not cost the rest of a short GPU window."""
        try:
            return run()
        except Exception as e:  # noqa: BLE001 (reported, counted, and the other parts still run)
            message = next((line for line in str(e).splitlines() if line.strip()), "")[:300]
            self.say(f"    {label}: FAILED: {error_line(e)}")
            root_cause = e
            while root_cause.__cause__ is not None:
                root_cause = root_cause.__cause__
            if root_cause is not e:  # what a wrapping error's first line leaves out (a compiler's own words)
                for line in [x for x in str(root_cause).splitlines() if x.strip()][:4]:
                    self.say(f"        {line.strip()[:300]}")
            self.failures.append(f"{label} raised {type(e).__name__}: {message}")
            return None

    def write_report(self) -> None:
        """The JSON report as it stands, written whole (a copy renamed into place)."""
        self.report["elapsed_s"] = round(time.perf_counter() - self.started, 1)
        self.report_path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.report_path.with_name(self.report_path.name + ".partial")
        partial.write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        partial.replace(self.report_path)

    def run(self, parts: Sequence[str], root: Path) -> None:
        """Each part of ``parts`` in turn, its time after it, the report rewritten after each."""
        with self._heartbeat():
            for part in parts:
                self.say(f"\n{TITLES[part]} [{part}]")
                entry = self.report["parts"].setdefault(part, {})
                if self.left() <= 0:
                    self.cut(part, "the whole part", "the budget is spent")
                    entry.update(status="cut", seconds=0.0)
                    self.write_report()
                    continue
                share = SHARES.get(part)
                self.part_deadline = time.perf_counter() + (min(share * self.budget_s, self.left()) if share
                                                            else self.left())
                start, failed = time.perf_counter(), len(self.failures)
                self.attempt(f"({part})", functools.partial(getattr(self, f"part_{part}"), root / part, entry))
                entry["seconds"] = round(time.perf_counter() - start, 1)
                entry.setdefault("status", "failed" if len(self.failures) > failed else "done")
                self.say(f"    ({part}: {entry['seconds']:.0f} s)")
                self.write_report()
        self.part_deadline = float("inf")

    @contextlib.contextmanager
    def _heartbeat(self) -> Iterator[None]:
        """A line whenever the check has said nothing for :data:`HEARTBEAT_S` seconds (compiling, a long test)."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(1.0):
                if time.perf_counter() - self.last_said >= HEARTBEAT_S:
                    self.say(f"    ... {time.perf_counter() - self.started:.0f} s into the check")

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    # ---------------------------------------------------------------------------------------------- (1)-(4)
    def part_tests(self, root: Path, entry: dict) -> None:
        if not self.cuda:
            entry.update(status="skipped", passed=None, reason=NO_CUDA)
            self.say(f"    skipped: {NO_CUDA}")
            return
        files = cuda_test_files(REPO / "tests")
        entry["files"] = [f.name for f in files]
        entry.update(run_cuda_tests(files, max(self.part_deadline - time.perf_counter(), 1.0)))
        for line in entry["tail"] or [entry["summary"]]:
            self.say(f"    {line}")
        if entry["passed"] is None:
            entry["status"] = "cut"
            self.report["cut"].append(f"tests: {entry['summary']}")
        elif not entry["passed"]:
            self.failures.append("(tests) the CUDA-marked tests failed")
        verdict = {True: "passed", False: "FAILED", None: "not all run"}[entry["passed"]]
        self.say(f"    the CUDA tests: {verdict}")

    def recipe_flags(self) -> tuple[str, ...]:
        """The flags after ``--device``: none on a GPU (the recipe as a user runs it); the tiny run's with
        ``--quick``, and the device backend's on a CPU (which takes no GPU defaults)."""
        if self.quick:
            return self.sizes.recipe_args
        return () if self.cuda else ("--backend", "device", "--num-envs", str(self.sizes.few_envs))

    def part_profile(self, root: Path, entry: dict) -> None:
        for recipe, (name, _) in RECIPES.items():
            if not self.in_time(f"the profile of {name}", "profile"):
                continue
            cfg = recipe_config(recipe, self.device, self.recipe_flags())
            self.say(f"  {name}: {cfg.num_envs:,} envs x {cfg.num_steps} steps, --backend {cfg.backend}")
            profiled = self.attempt(f"(profile) {recipe}", functools.partial(
                profile_recipe, cfg, self.sizes, self.cuda, self.say))
            if profiled:
                entry[recipe] = profiled
                errors = {f"update {k}": v for k, v in profiled["update_errors"].items()}
                if "error" in profiled["labels"]:
                    errors["labels"] = profiled["labels"]["error"]
                for what, error in errors.items():
                    self.say(f"    (profile) {recipe} {what}: FAILED: {error}")
                    self.failures.append(f"(profile) {recipe} {what} raised {error.split(':')[0]}")

    def part_scale(self, root: Path, entry: dict) -> None:
        rows: dict[str, Any] = entry.setdefault("env_steps_per_s", {})
        variants = [(self.sizes.many_envs, False), *(((self.sizes.many_envs, True), (self.sizes.few_envs, True),
                                                      (self.sizes.few_envs, False)) if self.cuda else ())]
        if not self.cuda:
            self.say(f"    --cuda-graphs: skipped ({NO_CUDA})")
        for n, graphs in variants:
            name = f"{n} envs{' --cuda-graphs true' if graphs else ''}"
            if not self.in_time(name, "scale"):
                continue
            extra = ("--num-envs", str(n), "--cuda-graphs", "true") if graphs else ("--num-envs", str(n))
            cfg = recipe_config("gpu_defaults", self.device, (*self.recipe_flags(), *extra)).replaced(
                total_steps=10**12, run_dir=str(root / name.replace(" ", "_")))
            rate = self.attempt(f"(scale) {name}", functools.partial(training_rate, cfg, self.sizes.iterations))
            if rate:
                rows.setdefault(str(n), {})["with_cuda_graphs" if graphs else "without_cuda_graphs"] = rate[0]
                self.say(f"    {name}: {rate[0]:,.0f} env steps/s (iterations 2-{self.sizes.iterations})")

    def part_whole(self, root: Path, entry: dict) -> None:
        root.mkdir(parents=True, exist_ok=True)
        profiled = self.report["parts"].get("profile", {})
        for recipe, (name, _) in RECIPES.items():
            argv = [*RECIPES[recipe][1], "--device", self.device, *self.recipe_flags()]
            estimate = whole_estimate(profiled.get(recipe), recipe_config(recipe, self.device, self.recipe_flags()))
            left = self.left()
            if estimate is not None and estimate > left:
                self.cut("whole", name, f"the profile estimates {estimate:.0f} s, {max(left, 0):.0f} s are left; "
                         f"alone: python -m benchmarks.device_check --parts profile,whole --budget "
                         f"{int(estimate * 1.5) + 240}")
                entry[recipe] = {"command": " ".join(["python", "-m", "trainer.train", *argv]),
                                 "estimate_s": estimate, "cut": "skipped: it would not fit"}
                continue
            if left <= 0:
                self.cut("whole", name, "the budget is spent")
                continue
            self.say(f"  {name}: python -m trainer.train {' '.join(argv)}"
                     + (f" (estimated {estimate:.0f} s of {left:.0f} s left)" if estimate else ""))
            ran = self.attempt(f"(whole) {recipe}", functools.partial(whole_run, argv, root / recipe, left, self.say))
            if not ran:
                continue
            entry[recipe] = {**ran, "estimate_s": estimate}
            for line in ran.get("tail", []):
                self.say(f"    | {line}")
            self.say(f"    wall time {ran['wall_s']:.0f} s, exit status {ran['exit_status']}; {ran['progress']}")
            for line in ran["distilled"]:
                self.say(f"    distilled: {line}")
            self.say(f"    quality: {ran['quality']}")
            if "cut" in ran:
                self.report["cut"].append(f"whole: {name}: {ran['cut']}")
            elif ran["exit_status"]:
                self.failures.append(f"(whole) {name} exited with status {ran['exit_status']}")
            elif not ran["quality"]:
                self.failures.append(f"(whole) {name} said no quality line")

    # ---------------------------------------------------------------------------------------------- (5)
    def part_copies(self, root: Path, entry: dict) -> None:
        for backend, compile, want in (("sync", False, 1), ("device", False, 0), ("device", True, 0),
                                       ("device", "reduce-overhead", 0)):
            name = f"{backend}{'' if not compile else ' compiled' if compile is True else ' CUDA graphs'}"
            if not self.cuda:
                self.say(f"    {name}: skipped ({NO_CUDA})")
                continue
            if not self.in_time(name, "copies"):
                continue
            copies = count_h2d_copies(self.sizes.envs[0], self.sizes.num_steps, backend, compile)
            entry[name] = copies
            self.say(f"    {name}: {copies} {'OK' if copies == want else 'FAILED'}")
            if copies != want:
                self.failures.append(f"(copies) {copies} host-to-device copies per rollout on the {name} backend")

    def part_resume(self, root: Path, entry: dict) -> None:
        n, device = self.sizes.resume_iterations, self.device
        self.say(f"    {n} + resume + {n} == {2 * n} iterations on {device}"
                 + ("" if self.cuda else " (no CUDA: the CPU stands in, so the code path stays checked)"))
        for backend, graphs in [("sync", False), ("device", False), *((("device", True),) if self.cuda else ())]:
            name = backend + (" --cuda-graphs" if graphs else "")
            if not self.in_time(name, "resume"):
                continue
            same = self.attempt(f"(resume) {name}", functools.partial(
                resume_matches, device, self.sizes.resume_envs, n, self.sizes.num_steps, root / f"{backend}-{graphs}",
                backend, cuda_graphs=graphs))
            if same is not None:
                entry[name] = same
                self.say(f"    {name}: {'OK: identical weights' if same else 'FAILED: the weights differ'}")
                if not same:
                    self.failures.append(f"(resume) resume on {device} with {name} is not exact")

    def part_update(self, root: Path, entry: dict) -> None:
        variants = [("eager", "off", False)]
        if self.sizes.compile:
            variants.append(("compiled", "on", False))  # the loss, as --compile runs it
        if self.cuda:  # each minibatch step captured, as --cuda-graphs runs it
            variants += [("graphed", "off", True), *((("compiled+graphed", "on", True),) if self.sizes.compile
                                                     else ())]
        for n, t in self.sizes.update_batches:
            for name, compile, graphs in variants:
                if not self.in_time(f"{n}x{t} {name}", "update"):
                    continue
                devices = ["cuda"] if graphs else self.devices
                rates = self.attempt(f"(update) {n}x{t} {name}", functools.partial(
                    update_rates, devices, n, t, compile=compile, cuda_graphs=graphs))
                if rates:
                    entry[f"{n}x{t} {name}"] = dict(zip(devices, rates))
                    ratio = f"  cuda/cpu {rates[0] / rates[1]:.2f}x" if len(rates) == 2 else ""
                    self.say(f"    {n}x{t} {name}: " + ", ".join(f"{d} {r:,.0f}" for d, r in zip(devices, rates))
                             + ratio)

    def part_env(self, root: Path, entry: dict) -> None:
        sizes = self.sizes
        for n in sizes.raw_envs:  # compiled at the largest size only: each size is a compilation (tens of seconds)
            if not self.in_time(f"{n} envs", "env"):
                continue
            compile = sizes.compile and n == max(sizes.raw_envs)
            measured = raw_rates(n, sizes.raw_steps, self.device, compile, repeats=1 if self.quick else 3)
            entry[str(n)] = {name: statistics.median(r) for name, r in measured.items()}
            self.say(f"    {n:>6}: " + ", ".join(f"{name} {statistics.median(r):,.0f}"
                                                 for name, r in measured.items()))

    def part_backends(self, root: Path, entry: dict) -> None:
        sizes, devices = self.sizes, self.devices
        self.say(f"    {'envs':>5}  {'backend':<15} {'workers':>7}  " + "  ".join(f"{d:>10}" for d in devices))
        for n in sizes.envs:
            rows = [("sync", 0, "off"), ("device", 0, "off"), ("device", 0, "on"),
                    *(("async", w, "off") for w in sizes.workers if w < n)]
            for backend, workers, compile in rows:
                name = backend + (" compiled" if compile == "on" else "")
                if not self.in_time(f"{n} {name} {workers}", "backends"):
                    continue
                rates, layout = [], {}
                for device in devices:
                    cfg = TrainConfig(num_envs=n, num_steps=sizes.num_steps, backend=backend, num_workers=workers,
                                      device=device, compile=compile, total_steps=10**9,
                                      run_dir=str(root / f"{n}-{backend}{workers}-{compile}-{device}"))
                    rate, layout = training_rate(cfg, sizes.iterations)
                    rates.append(rate)
                entry[f"{n} {name} {layout['workers']}"] = dict(zip(devices, rates))
                self.say(f"    {n:>5}  {name:<15} {layout['workers']:>7}  " + "  ".join(f"{r:>10,.0f}" for r in rates))

    def part_precision(self, root: Path, entry: dict) -> None:
        sizes = self.sizes
        scores: dict[str, dict[int, float]] = {name: {} for name in PRECISIONS}
        for seed in sizes.precision_seeds:
            for name in PRECISIONS:
                if not self.in_time(f"seed {seed} {name}", "precision"):
                    continue
                cfg = recipe_config("gpu_defaults", self.device, (*self.recipe_flags(), "--seed", str(seed)))
                score = self.attempt(f"(precision) seed {seed} {name}", functools.partial(
                    learning_score, cfg, name, sizes.precision_iterations))
                if score is not None:
                    scores[name][seed] = score
            self.say(f"    seed {seed}: " + ", ".join(f"{k} {v[seed]:.4f}" for k, v in scores.items() if seed in v)
                     + " reward/step")
        entry["reward_per_step"] = {k: {str(s): v for s, v in by_seed.items()} for k, by_seed in scores.items()}
        for name in PRECISIONS[1:]:
            paired = [scores[name][s] - scores["fp32"][s] for s in scores[name] if s in scores["fp32"]]
            if paired:
                entry[f"{name}_minus_fp32"] = paired
                self.say(f"    {name} - fp32, per seed: {', '.join(f'{d:+.4f}' for d in paired)}")

    def part_torchrun(self, root: Path, entry: dict) -> None:
        gpus = torch.cuda.device_count() if self.cuda else 0
        counts = sorted({1, gpus, *(2**i for i in range(1, 8) if 2**i <= gpus)}) if gpus else [1, 2]
        self.say(f"    {self.sizes.ranks_envs} envs per rank; "
                 + (f"GPUs of this node: {gpus}; targets >= 1.9x on 2, >= 3.6x on 4" if gpus else
                    f"gloo ranks on the CPU ({NO_CUDA})"))
        one = None
        for k in counts:
            if not self.in_time(f"{k} ranks", "torchrun"):
                continue
            rate = self.attempt(f"(torchrun) {k} ranks", functools.partial(
                torchrun_rate, k, self.device, self.sizes.ranks_envs, self.sizes.num_steps, self.sizes.iterations,
                "on" if self.sizes.compile else "off", root / f"{k}"))
            if rate:
                one = one or rate
                entry[str(k)] = rate
                self.say(f"    {k} rank{'s' if k > 1 else ''}: {rate:,.0f} env steps/s ({rate / one:.2f}x one)")

    # ---------------------------------------------------------------------------------------------- the verdict
    def decisions(self) -> dict[str, Any]:
        """What a later change decides from (``--cuda-graphs`` on by default; TF32, bf16): the evidence, gathered
        from the parts."""
        parts = self.report["parts"]
        profiled = parts.get("profile", {}).get("gpu_defaults", {})
        update = profiled.get("update_samples_per_s", {})
        return {
            "cuda_graphs": {"cuda_tests_passed": parts.get("tests", {}).get("passed"),
                            "env_steps_per_s": parts.get("scale", {}).get("env_steps_per_s", {}),
                            "update_samples_per_s": {f"{way}_cuda_graphs": update[k] for way, k in
                                                     (("without", "fp32"), ("with", "cuda_graphs")) if k in update}},
            "learner_precision": {"update_samples_per_s": {k: update[k] for k in PRECISIONS if k in update},
                                  "learning": {k: v for k, v in parts.get("precision", {}).items()
                                               if k not in ("status", "seconds")}},
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI, CPU): checks that every part runs")
    p.add_argument("--parts", default=",".join(PARTS), help="which parts to run, comma-separated, in this order "
                   f"(default: all, {','.join(PARTS)}): to finish a check that the budget cut short")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help=f"seconds the whole check may take (default {Sizes.budget_s:.0f}; --quick: "
                        f"{QUICK.budget_s:.0f}); parts past it are cut, and listed as cut")
    p.add_argument("--json", type=Path, default=None, metavar="PATH",
                   help="where the JSON report goes (default: $OUT/device_check.json, /tmp without OUT)")
    args = p.parse_args(argv)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = [x for x in parts if x not in PARTS]
    if unknown or not parts or len(set(parts)) != len(parts):
        p.error(f"--parts {args.parts!r}: choose from {','.join(PARTS)}, each at most once, comma-separated")
    if args.budget is not None and args.budget <= 0:
        p.error(f"--budget {args.budget:g}: give the seconds the check may take, more than 0")
    sizes = QUICK if args.quick else Sizes()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; read when CUDA starts
    path = args.json or Path(os.environ.get("OUT") or tempfile.gettempdir()) / "device_check.json"
    check = Check(sizes, torch.cuda.is_available(), path, quick=args.quick, budget_s=args.budget)
    for key, value in check.report["machine"].items():
        check.say(f"{key:>10}: {value}")
    check.say(f"    budget: {check.budget_s:.0f} s; parts: {','.join(parts)}; report: {path}")
    check.write_report()
    # one process compiles the same functions (the loss, the acting step) for many models and sizes: past dynamo's
    # default of 8 recompilations per function it would run them eagerly, silently, and "compiled" would be eager
    with torch._dynamo.config.patch(recompile_limit=64), tempfile.TemporaryDirectory() as tmp, _stops_raise():
        try:
            check.run(parts, Path(tmp))
        except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, or the script's timeout: what finished is above
            status = getattr(e, "exit_status", 130)
            done = [x for x in parts if "seconds" in check.report["parts"].get(x, {})]
            rest = ",".join(parts[len(done):])
            check.report.update(stopped=str(e) or "SIGINT", decisions=check.decisions())
            check.write_report()
            print(f"\ndevice check: cut short ({e or 'stopped by SIGINT'}) in part {parts[len(done)]}; the parts "
                  f"before it are complete above, the rest: --parts {rest}", flush=True)
            return status
    check.report["decisions"] = check.decisions()
    cut = check.report["cut"]
    # without CUDA every GPU measurement is skipped: "OK" would read as if the targets had been met
    verdict = "OK" if check.cuda else f"OK on the CPU; nothing was measured on a GPU ({NO_CUDA})"
    verdict = verdict if not check.failures else "FAILED: " + "; ".join(check.failures)
    check.report["verdict"] = verdict + (f" ({len(cut)} cut by the budget)" if cut else "")
    check.write_report()
    for line in cut:
        print(f"cut: {line}")
    print(f"report: {path}")
    print("\ndevice check: " + check.report["verdict"], flush=True)
    return 1 if check.failures else 0


@contextlib.contextmanager
def _stops_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`trainer.interrupts.Interrupted` between training runs too, so that the
    check ends with one line, not a traceback.

    SIGHUP is what ``benchmarks/device_check.sh``'s timeout sends: the trainer does not handle it, so
    it raises even where a SIGTERM is the trainer's own (which, in the moment after a run has
    finished and been saved, notes it and goes on: the check would then run on past its timeout).
    """
    def stop(signum: int, frame) -> None:
        raise Interrupted(signum)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
