"""Training configuration: one dataclass, validated, exposed as CLI flags and TOML keys."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from collectors import BACKENDS


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

    HELP = {
        "algo": "ppo (actor-critic, on-policy) or apex (Ape-X: epsilon-greedy actors, prioritized replay, "
                "double DQN; Discrete and MultiDiscrete actions)",
        "env": "any registered Gymnasium env id (VREdge-v0 uses the natively batched env)",
        "env_kwargs": "env constructor arguments, key=value,key=value (numbers, true/false or text), e.g. "
                      "num_users=6 or capacity_trace=traces/,trace_split=train for VR-edge",
        "backend": "rollout backend: serial, sync, async or ray",
        "num_envs": "parallel envs", "num_steps": "steps per env per rollout",
        "total_steps": "env steps to train for", "seed": "run seed (envs, init, sampling)",
        "device": "auto (cuda when available), cpu or cuda",
        "run_dir": "run directory of a new run (default runs/<env>-s<seed>-<time>)",
        "num_workers": "async worker processes or ray actors (0: from the run layout: one busy process per core, "
                       "or the actors the Ray cluster's CPUs hold)",
        "num_splits": "async: env groups stepped double-buffered (2: the workers step one half of the envs while "
                      "the policy acts on the other; 1: lockstep); pays off for envs with costly steps",
        "threads": "torch threads of this process (0: from the run layout: the cores the workers leave free while "
                   "collecting, all cores while learning)",
        "lr": "Adam learning rate",
        "anneal_lr": "linear LR annealing to 0 over total_steps", "gamma": "discount",
        "gae_lambda": "ppo: GAE lambda", "epochs": "ppo: PPO epochs per rollout",
        "batch_size": "ppo: minibatch size (0: planner picks from num_envs x num_steps)",
        "clip_coef": "ppo: PPO clip range", "clip_value": "ppo: clip the value loss too",
        "ent_coef": "ppo: entropy bonus", "vf_coef": "ppo: value loss weight", "max_grad_norm": "global grad-norm clip",
        "norm_adv": "ppo: normalise advantages per minibatch",
        "target_kl": "ppo: early-stop epochs above this KL (0: off)",
        "normalize_obs": "ppo: running observation normalisation",
        "scale_rewards": "ppo: divide rewards by running return std",
        "hidden": "hidden layer sizes, comma separated",
        "policy_arch": "actor: flat MLP, per_head (one MLP shared by all action heads; needs an env that declares "
                       "head_observation_layout, like VR-edge), or auto (per_head where declared)",
        "shared_trunk": "ppo: one trunk for actor and critic",
        "tensorboard": "also log to TensorBoard (needs the tensorboard extra)",
        "ray_address": "ray backend: cluster address (empty: reuse a running Ray or start a local one)",
        "envs_per_worker": "async/ray: envs per process or actor (0: from the run layout)",
        "cpus_per_worker": "ray backend: CPUs reserved per actor (fractions allowed)",
        "ray_async": "ppo: ray backend: IMPALA-style collection with V-trace correction",
        "overlap": "ppo: collect the next rollout in a separate process while learning on this one (a fixed policy lag "
                   "of one update; serial, sync and async backends)",
        "overlap_targets": "ppo: overlap: vtrace (V-trace corrects the targets for the one-update lag) or gae (stored "
                           "values, PPO ratio against the behaviour log-probs)",
        "max_lag": "ppo: ray_async: drop batches collected more than this many policy versions ago",
        "rho_bar": "ppo: V-trace importance-weight clip for the targets and advantages",
        "c_bar": "ppo: V-trace trace-cutting clip",
        "checkpoint_every": "save a checkpoint every this many iterations (and at the end)",
        "keep_checkpoints": "how many checkpoint files to keep in <run-dir>/checkpoints",
        "eval_every": "every this many iterations, play the greedy policy on held-out validation episodes, log it "
                      "(VR-edge: paired against the best baseline) and point <run-dir>/checkpoints/best at the best "
                      "(0: off)",
        "eval_episodes": "validation episodes for --eval-every (seeds disjoint from training and trainer.evaluate)",
        "replay_capacity": "apex: transitions the replay holds (FIFO); its memory is printed at start",
        "replay_alpha": "apex: priority exponent (0: uniform sampling)",
        "replay_beta": "apex: importance-sampling exponent at the start, annealed linearly to 1 over total_steps",
        "replay_ratio": "apex: transitions the learner samples per transition entering the replay",
        "apex_batch_size": "apex: learner minibatch size",
        "n_step": "apex: steps of the n-step return",
        "target_update": "apex: copy the online network into the target network every this many learner steps",
        "weights_every": "apex: the actors pull the learner's weights every this many steps per env (rounded up "
                         "to whole rollouts of num_steps)",
        "learning_starts": "apex: transitions in the replay before the learner starts",
        "eps_base": "apex: exploration rate of env i is eps_base^(1 + eps_alpha * i / (num_envs - 1))",
        "eps_alpha": "apex: see eps_base",
        "save_replay": "apex: also save the replay's contents in every checkpoint, for an exact resume; it can be "
                       "gigabytes (replay_capacity x the bytes per transition printed at start); without it a "
                       "resumed run refills the replay",
        "config": "TOML file with any of these keys (flags override it)",
    }

    def validate(self) -> None:
        """Raise :class:`ConfigError` (a ``ValueError`` naming the key) for the first invalid value."""
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ConfigError(name, getattr(self, name), rule)
        for f in fields(self):  # inf or nan anywhere makes no sense and would fail much later
            value = getattr(self, f.name)
            need(not isinstance(value, float) or math.isfinite(value), f.name, "must be a finite number")
        need(self.seed >= 0, "seed", "must be >= 0")
        need(self.algo in ("ppo", "apex"), "algo", "choose ppo or apex")
        if self.algo == "apex":
            self._validate_apex(need)
        try:
            options = self.env_options
        except ValueError as e:
            need(False, "env_kwargs", str(e))
        if self.env == "VREdge-v0":  # a typo would otherwise surface as a TypeError from deep inside gym.make
            from envs import VREdgeConfig
            known = VREdgeConfig().to_dict()
            unknown = sorted(set(options) - set(known))
            need(not unknown, "env_kwargs", f"VR-edge has no argument {', '.join(unknown)}; its arguments are "
                 f"{', '.join(known)}")
        need(self.backend in BACKENDS, "backend", f"choose {', '.join(BACKENDS)}")
        need(not self.ray_async or self.backend == "ray", "ray_async", "needs --backend ray")
        need(self.max_lag >= 0, "max_lag", "must be >= 0")
        need(not self.overlap or self.backend != "ray", "overlap",
             "works with --backend serial, sync or async; with Ray, --ray-async true keeps the actors collecting "
             "while the learner learns")
        need(self.overlap_targets in ("gae", "vtrace"), "overlap_targets", "choose gae or vtrace")
        need(self.policy_arch in ("auto", "flat", "per_head"), "policy_arch", "choose auto, flat or per_head")
        need(self.rho_bar > 0 and self.c_bar > 0, "rho_bar", "rho_bar and c_bar must be > 0")
        need(self.cpus_per_worker > 0, "cpus_per_worker", "must be > 0")
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
        need(self.num_splits == 1 or self.backend == "async", "num_splits", "needs --backend async")
        need(self.threads >= 0, "threads", "must be >= 0 (0: from the run layout)")
        need(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"), "device",
             "use auto, cpu or cuda")
        try:
            sizes = self.hidden_sizes
        except ValueError:
            sizes = ()
        need(len(sizes) > 0 and all(s > 0 for s in sizes), "hidden", "comma-separated positive sizes, e.g. 64,64")

    def _validate_apex(self, need) -> None:
        need(not self.overlap, "overlap", "is for --algo ppo; Ape-X's actors already act with stale weights")
        need(not self.ray_async, "ray_async", "is for --algo ppo; --algo apex --backend ray collects from the "
             "actors as they finish by itself")
        for name in ("replay_capacity", "apex_batch_size", "n_step", "target_update", "weights_every"):
            need(getattr(self, name) >= 1, name, "must be >= 1")
        need(self.learning_starts >= 0, "learning_starts", "must be >= 0 (0: learn from the first transitions)")
        need(self.learning_starts <= self.replay_capacity, "learning_starts",
             f"must be <= --replay-capacity ({self.replay_capacity}), or learning never starts")
        need(self.replay_alpha >= 0, "replay_alpha", "must be >= 0 (0: uniform sampling)")
        need(0 <= self.replay_beta <= 1, "replay_beta", "must be in [0, 1]")
        need(self.replay_ratio > 0, "replay_ratio", "must be > 0")
        need(0 < self.eps_base <= 1, "eps_base", "must be in (0, 1]")
        need(self.eps_alpha >= 0, "eps_alpha", "must be >= 0")

    @property
    def env_options(self) -> dict[str, Any]:
        """``env_kwargs`` as keyword arguments: ``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}``."""
        return parse_env_kwargs(self.env_kwargs)

    @property
    def hidden_sizes(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.hidden.split(","))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ConfigError(ValueError):
    """An invalid config value; ``key`` names it (a flag on the command line, a key in a TOML file)."""

    def __init__(self, key: str, value: Any, rule: str) -> None:
        super().__init__(f"--{key.replace('_', '-')}={value!r} is invalid: {rule}")
        self.key, self.value, self.rule = key, value, rule


class _Parser(argparse.ArgumentParser):
    """Errors as one line that says what to change, without the 40-line usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


