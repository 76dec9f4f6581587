"""Settings declared once, beside the code that reads them: a dataclass field with its default, its help and its
limits (:func:`setting`), checked by one generic rule (:func:`check_limits`) that writes every message the same
way: ``--num-envs must be >= 1, got 0`` (``num_users must be >= 1, got 0`` for a setting without a flag, such as
an env's argument).

The trainer's settings are declared in ``trainer.config.TrainConfig`` and its algorithms' packages
(``trainer.ppo.settings``, ``trainer.apex.settings``), VR-edge's in :class:`envs.vr_edge.VREdgeConfig`. It lives
in ``envs`` because ``envs`` imports no other package of the project while the trainer may import ``envs``. Imports
only the standard library: the command line answers before torch loads.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Demo:
    ...     num_envs: int = setting(64, "parallel envs", at_least=1)
    ...     mode: str = setting("fast", "how to run", choices=("fast", "slow"))
    >>> check_limits(Demo(num_envs=0))
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: --num-envs must be >= 1, got 0
    >>> check_limits(Demo(mode="fsat"))
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: --mode must be fast or slow, got 'fsat' (did you mean fast?)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


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
        """Whether ``value`` is outside these limits (a number that is not finite always is); a list or tuple is
        when one of its items is."""
        if isinstance(value, (tuple, list)):
            return any(self.broken_by(v) for v in value)
        if _not_finite(value):
            return True
        if self.choices:
            return value not in self.choices
        return ((self.at_least is not None and value < self.at_least) or
                (self.above is not None and value <= self.above) or
                (self.at_most is not None and value > self.at_most))


def setting(default: Any, help: str, *, at_least: float | None = None, above: float | None = None,
            at_most: float | None = None, choices: Sequence[str] = (), zero: str = "", flag: bool = True,
            group: str = "", resumable: bool = False) -> Any:
    """A dataclass field: its ``default``, its ``help`` (``--help``, the docs) and its :class:`Limits` (of each
    item, for a list); ``group``: the ``--help`` group it is listed in (``""``: its owner's); ``resumable``: whether
    a resumed run may change it (how the run goes on, not what it is: ``total_steps``, ``device``)."""
    limits = Limits(at_least, above, at_most, tuple(choices), zero, flag)
    return dataclasses.field(default=default, metadata={"help": help, "limits": limits, "group": group,
                                                         "resumable": resumable})


def limits_of(field: dataclasses.Field) -> Limits:
    return field.metadata.get("limits", Limits())


def group_of(field: dataclasses.Field) -> str:
    """The ``--help`` group a field declares (``""``: its owner's)."""
    return field.metadata.get("group", "")


def is_resumable(field: dataclasses.Field) -> bool:
    """Whether a resumed run may change the field's value."""
    return field.metadata.get("resumable", False)


def help_of(field: dataclasses.Field) -> str:
    """A field's help with what 0 means, where it says."""
    limits = limits_of(field)
    return field.metadata.get("help", "") + (f" (0: {limits.zero})" if limits.zero else "")


def flag_name(key: str) -> str:
    """``num_envs`` -> ``--num-envs``."""
    return "--" + key.replace("_", "-")


def check_limits(settings: Any, flags: bool = True) -> None:
    """Raise :class:`ConfigError` for the first field of the dataclass ``settings`` outside its :class:`Limits`.
    ``flags``: whether the fields are command-line flags (``False``: keyword arguments, named by their key)."""
    for field in (f for f in dataclasses.fields(settings) if "limits" in f.metadata):  # (declared by setting())
        value, limits = getattr(settings, field.name), limits_of(field)
        if limits.broken_by(value):
            rule = limits.rule()
            items = value if isinstance(value, (tuple, list)) else [value]
            finite = " and finite" if rule and any(map(_not_finite, items)) else ""
            raise ConfigError(field.name, value, f"must {'hold numbers' if items is value else 'be'} "
                              f"{rule or 'finite'}{finite}",
                              hint=did_you_mean(str(value), limits.choices) if limits.choices else "",
                              flag=flags and limits.flag)


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
        self._made_of = (key, value, rule, message, hint, flag)

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        # made anew from what made it: an error raised in a worker process reaches its parent whole (pickle's
        # default would call __init__ with the message alone)
        return type(self), self._made_of

    def in_file(self, path: str) -> str:
        """The message for a value that the TOML file ``path`` set: the key as the file writes it."""
        where = f"{path}: {self.key} = {spelled(self.value)}"
        return f"{where}: {self.rule}{self.hint}" if self.rule else f"{self} ({where})"


def _not_finite(value: Any) -> bool:
    """Whether ``value`` is a number that is not finite (inf, nan); text and other values are not."""
    try:
        return not math.isfinite(value)
    except (TypeError, OverflowError):  # (an int too large for a float is finite)
        return False


def _number(bound: float) -> str:
    """A bound as the user would write it: ``1``, ``0.5``, ``1e6``."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}".replace("e+0", "e").replace("e+", "e")


def did_you_mean(words: str | list[str], choices: Iterable[str]) -> str:
    """``" (did you mean X?)"`` with the choice closest to each of ``words`` that has a close one, or ``""``.

    >>> did_you_mean("CartPole-v0", ["CartPole-v1", "Acrobot-v1"]), did_you_mean("xyz", ["ppo", "apex"])
    (' (did you mean CartPole-v1?)', '')
    """
    lowered = {c.lower(): c for c in choices}  # case is a typo too: "Async" is async, not sync
    close = [lowered[m[0]] for w in ([words] if isinstance(words, str) else words)
             if (m := _closest(w.lower(), lowered))]
    return f" (did you mean {' '.join(close)}?)" if close else ""


# what CleanRL's ppo.py and Stable-Baselines3 call settings of ours: a user's habit, not a typo, and no spelling
# is close (--learning-rate would otherwise get --learning-starts, an Ape-X setting)
OTHER_LIBRARIES_NAMES = {"learning_rate": "lr", "total_timesteps": "total_steps", "n_envs": "num_envs",
                         "n_steps": "num_steps", "update_epochs": "epochs", "n_epochs": "epochs",
                         "clip_range": "clip_coef"}
# what this project called a setting before 0.1.0 was released (old -> new): an old flag is answered with the new
# one, and a stored config of a run that old is read under the new names (trainer.config.with_current_names)
FORMER_NAMES = {"ray_async": "keep_collecting"}


def _closest(word: str, choices: Iterable[str]) -> list[str]:
    """Ours for another library's name (``--lr`` for ``--learning-rate``), else a letter off (``--envs`` for
    ``--env``), else the one choice ``word`` begins (``--epi`` for ``--episodes``), else the closest; as a list of
    one, or ``[]``."""
    return (_ours(word, choices) or difflib.get_close_matches(word, choices, n=1, cutoff=0.85) or
            _started(word, choices) or difflib.get_close_matches(word, choices, n=1, cutoff=0.6))


def _ours(word: str, choices: Iterable[str]) -> list[str]:
    """The choice spelling our name for ``word``, another library's (:data:`OTHER_LIBRARIES_NAMES`) or our former
    one (:data:`FORMER_NAMES`), as ``word`` is spelled (dashes in front, hyphens or underscores); as a list of one,
    or ``[]``.

    >>> _ours("--learning-rate", ["--lr", "--learning-starts"]), _ours("n_steps", ["num-steps", "num_steps"])
    (['--lr'], ['num_steps'])
    """
    bare = word.lstrip("-")
    ours = {**OTHER_LIBRARIES_NAMES, **FORMER_NAMES}.get(bare.replace("-", "_"))
    if ours is None:
        return []
    spelled_ours = word[:len(word) - len(bare)] + (ours.replace("_", "-") if "-" in bare else ours)
    return [spelled_ours] if spelled_ours in choices else []


def _started(word: str, choices: Iterable[str]) -> list[str]:
    """The one choice that ``word`` begins (``--epi`` for ``--episodes``), as a list; ``[]`` if none or several.

    >>> _started("--epi", ["--episodes", "--pick"]), _started("--s", ["--seed", "--stochastic"])
    (['--episodes'], [])
    """
    begun = [c for c in choices if c.startswith(word) and len(word.lstrip("-")) >= 2]
    return begun if len(begun) == 1 else []


def spelled(value: object) -> str:
    """``value`` as a command line or a TOML file writes it: ``true``/``false`` for booleans, a list (or tuple) in
    brackets, else its ``repr``.

    >>> spelled(True), spelled((8, "a")), spelled(0.5)
    ('true', "[8, 'a']", '0.5')
    """
    if isinstance(value, (tuple, list)):
        return f"[{', '.join(map(spelled, value))}]"
    return str(value).lower() if isinstance(value, bool) else repr(value)
