"""Device check: what a GPU machine has to show, as one report.

    timeout 480 python -m benchmarks.device_check   # meant to fit in 8 minutes on one H200 (not yet run on one)
    python -m benchmarks.device_check --parts bg     # only the parts a timeout cut off
    python -m benchmarks.device_check --quick        # tiny sizes; what CI runs on the CPU

The parts run in the order of ``--parts`` (default ``adfecghb``: the targets first, so that a
timeout cuts off the comparisons, not the checks), each followed by its time:
(a) host-to-device copies per rollout, counted with the PyTorch profiler (``sync``: must be 1;
``device``: must be 0, eager, compiled and captured as CUDA graphs);
(b) end-to-end VR-edge training steps/s, CUDA vs CPU, with the default config and with
1024 envs, for ``sync``, ``device`` (eager and ``--compile on``) and ``async`` with 1, 4, 8 and
15 workers;
(c) PPO update throughput (samples/s), CUDA vs CPU, at 64x128 and 1024x128 batches: eager, the
loss compiled, and on CUDA each minibatch step captured as a CUDA graph (``--cuda-graphs``), alone
and with the compiled loss;
(d) N iterations + resume + N iterations == 2N iterations on CUDA, deterministic algorithms on,
for ``sync``, ``device`` and ``device --cuda-graphs``;
(e) raw VR-edge steps/s at 4,096 / 16,384 / 65,536 envs: the NumPy env (CPU) vs the torch env on
CUDA, eager, and at 65,536 also compiled and captured as CUDA graphs (``benchmarks.env_steps``);
(f) end-to-end training steps/s on CUDA with the GPU defaults (``--device cuda``: ``--backend
device``, 4,096 envs): eager, compiled, and compiled with ``--cuda-graphs`` (target: >= 1M env
steps/s); at 65,536 envs compiled, and compiled with ``--cuda-graphs``; and the cell recipe (``docs/cells.toml``:
4-12 users of 12 drawn per episode, churn, a set policy) on ``--backend device``;
(g) the CUDA-marked tests (``pytest -m cuda``);
(h) data-parallel training under ``torchrun --standalone --nproc-per-node K`` for K = 1, 2, 4, ... up to the
node's GPUs, ``device_envs[0]`` envs per rank with the GPU defaults: env steps/s and the speed-up over one
GPU (targets: >= 1.9x on 2 GPUs, >= 3.6x on 4).

Without CUDA, (a) and (g) are skipped with the reason, (b) and (c) run on the CPU alone, and (d),
(e), (f) and (h, with 1 and 2 gloo ranks) run on the CPU so that their code paths stay tested. Exits 1
when (a), (d) or (g) fails.
"""

from __future__ import annotations

import argparse
import contextlib
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
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import torch
from torch.profiler import ProfilerActivity, profile

import checkpoints
import envs
from benchmarks.env_steps import rates as raw_rates
from benchmarks.machine import print_machine
from benchmarks.revisions import steady_rate
from collectors import RolloutCollector, make_collector
from trainer import train as train_module
from trainer.config import TrainConfig, new_run_config
from trainer.interrupts import Interrupted
from trainer.ppo.algorithm import PPO
from trainer.ppo.model import ActorCritic
from trainer.ppo.targets import advantages_and_returns
from trainer.ppo.update import LearnerSamples, minibatch_generator, ppo_update
from trainer.run_layout import Machine, run_layout


@dataclass(frozen=True)
class Sizes:
    """How big each part runs: the full check, or ``--quick`` for CI."""

    envs: tuple[int, ...] = (64, 1024)  # (b): the default config's num_envs, and 1024
    num_steps: int = 128
    workers: tuple[int, ...] = (1, 4, 8, 15)  # (b): async workers
    iterations: int = 3  # (b): the first one is warm-up and not timed
    update_batches: tuple[tuple[int, int], ...] = ((64, 128), (1024, 128))  # (c): envs x steps
    resume_envs: int = 64  # (d)
    resume_iterations: int = 2  # (d): N
    raw_envs: tuple[int, ...] = (4096, 16384, 65536)  # (e)
    raw_steps: int = 20  # (e): steps per round, 3 rounds
    compile: bool = True  # (c), (e): also compiled (the loss; the torch env)
    device_envs: tuple[int, ...] = (4096, 65536)  # (f): the GPU default's, and more


