"""``trainer.train``'s command line: every setting a TOML key, and a flag where it earned one
(``envs.settings``), grouped in ``--help`` by owner: the run, the collection, learning, then each algorithm.

Flags override the TOML file (``--config``), which overrides the defaults: the algorithm's for the env
(``AlgorithmSpec.defaults``: Ape-X on CartPole runs other sizes than PPO on VR-edge), then the declared ones.
A setting only another algorithm reads is refused (a user who sets ``--epochs`` for Ape-X, or ``--n-step`` for
PPO, would otherwise believe it took effect); each algorithm declares its own settings (``AlgorithmSpec.Settings``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from collectors.backend_names import LOCAL_BACKENDS
from envs.settings import ConfigError, did_you_mean, flag_name, group_of, help_of, is_resumable, limits_of, spelled
from trainer.arguments import OneLineParser, seed_list
from trainer.config import (
    MAX_SEED,
    PATH_ENV_KWARGS,
    TrainConfig,
    algorithm_defaults,
    check_owners,
    env_argument_defaults,
    format_env_kwargs,
    moved_env_files,
    named,
    new_run_config,
    parse_env_kwargs,
    setting_fields,
)
from trainer.registry import (
    ALGORITHMS,
    algorithm_spec,
    owners,
    reads,
    settings_class,
    takes_gpu_defaults,
)

# keys a resumed run may change (declared ``setting(..., resumable=True)``); every other key must match the
# checkpoint's config
RESUMABLE_CHANGES = frozenset(f.name for _, f in setting_fields() if is_resumable(f))
# backends a resumed run may move between (not Ray's: its actors, and with --keep-collecting its algorithm, are
# another run's)
SWITCHABLE_BACKENDS = (*LOCAL_BACKENDS, "device")
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_TOML_TYPES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
               dict: "a table"}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _compile_choice(text: str) -> str:
    """``--compile``: ``auto``, ``on`` or ``off``, and the spellings of true and false that every switch takes."""
    with contextlib.suppress(argparse.ArgumentTypeError):
        return "on" if _bool(text) else "off"
    return text


def _of_kind(value: Any, kind: type) -> tuple[bool, Any]:
    """Whether ``value`` is of a config field's ``kind`` (a bool is not an int; an int is a float), and the
    value as that kind."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return True, float(value)
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool)), value


def _field_type(f: dataclasses.Field) -> type:
    return {"bool": bool, "int": int, "float": float, "str": str}.get(str(f.type), f.type)


def _types(algo: str | None = None) -> dict[str, type]:
    """Every setting's type by name: the run's and every algorithm's, or only ``algo``'s besides the run's."""
    return {f.name: _field_type(f) for _, f in setting_fields() if algo is None or reads(algo, f.name)}


def _help(f: dataclasses.Field) -> str:
    """A setting's help: which algorithms ``--algo`` offers, or what it means, with its limits; each owner's
    where several algorithms declare it."""
    if f.name == "algo":
        *others, last = (f"{n} ({cls.description})" for n, cls in ALGORITHMS.items())
        return f"{', '.join(others)} or {last}" if others else last
    mine = [settings_class(a).__dataclass_fields__[f.name] for a in owners(f.name)] or [f]
    texts = [help_of(g) + (f" ({rule})" if (rule := limits_of(g).rule()) and not limits_of(g).choices else "")
             for g in mine]
    return texts[0] if len(set(texts)) == 1 else "; ".join(f"{a}: {t}" for a, t in zip(owners(f.name), texts))


def _group(owner: str, f: dataclasses.Field) -> str:
    """The ``--help`` group of a setting: its algorithm's, or the one it declares (``setting(group=...)``: the
    collection's, learning's), or the run's."""
    if owner:
        return f"{owner} ({ALGORITHMS[owner].description})"
    return group_of(f) or "run"


def without_flags() -> list[str]:
    """The settings that have no flag: a TOML key of a ``--config`` file, or a Python argument."""
    return [f.name for _, f in setting_fields() if not limits_of(f).flag]


def _default_help(name: str, default: Any) -> str:
    """``(default: 64)``, or the default per algorithm and env where it depends on them."""
    per = algorithm_defaults().get(name)
    if per is None:
        return f"(default: {default!r})"
    parts = []
    for algo in owners(name) or ALGORITHMS:  # only those that read it
        mine = {env: value for (a, env), value in per.items() if a == algo and not env.endswith(" with a GPU")}
        on_gpu = [f"{v!r} on {env}" for (a, env), v in per.items() if a == algo and env.endswith(" with a GPU")
                  and repr(v) != repr(mine.get(env.removesuffix(" with a GPU"), mine.get("*")))]
        if len(set(map(repr, mine.values()))) == 1:
            parts.append(f"{algo} " + ", ".join([repr(next(iter(mine.values()))), *on_gpu]))
        else:
            parts.append(f"{algo} " + ", ".join([*(f"{v!r} on {'other envs' if env == '*' else env}"
                                                   for env, v in mine.items()), *on_gpu]))
    return f"(default: {'; '.join(parts)})"