# keys a resumed run may change; every other key must match the checkpoint's config
RESUMABLE_CHANGES = {"total_steps", "anneal_lr", "device", "num_workers", "threads", "tensorboard", "checkpoint_every",
                     "keep_checkpoints", "config", "ray_address", "cpus_per_worker", "eval_every", "eval_episodes",
                     "save_replay"}
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _field_type(f: dataclasses.Field) -> type:
    return {"bool": bool, "int": int, "float": float, "str": str}.get(str(f.type), f.type)


def build_parser() -> argparse.ArgumentParser:
    """Every config field as a flag. Defaults are left out of the namespace (``SUPPRESS``), so
    that what it holds is exactly what the user typed, whatever the value."""
    p = _Parser(prog="python -m trainer.train", description="Train a policy: PPO (default) or Ape-X (--algo apex).")
    for f in fields(TrainConfig):
        kind = _field_type(f)
        p.add_argument(f"--{f.name.replace('_', '-')}", type=_bool if kind is bool else kind,
                       default=argparse.SUPPRESS, help=f"{TrainConfig.HELP.get(f.name, '')} (default: {f.default!r})")
    p.add_argument("--resume", default="", metavar="RUN_DIR_OR_CHECKPOINT",
                   help="continue a run from its newest loadable checkpoint (or from this checkpoint file); "
                        "writes into that run directory")
    p.add_argument("--overwrite", action="store_true",
                   help="start a new run in a --run-dir that holds another run, deleting its checkpoints and metrics")
    return p