REPO = Path(__file__).resolve().parent.parent
CELL_RECIPE = REPO / "docs" / "cells.toml"  # users varying, churn, a set policy
QUICK = Sizes(envs=(8,), num_steps=16, workers=(1, 2), iterations=2, update_batches=((8, 16),), resume_envs=4,
              resume_iterations=1, raw_envs=(64,), raw_steps=3, compile=False, device_envs=(16,))


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

    def update() -> None:
        ppo_update(run.step, samples, minibatch_generator(cfg.seed, 1, run.device))
        if device == "cuda":
            torch.cuda.synchronize()

    update()  # warm-up: kernels, allocator, compiling, capturing
    start = time.perf_counter()
    update()
    return epochs * rollout.numel() / (time.perf_counter() - start)


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


PARTS = "adfecghb"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI, CPU): checks that every part runs")
    p.add_argument("--parts", default=PARTS, help=f"which parts to run, e.g. 'adf' (default: all, {PARTS}): "
                   "to finish a run that a timeout cut short")
    args = p.parse_args(argv)
    if set(args.parts) - set(PARTS) or not args.parts or len(set(args.parts)) != len(args.parts):
        p.error(f"--parts {args.parts!r}: choose letters from {PARTS}, each once")
    sizes = QUICK if args.quick else Sizes()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; read when CUDA starts
    check = Check(sizes, torch.cuda.is_available(), quick=args.quick)
    print_machine()
    # one process compiles the same functions (the loss, the acting step) for many models and sizes: past dynamo's
    # default of 8 recompilations per function it would run them eagerly, silently, and "compiled" would be eager
    with torch._dynamo.config.patch(recompile_limit=64), tempfile.TemporaryDirectory() as tmp, \
            _stops_raise():
        for part in args.parts:
            start = time.perf_counter()
            try:
                check.attempt(f"({part})", functools.partial(getattr(check, f"part_{part}"), Path(tmp)))
            except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, or the script's timeout: what finished is above
                status = getattr(e, "exit_status", 130)
                print(f"\ndevice check: cut short ({e or 'stopped by SIGINT'}) in part ({part}); the parts before it "
                      f"are complete above, the rest: --parts {args.parts[args.parts.index(part):]}", flush=True)
                return status
            print(f"    ({part}: {time.perf_counter() - start:.0f} s)", flush=True)
    # without CUDA every GPU measurement is skipped: "OK" would read as if the targets had been met
    verdict = "OK" if check.cuda else "OK on the CPU; nothing was measured on a GPU (CUDA is not available here)"
    print("\ndevice check: " + (verdict if not check.failures else "FAILED: " + "; ".join(check.failures)))
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


NO_CUDA = "skipped: CUDA is not available here"
CUDA_TESTS_TIMEOUT_S = 300  # (g): a hung test is reported (subprocess.TimeoutExpired, one line) and the check goes on


def cuda_test_files(tests: Path) -> list[Path]:
    """The test files that mark a test (or all of theirs) ``cuda``."""
    return sorted(f for f in tests.glob("test_*.py") if re.search(r"mark\.cuda\b", f.read_text()))
T = TypeVar("T")