def defaults_used(cfg: TrainConfig, given: dict[str, Any]) -> str:
    """The flags of the settings that depend on the algorithm and the env, as this new run uses them where the
    user set none: ``--backend async --num-envs 8 ...`` (empty when the user set them all).

    >>> defaults_used(new_run_config({"algo": "apex", "env": "CartPole-v1", "gamma": 0.9}), {"gamma": 0.9})[:60]
    '--total-steps 400000 --backend async --num-envs 8 --num-step'
    """
    settings = cfg.to_dict()
    values = {name: settings[name] for name in algorithm_defaults()
              if name not in given and reads(cfg.algo, name)}
    return " ".join(f"--{name.replace('_', '-')} {str(v).lower() if isinstance(v, bool) else v}"
                    for name, v in values.items())


TRAIN_PROG = "python -m trainer.train"


def build_parser(prog: str = TRAIN_PROG, description: str = "",
                 hidden: Collection[str] = ()) -> argparse.ArgumentParser:
    """Every setting that has a flag, grouped by owner. Defaults are left out of the namespace (``SUPPRESS``), so
    that what it holds is exactly what the user typed, whatever the value. ``prog``, ``description`` and
    ``hidden`` (settings, or ``resume``/``overwrite``, parsed but left out of ``--help``): for another command that
    takes the trainer's flags (a benchmark), and refuses some."""
    def shown(name: str, text: str) -> str:
        return argparse.SUPPRESS if name in hidden else text

    p = OneLineParser(prog=prog, description=description or (
        f"Train a policy: --algo {' or '.join(ALGORITHMS)} (default {TrainConfig.algo}). Where a default depends on "
        "the algorithm and the env, its help says so; a new run prints the values it uses."), epilog=(
        f"Settings without a flag (a key of a --config TOML file, or a Python argument; docs/training.md#settings): "
        f"{', '.join(without_flags())}."), settings_without_flags=without_flags())
    groups: dict[str, argparse._ArgumentGroup] = {}
    for owner, f in setting_fields():
        if not limits_of(f).flag:
            continue
        title = _group(owner, f)
        if title not in groups:
            groups[title] = p.add_argument_group(title)
        kind = _field_type(f)
        parse = _bool if kind is bool else _compile_choice if f.name == "compile" else kind
        switch = {"nargs": "?", "const": True} if kind is bool else {}  # --overlap alone means --overlap true
        groups[title].add_argument(flag_name(f.name), type=parse, default=argparse.SUPPRESS, **switch,
                                   help=shown(f.name, f"{_help(f)} {_default_help(f.name, f.default)}"))
    p.add_argument("--resume", default=None, metavar="RUN_DIR_OR_CHECKPOINT",
                   help=shown("resume", "continue a run from its newest loadable checkpoint (or from this checkpoint "
                                        "file); writes into that run directory"))
    p.add_argument("--overwrite", action="store_true",
                   help=shown("overwrite", "start a new run in a --run-dir that holds another run, deleting its "
                                           "checkpoints and metrics"))
    p.add_argument("--seeds", type=seed_list, default=(), metavar="LIST",
                   help=shown("seeds", "train the same setup once per seed (e.g. 1-5 or 1,3,7), one run directory "
                                       "each in one folder (--run-dir); the same command again resumes the "
                                       "unfinished seeds (docs/experiments.md#seeds)"))
    p.add_argument("--jobs", type=int, default=1, metavar="J",
                   help=shown("jobs", "with --seeds: train J seeds at once, each with 1/J of the cores (default 1)"))
    return p


def _command_only(keys: Collection[str]) -> list[str]:
    """What the command line does, not a setting of the run (``--config``, ``--resume``, ``--seeds``...): the
    parser's flags that are none of the config file's ``keys``."""
    actions = build_parser()._actions
    return [a.dest for a in actions if a.option_strings and a.dest not in keys and a.dest != "help"]


