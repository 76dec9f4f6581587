"""Training configuration: one flat record of every setting (its default, what it means, which values are valid),
stored in every checkpoint. ``trainer.flags`` exposes it as command-line flags and TOML keys; which algorithm
reads which field is each algorithm's own declaration (``Algorithm.options``)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from collectors.backend_names import BACKENDS
from trainer.arguments import choose, counted, did_you_mean, spelled

# env arguments that name files: stored absolute (a run's printed commands work from any directory), and the
# ones a resumed run or trainer.evaluate may point elsewhere (the files moved; the run is the same)
PATH_ENV_KWARGS = frozenset({"capacity_trace"})
COMPILE_CHOICES = ("auto", "on", "off")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
START_METHOD_CHOICES = ("auto", "forkserver", "spawn")
# torch seeds a generator with an unsigned 64-bit integer, and PPO's policy samples from one seeded with seed + 1
MAX_SEED = 2**64 - 2


@dataclass
class TrainConfig:
    algo: str = "ppo"
    env: str = "VREdge-v0"
    env_kwargs: str = ""
    backend: str = "sync"
    num_envs: int = 64
    num_steps: int = 128
    total_steps: int = 3_000_000
    seed: int = 1
    device: str = "auto"
    compile: str = "auto"
    cuda_graphs: bool = False
    run_dir: str = ""
    num_workers: int = 0
    num_splits: int = 1
    threads: int = 0
    lr: float = 1e-3
    anneal_lr: bool = True
    gamma: float = 0.9
    gae_lambda: float = 0.95
    epochs: int = 4
    batch_size: int = 0
    clip_coef: float = 0.2
    clip_value: bool = False
    ent_coef: float = 0.001
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    target_kl: float = 0.0
    normalize_obs: bool = True
    scale_rewards: bool = False
    hidden: str = "64,64"
    policy_arch: str = "auto"
    shared_trunk: bool = False
    tensorboard: bool = False
    ray_address: str = ""
    envs_per_worker: int = 0
    cpus_per_worker: float = 1.0
    worker_timeout: float = 60.0  # collectors.deadlines.DEFAULT_WORKER_TIMEOUT_S (not imported: collectors loads torch)
    start_method: str = "auto"
    ray_async: bool = False
    overlap: bool = False
    overlap_targets: str = "vtrace"
    max_lag: int = 4
    rho_bar: float = 1.0
    c_bar: float = 1.0
    checkpoint_every: int = 10
    eval_every: int = 0
    eval_episodes: int = 16
    keep_checkpoints: int = 3
    replay_capacity: int = 100_000
    replay_alpha: float = 0.6
    replay_beta: float = 0.4
    replay_ratio: float = 8.0
    apex_batch_size: int = 128
    n_step: int = 3
    target_update: int = 500
    weights_every: int = 400
    learning_starts: int = 2_000
    eps_base: float = 0.4
    eps_alpha: float = 7.0
    save_replay: bool = False
    config: str = ""

    HELP = {  # (algo's help lists the registered algorithms: trainer.flags)
        "env": "any registered Gymnasium env id (VREdge-v0 uses the natively batched env)",
        "env_kwargs": "env constructor arguments, key=value,key=value (numbers, true/false, text or [lists]), e.g. "
                      "num_users=6, capacity_trace=traces/,trace_split=train or 'bitrates_mbps=[5,10,20,40]' for "
                      "VR-edge",
        "backend": "rollout backend: serial, sync, async, device (VR-edge as torch tensors on --device, next to the "
                   "acting policy) or ray",
        "num_envs": "parallel envs (with --num-steps, as many as the memory holds: checked at start)",
        "num_steps": "steps per env per rollout (with --num-envs, as many as the memory holds: checked at start)",
        "total_steps": "env steps to train for", "seed": f"run seed (envs, init, sampling), 0 to {MAX_SEED}",
        "device": "auto (cuda when available), cpu or cuda",
        "compile": "torch.compile the hot paths as fixed-shape graphs (the acting step: policy and torch env; PPO's "
                   "loss): auto (on for --backend device, and for PPO runs of at least 2M env steps, where it paid "
                   "for its compile time: 1.39x on 2 cores), on or off; needs a C++ compiler on the CPU (Triton on "
                   "CUDA): where there is none, auto says so and runs eagerly; Ray actors act eagerly",
        "cuda_graphs": "on a CUDA learner: capture each minibatch step (loss, backward, clip, Adam) as one CUDA "
                       "graph, replayed with one launch; with --backend device and --compile, the acting step too "
                       "(torch.compile's reduce-overhead); measured by benchmarks.device_check, not yet on by "
                       "default",
        "run_dir": "run directory of a new run (default runs/<env>-s<seed>-<time>)",
        "num_workers": "async worker processes or ray actors (0: from the run layout: one busy process per core, "
                       "or the actors the Ray cluster's CPUs hold)",
        "worker_timeout": "seconds an async worker, the --overlap collecting process or a Ray actor may stay silent "
                          "(a hung env step, a stopped process) before the run stops, or the actor is replaced; "
                          "stretched to 20x the slowest answer measured",
        "start_method": "how async workers and the --overlap collecting process start: forkserver (forked from a "
                        "server that has imported torch once: ~30 ms each), spawn (a fresh interpreter each, "
                        "importing torch: seconds; Windows has only this) or auto (forkserver where the platform "
                        "has one)",
        "num_splits": "async: env groups stepped double-buffered (2: the workers step one half of the envs while "
                      "the policy acts on the other; 1: lockstep); pays off for envs with costly steps",
        "threads": "torch threads of this process (0: from the run layout: the cores the workers leave free while "
                   "collecting, all cores while learning)",
        "lr": "Adam learning rate",
        "anneal_lr": "linear LR annealing to 0 over total_steps", "gamma": "discount",
        "gae_lambda": "GAE lambda", "epochs": "PPO epochs per rollout",
        "batch_size": "minibatch size (0: planner picks from num_envs x num_steps)",
        "clip_coef": "PPO clip range", "clip_value": "clip the value loss too",
        "ent_coef": "entropy bonus", "vf_coef": "value loss weight", "max_grad_norm": "global grad-norm clip",
        "norm_adv": "normalise advantages per minibatch",
        "target_kl": "early-stop epochs above this KL (0: off)",
        "normalize_obs": "running observation normalisation",
        "scale_rewards": "divide rewards by running return std",
        "hidden": "hidden layer sizes, comma separated",
        "policy_arch": "actor: flat MLP, per_head (one MLP shared by all action heads; needs an env that declares "
                       "head_observation_layout, like VR-edge), or auto (per_head where declared)",
        "shared_trunk": "one trunk for actor and critic",
        "tensorboard": "also log to TensorBoard (needs the tensorboard extra)",
        "ray_address": "ray backend: cluster address (empty: reuse a running Ray or start a local one)",
        "envs_per_worker": "async/ray: envs per process or actor (0: from the run layout)",
        "cpus_per_worker": "ray backend: CPUs reserved per actor (fractions allowed)",
        "ray_async": "ray backend: IMPALA-style collection with V-trace correction",
        "overlap": "collect the next rollout in a separate process while learning on this one (a fixed policy lag "
                   "of one update; serial, sync and async backends)",
        "overlap_targets": "overlap: vtrace (V-trace corrects the targets for the one-update lag) or gae (stored "
                           "values, PPO ratio against the behaviour log-probs)",
        "max_lag": "ray_async: drop batches collected more than this many policy versions ago",
        "rho_bar": "V-trace importance-weight clip for the targets and advantages",
        "c_bar": "V-trace trace-cutting clip",
        "checkpoint_every": "save a checkpoint every this many iterations (and at the end)",
        "keep_checkpoints": "how many checkpoint files to keep in <run-dir>/checkpoints",
        "eval_every": "every this many iterations, play the greedy policy on held-out validation episodes, log it "
                      "(VR-edge: paired against the best baseline) and point <run-dir>/checkpoints/best at the best "
                      "(0: off)",
        "eval_episodes": "validation episodes for --eval-every (seeds disjoint from training and trainer.evaluate)",
        "replay_capacity": "transitions the replay holds (FIFO); its memory is printed at start",
        "replay_alpha": "priority exponent (0: uniform sampling)",
        "replay_beta": "importance-sampling exponent at the start, annealed linearly to 1 over total_steps",
        "replay_ratio": "transitions the learner samples per transition entering the replay",
        "apex_batch_size": "learner minibatch size",
        "n_step": "steps of the n-step return",
        "target_update": "copy the online network into the target network every this many learner steps",
        "weights_every": "the actors pull the learner's weights every this many steps per env (rounded up "
                         "to whole rollouts of num_steps)",
        "learning_starts": "transitions in the replay before the learner starts",
        "eps_base": "exploration rate of env i is eps_base^(1 + eps_alpha * i / (num_envs - 1))",
        "eps_alpha": "see eps_base",
        "save_replay": "also save the replay's contents in every checkpoint, for an exact resume; it can be "
                       "gigabytes (replay_capacity x the bytes per transition printed at start), and a run then "
                       "needs up to 4 times that in memory; without it a resumed run refills the replay",
        "config": "TOML file with any of these keys (flags override it)",
    }

    def validate(self) -> None:
        """Raise :class:`ConfigError` (a ``ValueError`` naming the key) for the first invalid value."""
        def need(ok: bool, name: str, rule: str) -> None:
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):  # inf passes most ranges, nan fails them all
                ok, rule = False, "must be finite and " + rule.removeprefix("must be ")  # "... and > 0"
            if not ok:
                raise ConfigError(name, value, rule)

        def one_of(name: str, choices: tuple[str, ...]) -> None:
            need(getattr(self, name) in choices, name, choose(getattr(self, name), choices))
        need(0 <= self.seed <= MAX_SEED, "seed", f"must be >= 0 and at most {MAX_SEED} (2**64 - 2: torch seeds "
             "its generators with 64-bit unsigned integers, the policy's sampling one with seed + 1)")
        try:
            options = self.env_options
        except ValueError as e:
            need(False, "env_kwargs", str(e))
        need("render_mode" not in options, "env_kwargs", "render_mode: training renders no env (they step in "
             "batches, in this process or in workers); drop it")
        if self.env == "VREdge-v0":  # a typo would otherwise surface as a TypeError from deep inside gym.make
            from envs import VREdgeConfig
            from envs.traces import TraceNotFoundError
            from envs.vr_edge import torch_env_refusal
            known = env_argument_defaults(self.env)
            unknown = sorted(set(options) - set(known))
            need(not unknown, "env_kwargs", f"VR-edge has no argument {', '.join(unknown)}"
                 f"{did_you_mean(unknown, known)}; its arguments are {', '.join(known)}")
            if self.backend == "device" and (why := torch_env_refusal(**options)):  # before traces are read
                raise ConfigError("env_kwargs", self.env_kwargs, message=f"--backend device: {why}")
            try:  # every value too (types, ranges, traces): a one-line error now, not one from inside gym.make
                VREdgeConfig(**options)
            except TraceNotFoundError as e:
                need(False, "env_kwargs", f"{e} (traces that moved: --env-kwargs capacity_trace=NEW_DIR with "
                     "--resume, --capacity-trace NEW_DIR with trainer.evaluate)")
            except ValueError as e:  # VR-edge names the argument and its rule: not "is invalid" twice
                raise ConfigError("env_kwargs", self.env_kwargs, message=f"--env-kwargs: {e}") from None
        need(not self.ray_address or self.ray_address == "auto" or
             re.fullmatch(r"(ray://)?[\w.\-\[\]:]+:\d+", self.ray_address) is not None, "ray_address",
             "give the HOST:PORT that `ray start --head` printed (e.g. 10.0.0.1:6379), or auto")
        need(not self.ray_async or self.backend == "ray", "ray_async", "needs --backend ray")
        need(self.max_lag >= 0, "max_lag", "must be >= 0")
        need(not self.overlap or self.backend != "ray", "overlap",
             "works with --backend serial, sync or async; with Ray, --ray-async true keeps the actors collecting "
             "while the learner learns")
        need(not self.overlap or self.backend != "device", "overlap",
             "works with --backend serial, sync or async; --backend device steps its env on the learner's device, "
             "between updates")
        one_of("overlap_targets", ("gae", "vtrace"))
        one_of("policy_arch", ("auto", "flat", "per_head"))
        need(self.rho_bar > 0, "rho_bar", "must be > 0")
        need(self.c_bar > 0, "c_bar", "must be > 0")
        need(self.cpus_per_worker > 0, "cpus_per_worker", "must be > 0")
        need(0 < self.worker_timeout <= 1e6, "worker_timeout", "must be > 0 and at most 1e6 seconds (11.6 days: "
             "waits take no longer bound)")
        need(self.envs_per_worker >= 0, "envs_per_worker", "must be >= 0 (0: split evenly)")
        need(self.eval_every >= 0, "eval_every", "must be >= 0 (0: off)")
        for name in ("num_envs", "num_steps", "total_steps", "epochs", "checkpoint_every", "keep_checkpoints",
                     "eval_episodes"):
            need(getattr(self, name) >= 1, name, "must be >= 1")
        need(self.lr > 0, "lr", "must be > 0")
        need(0 < self.gamma <= 1, "gamma", "must be in (0, 1]")
        need(0 <= self.gae_lambda <= 1, "gae_lambda", "must be in [0, 1]")
        need(self.clip_coef > 0, "clip_coef", "must be > 0")
        need(self.max_grad_norm > 0, "max_grad_norm", "must be > 0")
        need(self.batch_size >= 0, "batch_size", "must be >= 0 (0 lets the planner choose)")
        need(self.target_kl >= 0, "target_kl", "must be >= 0 (0 disables it)")
        need(self.num_workers >= 0, "num_workers", "must be >= 0 (0: backend default)")
        need(self.num_splits >= 1, "num_splits", "must be >= 1 (1: lockstep)")
        one_of("backend", BACKENDS)
        need(self.num_splits == 1 or self.backend == "async", "num_splits", "needs --backend async")
        need(self.threads >= 0, "threads", "must be >= 0 (0: from the run layout)")
        need(self.device in DEVICE_CHOICES or self.device.startswith("cuda:"), "device",
             "use auto, cpu, cuda or cuda:N" + (" (did you mean cuda?)" if self.device.lower() == "gpu" else
                                                 did_you_mean(self.device, DEVICE_CHOICES)))
        one_of("compile", COMPILE_CHOICES)
        need(self.start_method != "fork", "start_method", "a forked copy of a lock held by one of this process's "
             f"threads (torch's) can hang the child; {choose('', START_METHOD_CHOICES)}")
        one_of("start_method", START_METHOD_CHOICES)
        try:
            sizes = self.hidden_sizes
        except ValueError:
            sizes = ()
        need(len(sizes) > 0 and all(s > 0 for s in sizes), "hidden", "comma-separated positive sizes, e.g. 64,64")
        for name in ("replay_capacity", "apex_batch_size", "n_step", "target_update", "weights_every"):
            need(getattr(self, name) >= 1, name, "must be >= 1")
        need(self.learning_starts >= 0, "learning_starts", "must be >= 0 (0: learn from the first transitions)")
        need(self.replay_alpha >= 0, "replay_alpha", "must be >= 0 (0: uniform sampling)")
        need(0 <= self.replay_beta <= 1, "replay_beta", "must be in [0, 1]")
        need(self.replay_ratio > 0, "replay_ratio", "must be > 0")
        need(0 < self.eps_base <= 1, "eps_base", "must be in (0, 1]")
        need(self.eps_alpha >= 0, "eps_alpha", "must be >= 0")
        for f in fields(self):  # a float with no range above: inf or nan would fail much later
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f.name, value, "must be a finite number")

    def check_memory(self, env: EnvSizes, copies: int, available: int) -> None:
        """Raise :class:`ConfigError` where the run would need more than ``available`` bytes of memory
        (:func:`memory_needed`), naming the setting that makes it so: the env's arguments where it would not fit
        even at the default sizes, else ``num_steps`` or ``num_envs``, whichever back at its default would
        save more, with the most of it that fits. ``copies``: of the rollout, in this memory.

        >>> vr = EnvSizes(observation=244, action=64, scores=48, own=1033)
        >>> TrainConfig(num_steps=10**9).check_memory(vr, copies=2, available=128 << 30)
        Traceback (most recent call last):
        ...
        trainer.config.ConfigError: --num-steps=1000000000 is invalid: the run would need at least 65.1 TiB of \