def _toml_values(path: Path) -> dict[str, Any]:
    """The TOML file's settings, each checked against its field's type (one-line errors naming the key)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"cannot read config file {path}: {e}") from None
    types = {f.name: _field_type(f) for f in fields(TrainConfig) if f.name != "config"}
    unknown = set(data) - set(types)
    if unknown:
        raise ValueError(f"unknown keys in {path}: {', '.join(sorted(unknown))} (keys are the flag names with "
                         "underscores, see --help)")
    values = {}
    for key, value in data.items():
        kind = types[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            example = {bool: "true", int: "4", float: "0.5", str: '"64,64"' if key == "hidden" else '"..."'}[kind]
            raise ValueError(f"{path}: {key} = {value!r} is {type(value).__name__}, expected {_KINDS[kind]} "
                             f"(e.g. {key} = {example})")
        values[key] = value
    return values


@dataclass(frozen=True)
class CommandLine:
    """A parsed ``trainer.train`` command line: the config, what the user gave, and the run-directory options."""

    config: TrainConfig
    given: dict[str, Any]  # keys from flags or the TOML file, whatever their value (flags win over the file)
    resume: str
    overwrite: bool


def parse_args(argv: list[str] | None = None) -> CommandLine:
    """Parse flags over TOML file over defaults; validated. Bad input exits with a one-line error."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    resume, overwrite = args.pop("resume"), args.pop("overwrite")
    from_file: dict[str, Any] = {}
    try:
        from_file = _toml_values(Path(args["config"])) if args.get("config") else {}
        given = {**from_file, **args}
        cfg = TrainConfig(**{**{f.name: f.default for f in fields(TrainConfig)}, **given})
        cfg.validate()
        check_algo_flags(cfg, given)
    except ConfigError as e:
        if e.key in from_file and e.key not in args:
            parser.error(f"{args['config']}: {e.key} = {e.value!r} is invalid: {e.rule}")
        parser.error(str(e))
    except ValueError as e:
        parser.error(str(e))
    if resume and overwrite:
        parser.error("--overwrite starts a new run; it cannot be combined with --resume")
    return CommandLine(cfg, given, resume, overwrite)


