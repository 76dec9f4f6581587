"""Settings declared once, beside the code that reads them: a dataclass field with its default, its help and its
limits (:func:`setting`), checked by one generic rule (:func:`check_limits`) that writes every message the same
way: ``--num-envs must be >= 1, got 0``.

Who owns a setting is where it is declared: the run's and the collection's in ``trainer.config.TrainConfig``,
an algorithm's in its own package (``trainer.ppo.settings``, ``trainer.apex.settings``). ``trainer.flags`` turns
the declarations into flags (grouped by owner), TOML keys and ``--help``. Imports only the standard library: the
command line answers before torch loads.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Demo:
    ...     num_envs: int = setting(64, "parallel envs", at_least=1)
    ...     mode: str = setting("fast", "how to run", choices=("fast", "slow"))
    >>> check_limits(Demo(num_envs=0))
    Traceback (most recent call last):
    ...
    trainer.settings.ConfigError: --num-envs must be >= 1, got 0
    >>> check_limits(Demo(mode="fsat"))
    Traceback (most recent call last):
    ...
    trainer.settings.ConfigError: --mode must be fast or slow, got 'fsat' (did you mean fast?)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainer.arguments import did_you_mean, spelled


@dataclass(frozen=True)
class Limits:
    """What values a setting takes: bounds (``None``: none), or a few choices. ``flag``: whether the command line
    has a flag for it (a setting without one is set in a TOML file or in Python: measured not to pay often
    enough to earn a flag); ``zero``: what 0 means, where 0 is special (``"off"``)."""

    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    choices: tuple[str, ...] = ()
    zero: str = ""
    flag: bool = True

    def rule(self) -> str:
        """The limits in words: ``">= 1"``, ``"> 0 and <= 1"``, ``"ppo or apex"``; ``""`` for none."""
        if self.choices:
            *others, last = self.choices
            return f"{', '.join(others)} or {last}" if others else last
        parts = [f"{sign} {_number(bound)}" for sign, bound in ((">=", self.at_least), (">", self.above),
                                                                 ("<=", self.at_most)) if bound is not None]
        return " and ".join(parts)

    def broken_by(self, value: Any) -> bool:
        """Whether ``value`` is outside these limits (a float that is not finite always is)."""
        if isinstance(value, float) and not math.isfinite(value):
            return True
        if self.choices:
            return value not in self.choices
        return ((self.at_least is not None and value < self.at_least) or
                (self.above is not None and value <= self.above) or
                (self.at_most is not None and value > self.at_most))


def setting(default: Any, help: str, *, at_least: float | None = None, above: float | None = None,
            at_most: float | None = None, choices: Sequence[str] = (), zero: str = "", flag: bool = True) -> Any:
    """A dataclass field: its ``default``, its ``help`` (``--help``, the docs) and its :class:`Limits`."""
    limits = Limits(at_least, above, at_most, tuple(choices), zero, flag)
    return dataclasses.field(default=default, metadata={"help": help, "limits": limits})


def limits_of(field: dataclasses.Field) -> Limits:
    return field.metadata.get("limits", Limits())


def help_of(field: dataclasses.Field) -> str:
    """A field's help with what 0 means, where it says."""
    limits = limits_of(field)
    return field.metadata.get("help", "") + (f" (0: {limits.zero})" if limits.zero else "")


def flag_name(key: str) -> str:
    """``num_envs`` -> ``--num-envs``."""
    return "--" + key.replace("_", "-")


def check_limits(settings: Any) -> None:
    """Raise :class:`ConfigError` for the first field of the dataclass ``settings`` outside its :class:`Limits`."""
    for field in dataclasses.fields(settings):
        value, limits = getattr(settings, field.name), limits_of(field)
        if limits.broken_by(value):
            rule = limits.rule()
            finite = isinstance(value, float) and not math.isfinite(value)
            raise ConfigError(field.name, value, f"must be {rule or 'finite'}" + (" and finite" if finite and rule
                                                                                   else ""),
                              hint=did_you_mean(str(value), limits.choices) if limits.choices else "",
                              flag=limits.flag)


class ConfigError(ValueError):
    """An invalid setting; ``key`` names it (a flag on the command line, a key in a TOML file), ``value`` is what it
    was given (``flag``: whether the setting has a flag; a message names one without by its TOML key). The
    message is ``--key RULE, got VALUE`` for a rule the value breaks (``"must be >= 1"``, ``"needs
    --backend ray"``), ``--key=VALUE: REASON`` for another reason it cannot be used, or a ``message`` of its own
    where several settings are named."""

    def __init__(self, key: str, value: Any, rule: str = "", message: str | None = None, hint: str = "",
                 flag: bool = True) -> None:
        if not (rule or message):
            raise TypeError("ConfigError needs a rule or a message")
        demand = rule.startswith(("must ", "needs ", "is for "))  # "--num-envs must be >= 1, got 0"
        flag, got = flag_name(key) if flag else key, spelled(value)  # (a setting without a flag: its TOML key)
        demanded, _, why = rule.partition(": ")  # the value comes right after the demand, before any reason
        if demand:
            text = f"{flag} {demanded}, got {got}{hint}" + (f": {why}" if why else "")
        else:
            text = f"{flag}={got}: {rule}{hint}"
        super().__init__(message or text)
        self.key, self.value, self.rule, self.hint = key, value, rule, hint

    def in_file(self, path: str) -> str:
        """The message for a value that the TOML file ``path`` set: the key as the file writes it."""
        where = f"{path}: {self.key} = {spelled(self.value)}"
        return f"{where}: {self.rule}{self.hint}" if self.rule else f"{self} ({where})"


def _number(bound: float) -> str:
    """A bound as the user would write it: ``1``, ``0.5``, ``1e6``."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}".replace("e+0", "e").replace("e+", "e")