memory, more than the 128.0 GiB available here (a rollout of 1,000,000,000 x 64 env steps at 559 bytes each, in 2 \
copies, and 1,225 bytes per env besides); at most 1,920,824 steps fit with --num-envs 64
        """
        needed = memory_needed(self.num_steps, self.num_envs, env, copies)
        if needed <= available:
            return
        steps, envs = min(self.num_steps, TrainConfig.num_steps), min(self.num_envs, TrainConfig.num_envs)
        why = (f"the run would need at least {_bytes(needed)} of memory, more than the {_bytes(available)} available "
               f"here (a rollout of {self.num_steps:,} x {self.num_envs:,} env steps at {rollout_step_bytes(env):,} "
               f"bytes each, in {counted(copies, 'copy', 'copies')}, and {env.per_env:,} bytes per env besides)")
        if memory_needed(steps, envs, env, copies) > available:  # the env's own sizes
            scaling = [name for name in env.scaled_by if name in self.env_options]
            key = "env_kwargs" if self.env_kwargs else "env"
            raise ConfigError(key, getattr(self, key), f"{why}; not even {steps:,} x {envs:,} env steps fit"
                              + (f": lower {' or '.join(scaling)}" if scaling else ""))
        if memory_needed(steps, self.num_envs, env, copies) <= memory_needed(self.num_steps, envs, env, copies):
            most = _most_that_fits(available, lambda t: memory_needed(t, self.num_envs, env, copies), self.num_steps)
            raise ConfigError("num_steps", self.num_steps, f"{why}; " + (
                f"at most {most:,} steps fit with --num-envs {self.num_envs}" if most else
                f"not one step fits with --num-envs {self.num_envs}: lower both"))
        most = _most_that_fits(available, lambda n: memory_needed(self.num_steps, n, env, copies), self.num_envs)
        raise ConfigError("num_envs", self.num_envs, f"{why}; " + (
            f"at most {most:,} envs fit with --num-steps {self.num_steps}" if most else
            f"not one env fits with --num-steps {self.num_steps}: lower both"))

    @property
    def env_options(self) -> dict[str, Any]:
        """``env_kwargs`` as keyword arguments: ``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}``."""
        return parse_env_kwargs(self.env_kwargs)

    @property
    def hidden_sizes(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.hidden.split(","))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_absolute_paths(self) -> TrainConfig:
        """This config with the env arguments that name files (``PATH_ENV_KWARGS``) made absolute.

        >>> TrainConfig(env_kwargs="capacity_trace=/data/traces/,trace_split=train").with_absolute_paths().env_kwargs
        'capacity_trace=/data/traces,trace_split=train'
        """
        try:
            options = self.env_options
        except ValueError:  # validate() says what is wrong with it
            return self
        paths = {k: str(Path(v).resolve()) for k, v in options.items() if k in PATH_ENV_KWARGS and isinstance(v, str)}
        if not paths:
            return self
        return dataclasses.replace(self, env_kwargs=format_env_kwargs({**options, **paths}))


class ConfigError(ValueError):
    """An invalid config value; ``key`` names it (a flag on the command line, a key in a TOML file).

    ``rule`` is what the value breaks (``"must be >= 0"``: the message is ``--key=value is invalid: rule``);
    a ``message`` of its own replaces that sentence (a rule between several flags), and ``rule`` may then be
    empty.
    """

    def __init__(self, key: str, value: Any, rule: str = "", message: str | None = None) -> None:
        if not (rule or message):
            raise TypeError("ConfigError needs a rule or a message")
        super().__init__(message or f"--{key.replace('_', '-')}={spelled(value)} is invalid: {rule}")
        self.key, self.value, self.rule = key, value, rule

    def in_file(self, path: str) -> str:
        """The message for a value that the TOML file ``path`` set: the key as the file writes it."""
        where = f"{path}: {self.key} = {spelled(self.value)}"
        return f"{where} is invalid: {self.rule}" if self.rule else f"{self} ({where})"


@dataclass(frozen=True)
class EnvSizes:
    """What one env of a run holds, in bytes, for the memory the run needs (:func:`memory_needed`)."""

    observation: int  # one observation
    action: int  # one action, as the policy returns it
    scores: int  # the numbers a policy scores one env's actions with (float32 each): the actions of all its heads
    own: int = 0  # what the env holds itself (its state, its spaces' bounds), where it says
    scaled_by: tuple[str, ...] = ()  # the env's arguments that scale these

    @property
    def per_env(self) -> int:
        """Bytes per env besides the rollout: the env's own and the policy's scores."""
        return self.own + 4 * self.scores


def rollout_step_bytes(env: EnvSizes) -> int:
    """Bytes of one env's step in a rollout (``collectors.storage``): its observation, its final observation, its
    action, the reward (float32) and three flags (terminated, truncated, the final observation's mask)."""
    return 2 * env.observation + env.action + 4 + 3


def memory_needed(num_steps: int, num_envs: int, env: EnvSizes, copies: int) -> int:
    """Bytes a run needs at least: ``copies`` of its ``[num_steps, num_envs]`` rollout with the observations that
    follow it, and per env what :attr:`EnvSizes.per_env` says (what more the run holds, its network and
    interpreters, is not counted: a run refused for memory would not have fitted).

    >>> memory_needed(128, 64, EnvSizes(observation=244, action=64, scores=48, own=1033), copies=2)
    9268288
    """
    return num_envs * (copies * (num_steps * rollout_step_bytes(env) + env.observation) + env.per_env)


def _most_that_fits(available: int, needed: Callable[[int], int], over: int) -> int:
    """The largest count below ``over`` whose ``needed`` bytes are at most ``available`` (0: not even one); the
    need grows with the count."""
    low, high = 0, over
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if needed(middle) <= available else (low, middle)
    return low


def _bytes(n: int) -> str:
    """``n`` bytes in the largest unit from MiB to EiB that it holds once: ``65.1 TiB``, ``100.0 MiB``."""
    units = ("MiB", "GiB", "TiB", "PiB", "EiB")
    power = min(max((n.bit_length() - 1) // 10 - 2, 0), len(units) - 1)
    return f"{n / 2 ** (20 + 10 * power):,.1f} {units[power]}"


def parse_env_kwargs(text: str) -> dict[str, Any]:
    """``key=value`` pairs separated by commas; values are ints, floats, ``true``/``false``, text (in double
    quotes where it would read as one of the others: ``capacity_trace="2024"``), or a list of those in
    brackets (a tuple: VR-edge's bitrate ladder).

    >>> parse_env_kwargs("num_users=6,trace_split=train,noise_std=0.1,shared=true")
    {'num_users': 6, 'trace_split': 'train', 'noise_std': 0.1, 'shared': True}
    >>> parse_env_kwargs("bitrates_mbps=[5, 10, 25],num_users=4")
    {'bitrates_mbps': (5, 10, 25), 'num_users': 4}
    """
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in _top_level_items(text))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if sep and not key.isidentifier() and key.replace("-", "_").isidentifier():  # TOML keys take either
            raise ValueError(f"{key}: env arguments are the constructor's names, with underscores: write "
                             f"{key.replace('-', '_')}={value}")
        if not sep or not key.isidentifier():
            lists = " (a list goes in brackets: regime_multipliers=[1.3,0.9,0.4])" if "(" in text else ""
            raise ValueError(f"{item!r} is not key=value (write e.g. num_users=6,trace_split=train){lists}")
        if key in out:
            raise ValueError(f"{key} is given twice")
        out[key] = _value(key, value)
    return out


def _top_level_items(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            break
        if char == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"{text!r} has unbalanced or nested brackets: a list is one level, e.g. "
                         "bitrates_mbps=[5,10,20]")
    return [*items, text[start:]]


def _value(key: str, text: str) -> Any:
    if not (text.startswith("[") and text.endswith("]")):
        return _scalar(text)
    inner = text[1:-1].strip()
    values = tuple(_scalar(part.strip()) for part in inner.split(",")) if inner else ()
    if "" in values:
        raise ValueError(f"{key}={text} has an empty item: write e.g. {key}=[5,10,20]")
    return values


def format_env_kwargs(options: dict[str, Any]) -> str:
    """The ``env_kwargs`` text of keyword arguments (what :func:`parse_env_kwargs` reads back).

    >>> format_env_kwargs({"num_users": 6, "shared": True, "bitrates_mbps": (5.0, 10.0), "capacity_trace": "2024"})
    'num_users=6,shared=true,bitrates_mbps=[5.0,10.0],capacity_trace="2024"'
    """
    def text(v: Any) -> str:
        if isinstance(v, (tuple, list)):
            return f"[{','.join(map(text, v))}]"
        if isinstance(v, str) and (not isinstance(_scalar(v), str) or v[:1] in '"['):  # text that reads as another type
            return f'"{v}"'
        return str(v).lower() if isinstance(v, bool) else str(v)

    return ",".join(f"{k}={text(v)}" for k, v in options.items())


def env_argument_defaults(env: str) -> dict[str, Any]:
    """The env's constructor arguments and their defaults, where they are known (VR-edge's); ``{}`` for others."""
    if env != "VREdge-v0":
        return {}
    from envs import VREdgeConfig
    return VREdgeConfig().to_dict()


_UNSET = object()  # an argument neither the run nor the env's defaults set


def moved_env_files(stored: str, given: str, defaults: dict[str, Any] | None = None) -> str:
    """The stored ``env_kwargs`` with the file arguments of ``given`` (``PATH_ENV_KWARGS``, made absolute) put
    in: a run's trace files moved. ``ConfigError`` if ``given`` sets anything else to another value than the
    run's (``defaults``: the env's, for what the run left at its default).

    >>> moved_env_files("num_users=6,capacity_trace=/old/traces", "capacity_trace=/new/traces")
    'num_users=6,capacity_trace=/new/traces'
    """
    old, new, defaults = parse_env_kwargs(stored), parse_env_kwargs(given), defaults or {}
    changed = sorted(k for k, v in new.items() if (k not in PATH_ENV_KWARGS or k not in old)
                     and old.get(k, defaults.get(k, _UNSET)) != v)
    if changed:  # a usage error, as a resume's other flags that would change the run
        has = ", ".join(format_env_kwargs({k: old[k]}) if k in old else f"{k} at the env's default" for k in changed)
        asked = format_env_kwargs({k: new[k] for k in changed})
        raise ConfigError("env_kwargs", given, message=(
            f"--env-kwargs: {asked} would change the run (it has {has}); drop "
            f"{'it' if len(changed) == 1 else 'them'}, or start a new run (only the run's own "
            f"{', '.join(sorted(PATH_ENV_KWARGS))} may point elsewhere, where its files moved)"))
    return TrainConfig(env_kwargs=format_env_kwargs({**old, **new})).with_absolute_paths().env_kwargs


def _scalar(text: str) -> Any:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text

