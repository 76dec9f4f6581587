"""A sweep's search space: a TOML file with one table per setting to tune (``trainer.sweep --space``).

    [lr]                    # a range: low, high, and optionally log = true (sampled on a log scale) or a step
    low = 1e-4
    high = 3e-3
    log = true

    [epochs]                # an integer setting takes an integer range
    low = 2
    high = 8

    [policy-arch]           # choices: any setting, of its own type
    choices = ["flat", "per_head"]

A table is keyed by the setting's name as ``trainer.train --config`` files take it (the flag's spelling with
hyphens, or the field's with underscores). Everything is checked before anything runs, against the settings'
declarations (``envs.settings``: type, limits, which algorithm reads it) and the rules between settings
(``trainer.flags.check_config``, at every end of a range and every choice): each problem is one line naming the
file and the key. Imports no torch and no Optuna: the command line answers at once.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from envs.settings import did_you_mean, spelled
from trainer.config import TrainConfig, setting_fields
from trainer.flags import check_config
from trainer.registry import owners, reads, settings_class

# settings a sweep does not sample, and why
NOT_SAMPLED = {
    "algo": "the sweep's algorithm is the train flags' --algo (each algorithm reads other settings)",
    "env": "the sweep tunes for the train flags' --env (scores of different envs do not compare)",
    "run_dir": "each trial's run directory is the sweep's (--dir)",
    "config": "a TOML file of the train flags goes after -- as --config FILE",
    "eval_every": "the validations are the objective's schedule: give --eval-every after --",
    "eval_episodes": "the validation episodes are the objective's: give --eval-episodes after --",
}
_RANGE_KEYS = ("low", "high", "log", "step")
_KINDS = {"bool": bool, "int": int, "float": float, "str": str}
_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_CHOICES_EXAMPLE = {bool: "[true, false]", int: "[64, 128]", float: "[0.9, 0.99]", str: '["flat", "per_head"]'}


class SpaceError(ValueError):
    """A search space the sweep cannot run; ``key``: the setting's table, as the file writes it (``""``: the
    file as a whole)."""

    def __init__(self, path: Path, key: str, problem: str) -> None:
        super().__init__(f"{path}: [{key}] {problem}" if key else f"{path}: {problem}")
        self.key = key


@dataclass(frozen=True)
class Dimension:
    """One setting's range (``low`` to ``high``, on a ``log`` scale or in ``step``s) or its ``choices``; ``name``
    is the setting's field name (the study's parameter, and ``best.toml``'s key).

    Example:
        >>> Dimension("lr", float, low=1e-4, high=3e-3, log=True).describe()
        'lr in [0.0001, 0.003] (log)'
    """

    name: str
    kind: type
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()

    def suggest(self, trial: Any) -> Any:
        """The value of an ``optuna.trial.Trial`` for this setting: sampled, or the one it holds already (a resumed
        trial)."""
        if self.choices:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind is int:
            return trial.suggest_int(self.name, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def describe(self) -> str:
        """The dimension in words: ``lr in [0.0001, 0.003] (log)``, ``policy_arch in flat, per_head``."""
        if self.choices:
            return f"{self.name} in {', '.join(map(spelled, self.choices))}"
        scale = " (log)" if self.log else f" (step {self.step:g})" if self.step else ""
        return f"{self.name} in [{self.low:g}, {self.high:g}]{scale}"

    def to_dict(self) -> dict[str, Any]:
        """As the study stores it (a rerun must sample the same space)."""
        return {"name": self.name, "kind": self.kind.__name__, "low": self.low, "high": self.high, "log": self.log,
                "step": self.step, "choices": list(self.choices)}


@dataclass(frozen=True)
class SearchSpace:
    """The settings a sweep samples, read and checked from a TOML file (:meth:`read`).

    Example:
        >>> import tempfile
        >>> from trainer.config import new_run_config
        >>> path = Path(tempfile.mkdtemp()) / "space.toml"
        >>> _ = path.write_text('[lr]\\nlow = 1e-4\\nhigh = 3e-3\\nlog = true\\n[epochs]\\nlow = 2\\nhigh = 8\\n')
        >>> space = SearchSpace.read(path, new_run_config({"env": "CartPole-v1"}), {"env": "CartPole-v1"})
        >>> [d.describe() for d in space.dimensions]
        ['lr in [0.0001, 0.003] (log)', 'epochs in [2, 8]']
    """

    path: Path
    dimensions: tuple[Dimension, ...]

    @classmethod
    def read(cls, path: str | Path, base: TrainConfig, given: Mapping[str, Any]) -> SearchSpace:
        """The space in the TOML file ``path`` for trials of ``base`` (the train flags' config; ``given``: the
        settings they gave, which the space may not sample too); :class:`SpaceError` for the first problem."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise SpaceError(path, "", f"cannot read the search space: {e}") from None
        if not data:
            raise SpaceError(path, "", "samples no setting: add a table per setting, e.g. [lr] with low = 1e-4 "
                             "and high = 3e-3")
        names = {written: _setting_name(path, written, base.algo) for written in data}
        twice = sorted({n for n in names.values() if list(names.values()).count(n) > 1})
        if twice:
            raise SpaceError(path, twice[0], "is given twice (once with hyphens, once with underscores)")
        dimensions = []
        for written, table in data.items():
            name = names[written]
            if name in given:
                raise SpaceError(path, written, f"is also given after -- (as --{name.replace('_', '-')} or a key of "
                                 "its --config file): sample it or set it, not both")
            dimension = _dimension(path, written, name, table, base.algo)
            for which, value in _ends(dimension):
                _check_in_a_run(path, written, name, which, value, base, given)
            dimensions.append(dimension)
        return cls(path, tuple(dimensions))

    def sample(self, trial: Any) -> dict[str, Any]:
        """Every setting's value for the ``optuna.trial.Trial``, by setting name."""
        return {d.name: d.suggest(trial) for d in self.dimensions}

    def to_dict(self) -> list[dict[str, Any]]:
        """As the study stores it."""
        return [d.to_dict() for d in self.dimensions]

    def describe(self) -> str:
        """``lr in [0.0001, 0.003] (log); epochs in [2, 8]``."""
        return "; ".join(d.describe() for d in self.dimensions)


