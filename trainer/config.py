"""The training run's settings: the run's and the collection's, and the learning settings every algorithm reads,
each declared once with its help and limits (``envs.settings.setting``); an algorithm's own settings are its
package's (``trainer.ppo.settings``, ``trainer.apex.settings``) and ride along in ``algo_settings``. All of it
is stored in every checkpoint as one flat dict (:meth:`TrainConfig.to_dict`). ``trainer.flags`` exposes the
settings as command-line flags (grouped by owner) and TOML keys."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from collectors.backend_names import BACKENDS
from envs.profiles import profile_of
from envs.settings import FORMER_NAMES, ConfigError, check_limits, did_you_mean, flag_name, limits_of, setting
from trainer.algorithm import AlgorithmSpec
from trainer.registry import ALGORITHMS, algorithm_spec, default_settings, owners, reads, settings_class

__all__ = ["TrainConfig", "parse_env_kwargs", "format_env_kwargs"]

# env arguments that name files: stored absolute (a run's printed commands work from any directory), and the
# ones a resumed run or trainer.evaluate may point elsewhere (the files moved; the run is the same)
PATH_ENV_KWARGS = frozenset({"capacity_trace", "user_traces"})  # (a shipped set's name stays a name)
COMPILE_CHOICES = ("auto", "on", "off")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
START_METHOD_CHOICES = ("auto", "forkserver", "spawn")
# torch seeds a generator with an unsigned 64-bit integer, and PPO's policy samples from one seeded with seed + 1
MAX_SEED = 2**64 - 2
# the --help groups of the run's settings besides "run" (``setting(group=...)``; an algorithm's are under its name)
COLLECTION = "collection"
LEARNING = "learning (every algorithm)"


@dataclass
class TrainConfig:
    """A run's settings. ``algo_settings`` holds its algorithm's own (``PPOSettings``, ``ApeXSettings``: the
    registered algorithm's ``settings`` class, with its defaults where none are given).

    Example:
        >>> cfg = TrainConfig.from_dict({"env": "CartPole-v1", "num_envs": 8})
        >>> cfg.num_envs, type(cfg.algo_settings).__name__, cfg.to_dict()["num_envs"]
        (8, 'PPOSettings', 8)
    """

    # the run
    algo: str = setting("ppo", "the algorithm (trainer.registry)")
    env: str = setting("VREdge-v0", "any registered Gymnasium env id (VREdge-v0 uses the natively batched env)")
    env_kwargs: str = setting("", "env constructor arguments, key=value,key=value (numbers, true/false, text or "
                              "[lists]), e.g. num_users=6, capacity_trace=traces/,trace_split=train or "
                              "'bitrates_mbps=[5,10,20,40]' for VR-edge")
    total_steps: int = setting(3_000_000, "env steps to train for", at_least=1, resumable=True)
    seed: int = setting(1, "run seed (envs, init, sampling)", at_least=0, at_most=MAX_SEED)
    device: str = setting("auto", "where the learner runs: auto (cuda when available), cpu, cuda or cuda:N",
                          resumable=True)
    run_dir: str = setting("", "run directory of a new run (default runs/<env>-s<seed>-<time>)")
    checkpoint_every: int = setting(10, "save a checkpoint every this many iterations (and at the end)", at_least=1,
                                    resumable=True)
    keep_checkpoints: int = setting(3, "how many checkpoint files to keep in <run-dir>/checkpoints", at_least=1,
                                    resumable=True)
    eval_every: int = setting(0, "every this many iterations, play the greedy policy on held-out validation "
                              "episodes, log it (VR-edge: paired against the best baseline) and point "
                              "<run-dir>/checkpoints/best at the best", at_least=0, zero="off", resumable=True)
    eval_episodes: int = setting(16, "validation episodes (seeds disjoint from training and trainer.evaluate): "
                                 "for --eval-every, and at the end of a run, where its policy plays them and one "
                                 "line says how good it is (VR-edge: against the best baseline there)", at_least=0,
                                 zero="no validation at the end", resumable=True)
    curriculum_every: int = setting(0, "every this many iterations, play the greedy policy and the env's baselines "
                                    "in each of the conditions the env declares (VR-edge: condition_grid) and draw "
                                    "more episodes where the best baseline beats the policy most (Genet's "
                                    "curriculum; trainer/curriculum.py)", at_least=0, zero="off", flag=False)
    curriculum_episodes: int = setting(8, "episodes per condition and player of each curriculum_every update",
                                       at_least=1, flag=False)
    tensorboard: bool = setting(False, "also log to TensorBoard, in <run-dir>/tb (needs the tensorboard extra)",
                                resumable=True)
    wandb: str = setting("", "also log to Weights & Biases, in this project (empty: off; needs the wandb extra): "
                         "the run named for its directory, its files in <run-dir>/wandb; WANDB_ENTITY picks the "
                         "team, WANDB_MODE=offline needs no network", resumable=True)
    config: str = setting("", "TOML file with any of these keys (flags override it)", resumable=True)
    # the collection
    backend: str = setting("sync", "rollout backend: serial, sync, async, device (VR-edge as torch tensors on "
                           "--device, next to the acting policy) or ray", choices=BACKENDS, group=COLLECTION)
    num_envs: int = setting(64, "parallel envs (with --num-steps, as many as the memory holds: checked at start)",
                            at_least=1, group=COLLECTION)
    num_steps: int = setting(128, "steps per env per rollout (with --num-envs, as many as the memory holds: "
                             "checked at start)", at_least=1, group=COLLECTION)
    num_workers: int = setting(0, "async worker processes or ray actors", at_least=0, zero="from the run layout: "
                               "one busy process per core, or the actors the Ray cluster's CPUs hold",
                               group=COLLECTION, resumable=True)
    envs_per_worker: int = setting(0, "async/ray: envs per process or actor", at_least=0,
                                   zero="from the run layout", flag=False, group=COLLECTION)
    num_splits: int = setting(1, "async: env groups stepped double-buffered (2: the workers step one half of the "
                              "envs while the policy acts on the other; 1: lockstep); pays off only for envs with "
                              "costly steps", at_least=1, flag=False, group=COLLECTION)
    threads: int = setting(0, "torch threads per phase (collecting, learning)", at_least=0, zero="chosen by timing "
                           "the run's first iterations, for runs of 100 iterations or more (docs/benchmarks.md)",
                           group=COLLECTION, resumable=True)
    compile: str = setting("auto", "torch.compile the hot paths as fixed-shape graphs (the acting step: policy and "
                           "torch env; PPO's loss): auto (on for --backend device, and for PPO runs of at least 2M "
                           "env steps, where it paid for its compile time: 1.39x on 2 cores), on or off; needs a "
                           "C++ compiler on the CPU (Triton on CUDA): where there is none, auto says so and runs "
                           "eagerly", choices=COMPILE_CHOICES, group=COLLECTION, resumable=True)
    overlap: bool = setting(False, "collect the next rollout in a separate process while learning on this one (a "
                            "fixed policy lag of one update; serial, sync and async backends)", group=COLLECTION)
    keep_collecting: bool = setting(False, "ray backend: the actors keep collecting while the learner learns "
                                    "(IMPALA-style, V-trace corrects for the lag)", group=COLLECTION)
    ray_address: str = setting("", "ray backend: cluster address (empty: reuse a running Ray or start a local one)",
                               group=COLLECTION, resumable=True)
    cpus_per_worker: float = setting(1.0, "ray backend: CPUs reserved per actor (fractions allowed)", above=0,
                                     flag=False, group=COLLECTION, resumable=True)
    worker_timeout: float = setting(60.0, "seconds an async worker, the --overlap collecting process, a Ray actor or "
                                    "a call of the envs this process steps (sync, serial, validation) may stay "
                                    "silent (a hung env step, a stopped process) before the run stops, or the actor "
                                    "is replaced; stretched to 20x the slowest answer measured",
                                    above=0, at_most=1e6, group=COLLECTION, resumable=True)
    start_method: str = setting("auto", "how async workers and the --overlap collecting process start: forkserver "
                                "(forked from a server that has imported torch once: ~30 ms each), spawn (a fresh "
                                "interpreter each, importing torch: seconds; Windows has only this) or auto "
                                "(forkserver where the platform has one)", choices=START_METHOD_CHOICES, flag=False,
                                group=COLLECTION, resumable=True)
    # learning, as every algorithm does it
    lr: float = setting(1e-3, "Adam learning rate", above=0, group=LEARNING)
    anneal_lr: bool = setting(True, "linear LR annealing to 0 over total_steps", group=LEARNING, resumable=True)
    gamma: float = setting(0.9, "discount", above=0, at_most=1, group=LEARNING)
    max_grad_norm: float = setting(0.5, "global grad-norm clip", above=0, group=LEARNING)
    hidden: str = setting("64,64", "hidden layer sizes, comma separated", group=LEARNING)
    policy_arch: str = setting("auto", "network: flat MLP, per_head (one MLP shared by all action heads; needs an "
                               "env that declares head_observation_layout, like VR-edge), set (PPO: one encoder "
                               "shared by all users, a pooled summary of the active ones, a head per user; acts at "
                               "any user count; needs head_observation_layout), or auto (set where the env also "
                               "declares active_user_feature, per_head where it declares head_observation_layout)",
                               choices=("auto", "flat", "per_head", "set"), flag=False, group=LEARNING)
    # the algorithm's own settings (its package's dataclass); not a flag: its fields are
    algo_settings: Any = dataclasses.field(default=None, compare=True, metadata={"flag": False})

    def __post_init__(self) -> None:
        if self.algo_settings is None:  # (an unknown algorithm has none: validate() names the choices)
            self.algo_settings = default_settings(self.algo)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], stored: bool = False) -> TrainConfig:
        """The config of flat ``values`` (as :meth:`to_dict` writes them, or a TOML file): the run's keys here, the
        algorithm's in its settings. ``ConfigError`` for a key that neither this config nor the algorithm has,
        unless ``stored`` (a config stored by an older version, which held every algorithm's settings: the others'
        are left out)."""
        algo = values.get("algo", cls.algo)
        values = {k.replace("-", "_"): v for k, v in values.items()}  # as a TOML file may spell them
        if not stored:  # a stored config of an older version held every algorithm's settings
            check_owners(algo, values)  # another algorithm's setting is named as such, not as unknown
        own = {f.name for f in fields(cls)} - {"algo_settings"}
        settings = settings_class(algo)
        theirs = {f.name for f in fields(settings)}
        unknown = sorted(set(values) - own - theirs)
        if unknown and not stored:
            raise ConfigError(unknown[0], values[unknown[0]], message=f"unknown settings {', '.join(unknown)}"
                              f"{did_you_mean(unknown, own | theirs)}")
        return cls(**{k: v for k, v in values.items() if k in own},
                   algo_settings=settings(**{k: v for k, v in values.items() if k in theirs}))

    def to_dict(self) -> dict[str, Any]:
        """Every setting, flat: the run's and the algorithm's (what a checkpoint and ``config.json`` store)."""
        mine = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "algo_settings"}
        return {**mine, **(dataclasses.asdict(self.algo_settings) if self.algo_settings is not None else {})}

    def replaced(self, **changes: Any) -> TrainConfig:
        """This config with ``changes`` (flat keys, the run's or the algorithm's)."""
        return TrainConfig.from_dict({**self.to_dict(), **changes})

    def validate(self) -> None:
        """Raise :class:`ConfigError` (a ``ValueError`` naming the key) for the first invalid value: outside its
        declared limits, or breaking a rule between settings (the algorithm's own: its ``check_config``)."""
        spec = algorithm_spec(self.algo)
        if self.start_method == "fork":  # a choice that is not one, for a reason worth saying
            raise ConfigError("start_method", "fork", "must not be fork: a forked copy of a lock held by one of this "
                              "process's threads (torch's) can hang the child; use auto, forkserver or spawn",
                              flag=False)
        check_limits(self)
        self._check_env_kwargs()
        rules = [  # (ok, key, rule)
            (re.fullmatch(r"(ray://)?[\w.\-\[\]:]+:\d+|auto|", self.ray_address) is not None, "ray_address",
             "must be the HOST:PORT that `ray start --head` printed (e.g. 10.0.0.1:6379), or auto"),
            (not self.keep_collecting or self.backend == "ray", "keep_collecting", "needs --backend ray"),
            (not self.overlap or self.backend not in ("ray", "device"), "overlap",
             "needs --backend serial, sync or async (ray: --keep-collecting true keeps the actors collecting while "
             "the learner learns; device: its env steps on the learner's device, between updates)"),
            (self.num_splits == 1 or self.backend == "async", "num_splits", "needs --backend async"),
            (self.eval_episodes or not self.eval_every, "eval_episodes", "must be >= 1 with --eval-every"),
            (re.fullmatch(r"[1-9]\d*(,[1-9]\d*)*", self.hidden) is not None, "hidden",
             "must be comma-separated positive sizes, e.g. 64,64"),
            (re.fullmatch(r"[^/\\#?%:]{0,128}", self.wandb) is not None, "wandb",
             "must be a W&B project name: at most 128 characters, none of / \\ # ? % :"),
        ]
        for ok, key, rule in rules:
            if not ok:
                raise ConfigError(key, getattr(self, key), rule, flag=limits_of(self.__dataclass_fields__[key]).flag)
        if self.device not in DEVICE_CHOICES and re.fullmatch(r"cuda:\d+", self.device) is None:
            raise ConfigError("device", self.device, "must be auto, cpu, cuda or cuda:N", hint=(
                " (did you mean cuda?)" if self.device.lower() == "gpu" else did_you_mean(self.device, DEVICE_CHOICES)))
        if self.curriculum_every and (why := _curriculum_refusal(self.env, self.env_options, self.backend,
                                                                           self.overlap)):
            raise ConfigError("curriculum_every", self.curriculum_every, why, flag=False)
        check_limits(self.algo_settings)
        spec.check_config(self)

    def _check_env_kwargs(self) -> None:
        """``env_kwargs``: its syntax, and where the env's profile declares its arguments every one's name and value
        (a typo would otherwise surface as a TypeError from deep inside gym.make)."""
        try:
            options = self.env_options
        except ValueError as e:
            raise ConfigError("env_kwargs", self.env_kwargs, message=f"--env-kwargs: {e}") from None
        if "render_mode" in options:
            raise ConfigError("env_kwargs", self.env_kwargs, message="--env-kwargs render_mode: training renders "
                              "no env (they step in batches, in this process or in workers); drop it")
        known = env_argument_defaults(self.env)
        if not known:  # an env whose arguments are not declared: gym.make checks them
            return
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigError("env_kwargs", self.env_kwargs, message=f"--env-kwargs: {self.env} has no argument "
                              f"{', '.join(unknown)}{did_you_mean(unknown, known)}; its arguments are "
                              f"{', '.join(known)}")
        try:  # every value too (types, ranges, files): a one-line error now, not one from inside gym.make
            profile_of(self.env).check_arguments(options, self.backend)
        except ValueError as e:  # the profile names the argument and its rule
            raise ConfigError("env_kwargs", self.env_kwargs, message=str(e)) from None

    @property
    def env_options(self) -> dict[str, Any]:
        """``env_kwargs`` as keyword arguments: ``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}``."""
        return parse_env_kwargs(self.env_kwargs)

    @property
    def hidden_sizes(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.hidden.split(","))

    def with_absolute_paths(self) -> TrainConfig:
        """This config with the env arguments that name files (``PATH_ENV_KWARGS``) made absolute.

        >>> TrainConfig(env_kwargs="capacity_trace=/data/traces/,trace_split=train").with_absolute_paths().env_kwargs
        'capacity_trace=/data/traces,trace_split=train'
        """
        try:
            options = self.env_options
        except ValueError:  # validate() says what is wrong with it
            return self
        from envs.traces import absolute_trace_path
        paths = {k: absolute_trace_path(v) for k, v in options.items() if k in PATH_ENV_KWARGS and isinstance(v, str)
                 and v}
        if not paths:
            return self
        return dataclasses.replace(self, env_kwargs=format_env_kwargs({**options, **paths}))


def with_current_names(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config (a checkpoint's, ``config.json``'s, a ``--seeds`` folder's setup) with its settings under
    today's names (``envs.settings.FORMER_NAMES``): the one place where an older run's names are translated.

    >>> with_current_names({"ray_async": False, "num_envs": 4})
    {'keep_collecting': False, 'num_envs': 4}
    """
    return {FORMER_NAMES.get(k, k): v for k, v in stored.items()}


def check_owners(algo: str, given: dict[str, Any]) -> None:
    """Raise ``ConfigError`` if ``given`` sets something only another algorithm than ``algo`` reads (a resumed
    run's algorithm is its checkpoint's: known only once that is read)."""
    ignored = sorted(k for k in given if not reads(algo, k))
    if ignored:
        flags = ", ".join(named(k) for k in ignored)
        readers = " or ".join(sorted({a for k in ignored for a in owners(k)}))
        them = "it" if len(ignored) == 1 else "them"
        rule = f"for --algo {readers} only, and this run is --algo {algo}, which would ignore {them}; drop {them}"
        raise ConfigError(ignored[0], given[ignored[0]], rule, message=f"{flags}: {rule}")


def setting_fields() -> list[tuple[str, dataclasses.Field]]:
    """Every setting as ``(owner, field)``: the run's (owner ``""``) then each algorithm's, in declaration order;
    a setting two algorithms declare comes once, with the first's field."""
    out = [("", f) for f in dataclasses.fields(TrainConfig) if f.name != "algo_settings"]
    seen = {f.name for _, f in out}
    for name, spec in ALGORITHMS.items():
        out += [(name, f) for f in dataclasses.fields(spec.Settings) if f.name not in seen]
        seen |= {f.name for f in dataclasses.fields(spec.Settings)}
    return out


def named(key: str) -> str:
    """A setting as a message names it: its flag, or its TOML key where it has none.

    >>> named("num_envs"), named("max_lag")
    ('--num-envs', 'max_lag')
    """
    flagless = {f.name for _, f in setting_fields() if not limits_of(f).flag}
    return key if key in flagless else flag_name(key)


def new_run_config(given: dict[str, Any], gpu: bool = False) -> TrainConfig:
    """The config of a new run from the settings the user gave (flags, TOML keys): those win over the
    algorithm's defaults for the env, which win over ``TrainConfig``'s own; env file paths made absolute, so
    that the commands a run prints work from any directory (``TrainConfig.with_absolute_paths``).

    >>> cfg = new_run_config({"algo": "apex", "env": "CartPole-v1", "gamma": 0.95})
    >>> cfg.num_envs, cfg.gamma, type(cfg.algo_settings).__name__
    (8, 0.95, 'ApeXSettings')
    """
    algo, env = given.get("algo", TrainConfig.algo), given.get("env", TrainConfig.env)
    return TrainConfig.from_dict({**algorithm_spec(algo).defaults_for(env, gpu), **given}).with_absolute_paths()


def algorithm_defaults() -> dict[str, dict[tuple[str, str], Any]]:
    """For each setting (in :func:`setting_fields`' order) whose default depends on the algorithm or the env:
    its default per ``(algo, env)`` (env ``"*"``: every env the algorithm names no defaults for).

    >>> algorithm_defaults()["num_envs"][("apex", "*")], algorithm_defaults()["num_envs"][("ppo", "VREdge-v0")]
    (8, 64)
    """
    envs = [(env, False) for env in sorted({e for spec in ALGORITHMS.values() for e in spec.defaults} - {"*"})]
    envs += [("*", False)] + [(env, True) for env in sorted({e for s in ALGORITHMS.values() for e in s.gpu_defaults})]
    out = {}
    for _, f in setting_fields():
        readers = owners(f.name) or tuple(ALGORITHMS)
        per = {(algo, f"{env} with a GPU" if gpu else env): spec.defaults_for(env, gpu).get(f.name, _default(spec, f))
               for algo, spec in ALGORITHMS.items() if algo in readers
               for env, gpu in envs if not gpu or env in spec.gpu_defaults}
        if len(set(map(repr, per.values()))) > 1:
            out[f.name] = per
    return out


def _default(spec: type[AlgorithmSpec], f: dataclasses.Field) -> Any:
    """The declared default of the setting ``f`` for the algorithm ``spec`` (its own field's, where it declares
    one of that name)."""
    own = spec.Settings.__dataclass_fields__.get(f.name)
    return (own or f).default


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
    """The env's constructor arguments and their defaults, where its profile declares them; ``{}`` for others."""
    return profile_of(env).arguments()


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


def _curriculum_refusal(env: str, env_kwargs: dict[str, Any], backend: str, overlap: bool) -> str:
    """Why ``--curriculum-every`` cannot run on these arguments (``""``: it can), naming the fix."""
    conditions = profile_of(env).conditions
    if conditions is None or not conditions.bins(env_kwargs):
        return ("needs conditions a curriculum can reweigh: an env that declares them, with the arguments that "
                "make them (VR-edge, --env-kwargs condition_grid=N with capacity_scale and outage_prob as ranges)")
    if overlap:
        return ("needs --overlap false: it reweighs the envs between iterations, and with --overlap the next "
                "rollout is already under way then")
    if backend not in ("serial", "sync", "async"):
        return (f"needs --backend serial, sync or async: it reweighs the envs between iterations through the "
                f"collector's state, built and tested on those backends, not on {backend}")
    return ""