def _toml_values(path: Path) -> dict[str, Any]:
    """The TOML file's settings, each checked against its field's type (one-line errors naming the key)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"cannot read config file {path}: {e}") from None
    types = {name: kind for name, kind in _types().items() if name != "config"}
    keys = {key: key.replace("-", "_") for key in data}  # the flag's spelling or the field's
    unknown = sorted(k for k, name in keys.items() if name not in types)
    command_only = _command_only(types) if unknown else []
    flags_only = [k for k in unknown if keys[k] in command_only]
    if flags_only:  # flag names, but what they do is the command line's, not a run's setting
        raise ValueError(f"{path}: {', '.join(flags_only)}: command-line flags only "
                         f"({', '.join(map(flag_name, command_only))}), not keys of a config file; drop "
                         f"{'it' if len(flags_only) == 1 else 'them'}")
    if unknown:
        hints = did_you_mean(unknown, [*types, *(k.replace("_", "-") for k in types)])
        raise ValueError(f"unknown keys in {path}: {', '.join(unknown)}{hints} (keys are the flag names, with "
                         "hyphens or underscores)")
    twice = sorted(name for name in types if sum(n == name for n in keys.values()) > 1)
    if twice:
        raise ValueError(f"{path} sets {', '.join(twice)} twice (once with hyphens, once with underscores)")
    values = {}
    for written, value in data.items():
        key = keys[written]
        kind = types[key]
        if key == "env_kwargs" and isinstance(value, dict):  # an [env_kwargs] table: the natural TOML spelling
            value = _env_kwargs_table(path, written, value, types)
        ok, value = _of_kind(value, kind)
        if not ok:
            example = {bool: "true", int: "4", float: "0.5", str: '"64,64"' if key == "hidden" else '"..."'}[kind]
            if kind is int and isinstance(value, float) and value.is_integer():  # 1e6: TOML's float, not an int
                example = f"{int(value):_}"
            toml_type = _TOML_TYPES.get(type(value), type(value).__name__)
            raise ValueError(f"{path}: {key} = {json.dumps(value, default=str)} is {toml_type}, expected "
                             f"{_KINDS[kind]} (e.g. {key} = {example})")  # (JSON spells these values as TOML does)
        values[key] = value
    return values


def _env_argument_value(value: Any) -> bool:
    """Whether ``value`` (from TOML) fits the ``--env-kwargs`` text as one value."""
    return isinstance(value, (bool, int, float)) or isinstance(value, str) and not set(value) & set(',="[]')


def _env_kwargs_table(path: Path, written: str, table: dict[str, Any], settings: dict[str, type]) -> str:
    """An ``[env_kwargs]`` table as ``--env-kwargs`` text; ``ValueError`` for what that text cannot hold."""
    for name, value in table.items():
        if name.replace("-", "_") in settings:  # TOML puts every key below a table's header into the table
            raise ValueError(f"{path}: [{written}] holds {name}, a trainer setting, not an env argument: put the "
                             f"[{written}] table after every other key")
        if not _env_argument_value(value) and not (isinstance(value, list) and all(map(_env_argument_value, value))):
            raise ValueError(f"{path}: [{written}] {name} = {json.dumps(value, default=str)}: env arguments are "
                             "numbers, true/false, text without ',', '=', quotes or brackets, or arrays of those")
    return format_env_kwargs(table)


@dataclass(frozen=True)
class CommandLine:
    """A parsed ``trainer.train`` command line: the config, what the user gave, and the run-directory options."""

    config: TrainConfig
    given: dict[str, Any]  # keys from flags or the TOML file, whatever their value (flags win over the file)
    resume: str
    overwrite: bool
    from_file: frozenset[str] = frozenset()  # the keys of given that the TOML file set (and no flag)
    seeds: tuple[int, ...] = ()  # --seeds: one run per seed (trainer.experiments.seeds)
    jobs: int = 1  # --jobs: that many of them at once
    argv: tuple[str, ...] = ()  # the command line as given (the same command again resumes --seeds)

    def error_text(self, error: ConfigError) -> str:
        """``error`` as the user gave the value: a key of the TOML file is named as the file writes it."""
        return _error_text(error, self.given.get("config", ""), self.from_file)


def _error_text(error: ConfigError, config_file: str, from_file: Collection[str]) -> str:
    return error.in_file(config_file) if error.key in from_file else str(error)


def _file_only(from_file: dict[str, Any], flags: dict[str, Any]) -> frozenset[str]:
    """The keys the TOML file set and no flag overrode."""
    return frozenset(from_file) - set(flags)


def parse_args(argv: list[str] | None = None, prog: str = TRAIN_PROG, description: str = "",
               hidden: Collection[str] = ()) -> CommandLine:
    """Parse flags over TOML file over defaults; checked (:func:`check_config`). Bad input exits with a
    one-line error (``prog``, ``description``, ``hidden``: :func:`build_parser`'s).

    >>> parse_args(["--algo", "apex", "--env", "CartPole-v1", "--n-step", "5"]).config.algo_settings.n_step
    5
    """
    parser = build_parser(prog, description, hidden)
    args = vars(parser.parse_args(argv))
    resume, overwrite, seeds, jobs = _run_options(parser, args)
    from_file: dict[str, Any] = {}
    try:
        from_file = _toml_values(Path(args["config"])) if args.get("config") else {}
        given = {**from_file, **args, **_env_kwargs_merged(from_file, args)}
        algorithm_spec(given.get("algo", TrainConfig.algo))  # an unknown --algo is named first
        cfg = _checked_resume_config(given) if resume else _checked_new_run_config(given)
    except ConfigError as e:
        parser.error(_error_text(e, args.get("config", ""), _file_only(from_file, args)))
    except ValueError as e:
        parser.error(str(e))
    if resume and overwrite:
        parser.error("--overwrite starts a new run; it cannot be combined with --resume")
    return CommandLine(cfg, given, resume, overwrite, _file_only(from_file, args), seeds, jobs,
                       tuple(sys.argv[1:] if argv is None else argv))


def _env_kwargs_merged(from_file: dict[str, Any], args: dict[str, Any]) -> dict[str, str]:
    """``env_kwargs`` where both the TOML file and ``--env-kwargs`` give some: key by key, the flag's winning (as
    every other flag wins over the file, without dropping the file's other env arguments); else nothing. Text that
    does not parse is left to the check that names it."""
    if "env_kwargs" not in from_file or "env_kwargs" not in args:
        return {}
    try:
        merged = {**parse_env_kwargs(from_file["env_kwargs"]), **parse_env_kwargs(args["env_kwargs"])}
    except ValueError:
        return {}
    return {"env_kwargs": format_env_kwargs(merged)}


def _run_options(parser: argparse.ArgumentParser, args: dict[str, Any]) -> tuple[str, bool, tuple[int, ...], int]:
    """``--resume`` (``""``: a new run), ``--overwrite``, ``--seeds`` and ``--jobs``, taken out of ``args`` (which
    then holds settings only) and checked."""
    resume, overwrite = args.pop("resume"), args.pop("overwrite")
    seeds, jobs = args.pop("seeds"), args.pop("jobs")
    _check_seeds(parser, seeds, jobs, args, resume, overwrite)
    if resume is not None and not resume.strip():  # `--resume "$RUN"` with RUN unset must not start a new run
        parser.error("--resume needs a run directory or checkpoint file; it was given an empty string")
    resume = resume or ""
    if resume and not Path(resume).exists():  # before torch loads: a typo is answered at once
        parser.error(f"--resume {resume}: no such checkpoint file or run directory")
    return resume, overwrite, seeds, jobs


def _checked_new_run_config(given: dict[str, Any]) -> TrainConfig:
    """A new run's config of the ``given`` settings over the defaults (the GPU defaults where the run takes them),
    checked; ``ConfigError`` (or ``ValueError``) for the first thing wrong."""
    check_owners(given.get("algo", TrainConfig.algo), given)  # another algorithm's setting is named as such
    cfg = new_run_config(given)
    check_config(cfg, given)
    if takes_gpu_defaults(cfg, given):  # checked first: a bad flag is answered before torch loads
        cfg = new_run_config(given, gpu=True)
        check_config(cfg, given)
    if cfg.device.startswith("cuda") or getattr(cfg.algo_settings, "cuda_graphs", False):  # before any line
        import torch

        from trainer.common.devices import learner_device
        from trainer.run_layout import cuda_graphs_on
        cuda_graphs_on(cfg, learner_device(cfg.device, torch.cuda.device_count()))
    return cfg


def _checked_resume_config(given: dict[str, Any]) -> TrainConfig:
    """The ``given`` settings of a resume as a config, checked as far as they can be before the checkpoint is read:
    what the resume runs is the checkpoint's config, whose algorithm reads them (:func:`resumed_config`)."""
    cfg = TrainConfig.from_dict(given, stored=True)
    if "env_kwargs" in given:  # their syntax here; their values against the run's (resumed_config), before any
        try:  # file they name is read
            parse_env_kwargs(given["env_kwargs"])
        except ValueError as e:
            raise ConfigError("env_kwargs", given["env_kwargs"], str(e)) from None
        cfg = dataclasses.replace(cfg, env_kwargs="")
    try:
        check_config(cfg, {})  # a resumed run's algorithm: its checkpoint's (resumed_config)
    except ConfigError as e:
        if e.key in given:
            raise
        # a rule between a given value and a default (--replay-capacity under the default --learning-starts):
        # a resumed run's other values are its checkpoint's, and resumed_config checks against those
    return cfg


def _check_seeds(parser: argparse.ArgumentParser, seeds: tuple[int, ...], jobs: int, args: dict[str, Any],
                 resume: str | None, overwrite: bool) -> None:
    """``--seeds`` and ``--jobs`` against the flags they cannot go with."""
    if jobs < 1:
        parser.error(f"--jobs must be >= 1, got {jobs}")
    if not seeds:
        if jobs != 1:
            parser.error(f"--jobs {jobs} trains several seeds at once: pass --seeds too (e.g. --seeds 1-{jobs}); "
                         "a sweep's trials: python -m trainer.sweep --jobs")
        return
    clash = next((flag for flag, given in (("--seed", "seed" in args), ("--resume", resume),
                                           ("--overwrite", overwrite)) if given), None)
    if clash:
        parser.error(f"--seeds cannot be combined with {clash}: --seeds sets each run's seed, and the same "
                     "command again resumes the unfinished ones (to start afresh, delete their folder)")
    if any(s > MAX_SEED for s in seeds):
        parser.error(f"--seeds must be <= {MAX_SEED}, got {max(seeds)}")


def check_config(cfg: TrainConfig, given: dict[str, Any]) -> None:
    """Raise ``ValueError`` for the first thing wrong with ``cfg``: an invalid value (``TrainConfig.validate``),
    an unknown ``--algo`` or settings it cannot run with (``Algorithm.check_config``), or a setting in ``given``
    (what the user typed) that only another algorithm reads (:func:`check_owners`)."""
    cfg.validate()
    algorithm_spec(cfg.algo).check_config(cfg)
    check_owners(cfg.algo, given)


def resumed_config(saved: dict[str, Any], given: dict[str, Any], source: str) -> TrainConfig:
    """The checkpoint's config with the given flags applied; flags that would change the run are an error (a
    moved trace directory does not: ``--env-kwargs capacity_trace=NEW``)."""
    algo = given.get("algo", saved.get("algo", TrainConfig.algo))
    check_owners(algo, given)  # before a clash with a value it ignores
    may_change = set(RESUMABLE_CHANGES)
    if {saved.get("backend"), given.get("backend", saved.get("backend"))} <= set(SWITCHABLE_BACKENDS):
        may_change.add("backend")  # the same envs, seeds and numbers, collected elsewhere: the state restores
    if "env_kwargs" in given:  # only file paths may change (checked here): the files moved, the run is the same
        given = {**given, "env_kwargs": moved_env_files(saved.get("env_kwargs", ""), given["env_kwargs"],
                                                        env_argument_defaults(saved.get("env", "")))}
        may_change.add("env_kwargs")
    clash = {k: (saved.get(k), v) for k, v in given.items() if k not in may_change and saved.get(k) != v}
    if clash:  # a usage error, as a bad flag's
        detail = ", ".join(f"{named(k)}={new!r} (run has {old!r})" for k, (old, new) in clash.items())
        key, (old, value) = next(iter(clash.items()))
        rule = f"the run being resumed has {spelled(old)}: drop it, or start a new run"  # (a TOML key's message)
        raise ConfigError(key, value, rule, message=(
            f"{source}: the flags do not match the run being resumed: {detail}. Drop them, or start "
            f"a new run; only {', '.join(named(k) for k in sorted(RESUMABLE_CHANGES - {'config'}))} "
            f"may change (and --backend between {', '.join(SWITCHABLE_BACKENDS)}; "
            f"--env-kwargs {', '.join(f'{k}=NEW' for k in sorted(PATH_ENV_KWARGS))} where files moved)"))
    types = _types(saved.get("algo", TrainConfig.algo))
    stored = {}
    for key, value in saved.items():
        if key not in types:
            continue
        ok, stored[key] = _of_kind(value, types[key])
        if not ok:  # a config edited by hand would fail later, as a TypeError from deep inside
            raise ValueError(f"{source}: its stored config has {key} = {value!r}, a {type(value).__name__}; "
                             f"expected {_KINDS[types[key]]} (a config edited by hand?)")
    cfg = TrainConfig.from_dict({**stored, **given})
    check_config(cfg, {})
    return cfg