def _setting_name(path: Path, written: str, algo: str) -> str:
    """The field name of the setting a table is keyed by; :class:`SpaceError` for one that is unknown, not sampled,
    or that ``algo`` does not read."""
    name = written.replace("-", "_")
    known = [f.name for _, f in setting_fields()]
    if name not in known and not owners(name):
        ours = [k for k in known if reads(algo, k)]  # another algorithm's setting is no help here
        hint = did_you_mean(written, [*ours, *(k.replace("_", "-") for k in ours)])
        raise SpaceError(path, written, f"is not a setting{hint} (tables are keyed by the trainer's flag names, "
                         "with hyphens or underscores)")
    if name in NOT_SAMPLED:
        raise SpaceError(path, written, f"cannot be sampled: {NOT_SAMPLED[name]}")
    if not reads(algo, name):
        readers = " or ".join(owners(name))
        raise SpaceError(path, written, f"is a setting of --algo {readers} only, and the sweep's trials are --algo "
                         f"{algo}, which would ignore it; drop it")
    return name


def _field(name: str, algo: str) -> dataclasses.Field:
    """The declaration of the setting ``name`` that ``algo``'s runs read."""
    mine = {f.name: f for f in dataclasses.fields(settings_class(algo))}
    return mine.get(name) or TrainConfig.__dataclass_fields__[name]