def check_algo_flags(cfg: TrainConfig, given: dict[str, Any]) -> None:
    """Refuse settings the chosen ``--algo`` would ignore (their help starts with the other algorithm's name):
    a user who sets ``--epochs`` for Ape-X, or ``--n-step`` for PPO, would otherwise believe it took effect."""
    other = "apex" if cfg.algo == "ppo" else "ppo"
    ignored = sorted(k for k in given if TrainConfig.HELP.get(k, "").startswith(other + ":"))
    if ignored:
        flags = ", ".join("--" + k.replace("_", "-") for k in ignored)
        hint = " (the Ape-X learner's minibatch is --apex-batch-size)" if "batch_size" in ignored else ""
        raise ValueError(f"{flags}: for --algo {other} only, and this run is --algo {cfg.algo}, which would ignore "
                         f"{'it' if len(ignored) == 1 else 'them'}{hint}; drop {'it' if len(ignored) == 1 else 'them'}")


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """The validated config of a command line (no resume)."""
    return parse_args(argv).config


def resumed_config(saved: dict[str, Any], given: dict[str, Any], source: str) -> TrainConfig:
    """The checkpoint's config with the given flags applied; flags that would change the run are an error."""
    clash = {k: (saved.get(k), v) for k, v in given.items() if k not in RESUMABLE_CHANGES and saved.get(k) != v}
    if clash:
        detail = ", ".join(f"--{k.replace('_', '-')}={new!r} (run has {old!r})" for k, (old, new) in clash.items())
        raise ValueError(f"{source}: the flags do not match the run being resumed: {detail}. Drop them, or start "
                         f"a new run; only {', '.join(sorted(RESUMABLE_CHANGES - {'config'}))} may change")
    known = {f.name for f in fields(TrainConfig)}
    cfg = TrainConfig(**{**{k: v for k, v in saved.items() if k in known}, **given})
    cfg.validate()
    return cfg


def parse_env_kwargs(text: str) -> dict[str, Any]:
    """``key=value`` pairs separated by commas; values are ints, floats, ``true``/``false`` or text.

    >>> parse_env_kwargs("num_users=6,trace_split=train,noise_std=0.1,shared=true")
    {'num_users': 6, 'trace_split': 'train', 'noise_std': 0.1, 'shared': True}
    """
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.isidentifier():
            raise ValueError(f"{item!r} is not key=value (write e.g. num_users=6,trace_split=train)")
        if key in out:
            raise ValueError(f"{key} is given twice")
        out[key] = _scalar(value)
    return out


def _scalar(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text

