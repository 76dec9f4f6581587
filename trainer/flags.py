"""``trainer.train``'s command line: every ``TrainConfig`` field as a flag and a TOML key, checked as a whole.

Flags override the TOML file (``--config``), which overrides the defaults. A setting only another algorithm
reads is refused (a user who sets ``--epochs`` for Ape-X, or ``--n-step`` for PPO, would otherwise believe it
took effect); each algorithm declares its own settings (``Algorithm.options``), and their help starts with its
name.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from trainer.config import ConfigError, TrainConfig
from trainer.registry import ALGORITHMS, algorithm_class, option_owner

# keys a resumed run may change; every other key must match the checkpoint's config
RESUMABLE_CHANGES = {"total_steps", "anneal_lr", "device", "num_workers", "threads", "tensorboard", "checkpoint_every",
                     "keep_checkpoints", "config", "ray_address", "cpus_per_worker", "eval_every", "eval_episodes",
                     "save_replay", "worker_timeout"}
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


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


def _field_type(f: dataclasses.Field) -> type:
    return {"bool": bool, "int": int, "float": float, "str": str}.get(str(f.type), f.type)


def _help(name: str) -> str:
    """A field's help: which algorithms ``--algo`` offers, or what it means, prefixed by the algorithm that alone
    reads it."""
    if name == "algo":
        *others, last = (f"{n} ({cls.description})" for n, cls in ALGORITHMS.items())
        return f"{', '.join(others)} or {last}" if others else last
    owner, text = option_owner(name), TrainConfig.HELP.get(name, "")
    return f"{owner}: {text}" if owner else text


def build_parser() -> argparse.ArgumentParser:
    """Every config field as a flag. Defaults are left out of the namespace (``SUPPRESS``), so
    that what it holds is exactly what the user typed, whatever the value."""
    p = _Parser(prog="python -m trainer.train",
                description=f"Train a policy: --algo {' or '.join(ALGORITHMS)} (default {TrainConfig.algo}).")
    for f in fields(TrainConfig):
        kind = _field_type(f)
        p.add_argument(f"--{f.name.replace('_', '-')}", type=_bool if kind is bool else kind,
                       default=argparse.SUPPRESS, help=f"{_help(f.name)} (default: {f.default!r})")
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
    """Parse flags over TOML file over defaults; checked (:func:`check_config`). Bad input exits with a
    one-line error.

    >>> parse_args(["--algo", "apex", "--env", "CartPole-v1", "--n-step", "5"]).config.n_step
    5
    """
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    resume, overwrite = args.pop("resume"), args.pop("overwrite")
    from_file: dict[str, Any] = {}
    try:
        from_file = _toml_values(Path(args["config"])) if args.get("config") else {}
        given = {**from_file, **args}
        cfg = TrainConfig(**{**{f.name: f.default for f in fields(TrainConfig)}, **given})
        check_config(cfg, given)
    except ConfigError as e:
        if e.key in from_file and e.key not in args:
            parser.error(f"{args['config']}: {e.key} = {e.value!r} is invalid: {e.rule}")
        parser.error(str(e))
    except ValueError as e:
        parser.error(str(e))
    if resume and overwrite:
        parser.error("--overwrite starts a new run; it cannot be combined with --resume")
    return CommandLine(cfg, given, resume, overwrite)


def check_config(cfg: TrainConfig, given: dict[str, Any]) -> None:
    """Raise ``ValueError`` for the first thing wrong with ``cfg``: an invalid value (``TrainConfig.validate``),
    an unknown ``--algo`` or settings it cannot run with (``Algorithm.check_config``), or a setting in ``given``
    (what the user typed) that only another algorithm reads."""
    cfg.validate()
    algorithm_class(cfg.algo).check_config(cfg)
    ignored = sorted(k for k in given if option_owner(k) not in (None, cfg.algo))
    if ignored:
        flags = ", ".join("--" + k.replace("_", "-") for k in ignored)
        owners = " or ".join(sorted({option_owner(k) for k in ignored}))
        one = len(ignored) == 1
        raise ValueError(f"{flags}: for --algo {owners} only, and this run is --algo {cfg.algo}, which would ignore "
                         f"{'it' if one else 'them'}; drop {'it' if one else 'them'}")


def resumed_config(saved: dict[str, Any], given: dict[str, Any], source: str) -> TrainConfig:
    """The checkpoint's config with the given flags applied; flags that would change the run are an error."""
    clash = {k: (saved.get(k), v) for k, v in given.items() if k not in RESUMABLE_CHANGES and saved.get(k) != v}
    if clash:
        detail = ", ".join(f"--{k.replace('_', '-')}={new!r} (run has {old!r})" for k, (old, new) in clash.items())
        raise ValueError(f"{source}: the flags do not match the run being resumed: {detail}. Drop them, or start "
                         f"a new run; only {', '.join(sorted(RESUMABLE_CHANGES - {'config'}))} may change")
    known = {f.name for f in fields(TrainConfig)}
    cfg = TrainConfig(**{**{k: v for k, v in saved.items() if k in known}, **given})
    check_config(cfg, {})
    return cfg