def _dimension(path: Path, written: str, name: str, table: Any, algo: str) -> Dimension:
    """The dimension of one table, its shape and types checked (the values themselves: :func:`_check_in_a_run`)."""
    kind = _KINDS[str(_field(name, algo).type)]
    example = "choices = [...]" if kind in (bool, str) else "low = ... and high = ..."
    if not isinstance(table, dict):
        raise SpaceError(path, written, f"= {json.dumps(table, default=str)} is not a table: write [{written}] "
                         f"with {example} below it")
    odd = sorted(set(table) - {*_RANGE_KEYS, "choices"})
    if odd:
        raise SpaceError(path, written, f"has {', '.join(odd)}{did_you_mean(odd, [*_RANGE_KEYS, 'choices'])}: a "
                         "table holds low, high and optionally log or step (a range), or choices")
    if "choices" in table:
        if set(table) & set(_RANGE_KEYS):
            raise SpaceError(path, written, "is a range and choices at once: keep low/high or choices")
        return Dimension(name, kind, choices=_choices(path, written, table["choices"], kind))
    if not {"low", "high"} <= set(table):
        raise SpaceError(path, written, f"is neither a range nor choices: give {example}")
    if kind in (bool, str):
        raise SpaceError(path, written, f"is {_WORDS[kind]} setting: sample it from choices = [...], not a range")
    low, high, step = table["low"], table["high"], table.get("step")
    for key, value in (("low", low), ("high", high), ("step", step)):
        if value is not None and not _number(value, kind):
            what = f"{json.dumps(value, default=str)} is not {_WORDS[kind]}"
            if kind is int and _number(value, float):
                what += f": {name} is an integer setting, so its range is of integers (e.g. {key} = 4)"
            raise SpaceError(path, written, f"{key} = {what}")
    log = table.get("log", False)
    if not isinstance(log, bool):
        raise SpaceError(path, written, f"log = {json.dumps(log, default=str)} is not true or false")
    if low >= high:
        raise SpaceError(path, written, f"low = {spelled(low)} must be below high = {spelled(high)}")
    if log and low <= 0:
        raise SpaceError(path, written, f"log = true needs low > 0, got low = {spelled(low)}")
    if step is not None:
        if log:
            raise SpaceError(path, written, "takes a step or log = true, not both (a log scale has no fixed step)")
        if step <= 0:
            raise SpaceError(path, written, f"step = {spelled(step)} must be > 0")
        if not math.isclose((high - low) / step, round((high - low) / step), abs_tol=1e-9):
            raise SpaceError(path, written, f"high - low = {spelled(high - low)} is not a whole number of steps of "
                             f"{spelled(step)}")
    return Dimension(name, kind, low=float(low) if kind is float else low, high=float(high) if kind is float else high,
                     log=log, step=step)


def _choices(path: Path, written: str, choices: Any, kind: type) -> tuple:
    """A table's ``choices``: a non-empty array of distinct values of the setting's ``kind``."""
    if not isinstance(choices, list) or not choices:
        raise SpaceError(path, written, f"choices = {json.dumps(choices, default=str)} must be a non-empty array, "
                         f"e.g. choices = {_CHOICES_EXAMPLE[kind]}")
    wrong = next((c for c in choices if not _number(c, kind) and not (kind in (bool, str) and type(c) is kind)), None)
    if wrong is not None:
        raise SpaceError(path, written, f"choice {json.dumps(wrong, default=str)} is not {_WORDS[kind]}, as the "
                         "setting is")
    twice = next((c for i, c in enumerate(choices) if c in choices[:i]), None)
    if twice is not None:
        raise SpaceError(path, written, f"choice {spelled(twice)} is given twice")
    return tuple(float(c) if kind is float else c for c in choices)


def _number(value: Any, kind: type) -> bool:
    """Whether ``value`` (from TOML) is a number of ``kind`` (an integer is a float too; a boolean is neither)."""
    if kind is int:
        return type(value) is int
    return kind is float and type(value) in (int, float) and math.isfinite(value)


def _ends(dimension: Dimension) -> list[tuple[str, Any]]:
    """The values a trial may take that bound all others: a range's ends, or every choice."""
    if dimension.choices:
        return [("choice", c) for c in dimension.choices]
    return [("low", dimension.low), ("high", dimension.high)]


def _check_in_a_run(path: Path, written: str, name: str, which: str, value: Any, base: TrainConfig,
                    given: Mapping[str, Any]) -> None:
    """Raise :class:`SpaceError` if a run of ``base`` with the setting ``name`` at ``value`` is refused: outside the
    setting's limits, or against a rule between settings (the trainer's own checks, ``trainer.flags``)."""
    try:
        check_config(base.replaced(**{name: value}), {**given, name: value})
    except ValueError as e:
        raise SpaceError(path, written, f"{which} = {spelled(value)}: {e}") from None