@dataclass
class Check:
    """The parts of the device check, each printing its own section (``part_a`` ... ``part_g``)."""

    sizes: Sizes
    cuda: bool
    quick: bool = False
    failures: list[str] = field(default_factory=list)

    def attempt(self, label: str, run: Callable[[], T]) -> T | None:
        """``run()``; an exception is reported (its type, message and where it was raised) and counted as a
        failure, and the check goes on: one broken variant must not cost the rest of a short GPU lease."""
        try:
            return run()
        except Exception as e:  # noqa: BLE001 (reported, counted, and the other parts still run)
            where = traceback.extract_tb(e.__traceback__)[-1]
            message = next((line for line in str(e).splitlines() if line.strip()), "")[:300]
            print(f"    {label}: FAILED: {type(e).__name__}: {message} ({Path(where.filename).name}:{where.lineno})",
                  flush=True)
            root_cause = e
            while root_cause.__cause__ is not None:
                root_cause = root_cause.__cause__
            if root_cause is not e:  # what a wrapping error's first line leaves out (a compiler's own words)
                for line in [x for x in str(root_cause).splitlines() if x.strip()][:4]:
                    print(f"        {line.strip()[:300]}", flush=True)
            self.failures.append(f"{label} raised {type(e).__name__}")
            return None

    @property
    def devices(self) -> list[str]:
        return ["cuda", "cpu"] if self.cuda else ["cpu"]

    @property
    def device(self) -> str:
        return "cuda" if self.cuda else "cpu"

    def part_a(self, root: Path) -> None:
        print("\n(a) host-to-device copies per rollout (sync: must be 1; device: must be 0)")
        for backend, compile, want in (("sync", False, 1), ("device", False, 0), ("device", True, 0),
                                       ("device", "reduce-overhead", 0)):
            name = f"{backend}{'' if not compile else ' compiled' if compile is True else ' CUDA graphs'}"
            if not self.cuda:
                print(f"    {name}: {NO_CUDA}")
                continue
            copies = count_h2d_copies(self.sizes.envs[0], self.sizes.num_steps, backend, compile)
            print(f"    {name}: {copies} {'OK' if copies == want else 'FAILED'}")
            if copies != want:
                self.failures.append(f"(a) {copies} host-to-device copies per rollout on the {name} backend")

    def part_b(self, root: Path) -> None:
        sizes, devices = self.sizes, self.devices
        print(f"\n(b) end-to-end VR-edge training, env steps/s (iterations 2-{sizes.iterations}; "
              f"{sizes.num_steps} steps per rollout){'' if self.cuda else '; CUDA ' + NO_CUDA}")
        print(f"    {'envs':>5}  {'backend':<15} {'workers':>7}  " + "  ".join(f"{d:>10}" for d in devices)
              + ("  cuda/cpu" if self.cuda else ""))
        for n in sizes.envs:
            rows = [("sync", 0, "off"), ("device", 0, "off"), ("device", 0, "on"),
                    *(("async", w, "off") for w in sizes.workers if w < n)]
            for backend, workers, compile in rows:
                rates, layout = [], {}
                for device in devices:
                    cfg = TrainConfig(num_envs=n, num_steps=sizes.num_steps, backend=backend, num_workers=workers,
                                      device=device, compile=compile, total_steps=10**9,
                                      run_dir=str(root / f"b-{n}-{backend}{workers}-{compile}-{device}"))
                    rate, layout = training_rate(cfg, sizes.iterations)
                    rates.append(rate)
                ratio = f"  {rates[0] / rates[1]:7.2f}x" if self.cuda else ""
                name = backend + (" compiled" if compile == "on" else "")
                print(f"    {n:>5}  {name:<15} {layout['workers']:>7}  "
                      + "  ".join(f"{r:>10,.0f}" for r in rates) + ratio)

    def part_c(self, root: Path) -> None:
        variants = [("eager", "off", False)]
        if self.sizes.compile:
            variants.append(("compiled", "on", False))  # the loss, as --compile runs it
        if self.cuda:  # each minibatch step captured, as --cuda-graphs runs it
            variants += [("graphed", "off", True), *((("compiled+graphed", "on", True),) if self.sizes.compile
                                                     else ())]
        print(f"\n(c) PPO update, samples/s (4 epochs; {', '.join(name for name, *_ in variants)})"
              + ("" if self.cuda else "; CUDA " + NO_CUDA))
        for n, t in self.sizes.update_batches:
            for name, compile, graphs in variants:
                devices = ["cuda"] if graphs else self.devices
                rates = self.attempt(f"(c) {n}x{t} {name}", functools.partial(
                    update_rates, devices, n, t, compile=compile, cuda_graphs=graphs))
                if rates:
                    ratio = f"  cuda/cpu {rates[0] / rates[1]:.2f}x" if len(rates) == 2 else ""
                    print(f"    {n}x{t} {name}: " + ", ".join(f"{d} {r:,.0f}" for d, r in zip(devices, rates))
                          + ratio)

    def part_d(self, root: Path) -> None:
        n, device = self.sizes.resume_iterations, self.device
        print(f"\n(d) {n} + resume + {n} == {2 * n} iterations on {device}, deterministic algorithms"
              + ("" if self.cuda else " (no CUDA: the CPU stands in, so the code path stays checked)"))
        variants = [("sync", False), ("device", False), *((("device", True),) if self.cuda else ())]
        for backend, graphs in variants:
            name = backend + (" --cuda-graphs" if graphs else "")
            same = self.attempt(f"(d) {name}", functools.partial(
                resume_matches, device, self.sizes.resume_envs, n, self.sizes.num_steps, root / f"d-{backend}-{graphs}",
                backend, cuda_graphs=graphs))
            if same is not None:
                print(f"    {name}: {'OK: identical weights' if same else 'FAILED: the weights differ'}")
                if not same:
                    self.failures.append(f"(d) resume on {device} with {name} is not exact")

    def part_e(self, root: Path) -> None:
        sizes = self.sizes
        print(f"\n(e) raw VR-edge steps/s, the NumPy env on the CPU vs the torch env on {self.device} (median of 3 "
              f"rounds of {sizes.raw_steps} steps)")
        for n in sizes.raw_envs:  # compiled at the largest size only: each size is a compilation (tens of seconds)
            compile = sizes.compile and n == max(sizes.raw_envs)
            measured = raw_rates(n, sizes.raw_steps, self.device, compile, repeats=1 if self.quick else 3)
            print(f"    {n:>6}: " + ", ".join(f"{name} {statistics.median(r):,.0f}" for name, r in measured.items()))

    def part_f(self, root: Path) -> None:
        sizes, device = self.sizes, self.device
        print(f"\n(f) end-to-end VR-edge training with the GPU defaults (--device cuda: --backend device) on "
              f"{device}, env steps/s (iterations 2-{sizes.iterations}; {sizes.num_steps} steps per rollout; "
              "target on one H200: >= 1,000,000)")
        gpu_defaults = new_run_config({"device": device}, gpu=True)
        variants = [("eager", "off", False), ("compiled", "on", False),
                    *((("compiled+graphed", "on", True),) if self.cuda else ())]
        for n in sizes.device_envs:
            measured = []
            # beyond the GPU default's size, eagerly only where the check is quick: the compiled runs are the target's
            for name, compile, graphs in variants if n == sizes.device_envs[0] or self.quick else variants[1:]:
                cfg = gpu_defaults.replaced(num_envs=n, num_steps=sizes.num_steps, compile=compile,
                              cuda_graphs=graphs, total_steps=10**12, run_dir=str(root / f"f-{n}-{name}"))
                rate = self.attempt(f"(f) {n} envs {name}", functools.partial(training_rate, cfg, sizes.iterations))
                measured.append(f"{name} {rate[0]:,.0f}" if rate else f"{name} FAILED")
            print(f"    {n:>6} envs: {', '.join(measured)}")
        n, compile = sizes.device_envs[0], "on" if sizes.compile else "off"
        argv = ["--config", str(CELL_RECIPE), "--device", device, "--backend", "device", "--num-envs", str(n),
                "--num-steps", str(sizes.num_steps), "--compile", compile, "--total-steps", str(10**12),
                "--run-dir", str(root / "f-cells")]
        rate = self.attempt("(f) the cell recipe", functools.partial(
            training_rate, train_module.parse_args(argv).config, sizes.iterations))
        print(f"    {n:>6} envs, the cell recipe (docs/cells.toml, compile {compile}): "
              + (f"{rate[0]:,.0f}" if rate else "FAILED"))

    def part_g(self, root: Path) -> None:
        print("\n(g) the CUDA-marked tests (pytest -m cuda)")
        if not self.cuda:
            print(f"    {NO_CUDA}")
            return
        # one test process, without the ini's options (-n 2): a GPU node's image may have pytest, not pytest-xdist;
        # only the files that hold CUDA tests, as it may lack what the others import (optuna, wandb)
        run = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-m", "cuda", "-q", "-p",
                              "no:cacheprovider", *map(str, cuda_test_files(REPO / "tests"))],
                             capture_output=True, text=True, timeout=CUDA_TESTS_TIMEOUT_S)
        lines = (run.stdout + run.stderr).strip().splitlines()
        for line in lines[-25:] if run.returncode else lines[-1:]:
            print(f"    {line}")
        if run.returncode:
            self.failures.append("(g) CUDA-marked tests failed")


    def part_h(self, root: Path) -> None:
        sizes, per_rank = self.sizes, self.sizes.device_envs[0]
        gpus = torch.cuda.device_count() if self.cuda else 0
        counts = sorted({1, gpus, *(2**i for i in range(1, 8) if 2**i <= gpus)}) if gpus else [1, 2]
        print(f"\n(h) data-parallel training under torchrun, {per_rank} envs per rank, env steps/s by ranks ("
              + (f"GPUs of this node: {gpus}; targets >= 1.9x on 2, >= 3.6x on 4)" if gpus else
                 f"gloo ranks on the CPU; CUDA {NO_CUDA})"))
        one = None
        for k in counts:
            rate = self.attempt(f"(h) {k} ranks", functools.partial(
                torchrun_rate, k, self.device, per_rank, sizes.num_steps, sizes.iterations,
                "on" if sizes.compile else "off", root / f"h-{k}"))
            if rate:
                one = one or rate
                print(f"    {k} rank{'s' if k > 1 else ''}: {rate:,.0f} env steps/s ({rate / one:.2f}x one)",
                      flush=True)


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


if __name__ == "__main__":
    sys.exit(main())
