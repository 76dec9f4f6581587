"""What the command lines share when they parse: one-line errors that name the closest valid spelling.

Python 3.11's argparse says ``unrecognized arguments: --num-evns`` and nothing more; these errors add "did you
mean --num-envs?". Imports only the standard library, so that ``--help`` and a typo answer before torch loads.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path


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


def counted(n: int, noun: str, plural: str = "") -> str:
    """``n`` and its noun, singular for one: ``counted(1, "env")`` is ``'1 env'``, ``counted(3, "minibatch",
    "minibatches")`` is ``'3 minibatches'``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def spelled(value: object) -> str:
    """``value`` as a command line or a TOML file writes it: ``true``/``false`` for booleans, else its ``repr``."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def command(*args: str) -> str:
    """A shell command with this interpreter and absolute paths, so that it runs as printed from any
    directory (the packages may live in a venv that is not on the PATH)."""
    return " ".join(shlex.quote(a) for a in (sys.executable, *args))


def seed_list(text: str) -> tuple[int, ...]:
    """The seeds of ``--seeds``: ranges and single seeds separated by commas, each once, in order; an
    ``argparse.ArgumentTypeError`` saying what is wrong otherwise.

    >>> seed_list("1-3,7"), seed_list("5")
    ((1, 2, 3, 7), (5,))
    """
    seeds: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not (low.isdigit() and (high.isdigit() or not dash)) or dash and int(high) < int(low):
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a seed or a range of seeds (e.g. 1-5 or 1,3,7)")
        seeds += range(int(low), int(high or low) + 1)
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"seed {twice[0]} is given twice")
    return tuple(seeds)


def seeds_text(seeds: tuple[int, ...]) -> str:
    """``seeds`` as ``--seeds`` takes them, runs of consecutive seeds as ranges.

    >>> seeds_text((1, 2, 3, 7))
    '1-3,7'
    """
    runs: list[list[int]] = []
    for s in seeds:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def not_a_directory(flag: str, value: str) -> str:
    """What is wrong with ``value`` as ``flag``'s output directory when a file stands in its way (it, or the
    nearest of its parents that exists, is a file), for ``parser.error``; ``""`` otherwise. Checked before torch
    loads, so the mistake is a usage error at once; whether the directory is writable is checked where it is made.
    """
    path = Path(value)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or existing.is_dir():
        return ""
    which = "it" if existing == path else str(existing)
    return f"{flag} {value}: {which} is a file, not a directory; pass {flag} DIR with DIR a directory (made if missing)"


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line that says what to change (no 40-line usage block), with
    the closest flag for an unknown one and the closest choice for an invalid one.

    Example:
        >>> p = OneLineParser(prog="demo")
        >>> _ = p.add_argument("--num-envs", type=int)
        >>> p.suggestion("unrecognized arguments: --num-evns 8")
        ' (did you mean --num-envs?)'
    """

    typed: list[str] = []  # the words parse_args was given (a required flag's typo leaves its name out)

    def __init__(self, *args, settings_without_flags: Iterable[str] = (), **kwargs) -> None:
        # no abbreviations: --total would silently be --total-steps
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})
        self.settings_without_flags = frozenset(settings_without_flags)

    def parse_args(self, args=None, namespace=None):
        self.typed = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def suggestion(self, message: str) -> str:
        """What to add to argparse's ``message``: the closest flag or choice, where one is close."""
        flags = [o for action in self._actions for o in action.option_strings]
        if message.startswith("unrecognized arguments:"):
            unknown = [w.partition("=")[0] for w in message.split(":", 1)[1].split() if w.startswith("-")]
            keys = [k for w in unknown if (k := w.lstrip("-").replace("-", "_")) in self.settings_without_flags]
            if keys:
                return (f" ({', '.join(keys)} {'has' if len(keys) == 1 else 'have'} no flag: set "
                        f"{' and '.join(f'{k} = ...' for k in keys)} in a --config TOML file)")
            return did_you_mean(unknown, flags)
        if message.startswith("the following arguments are required:"):  # --chekpoint for --checkpoint
            unknown = sorted({w.partition("=")[0] for w in self.typed if w.startswith("--")} - set(flags))
            hint = did_you_mean(unknown, flags)
            return f" ({' and '.join(unknown)} {'is not a flag' if len(unknown) == 1 else 'are not flags'}; " \
                   f"{hint.strip(' ()')})" if hint else ""
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:
            return did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        return ""

    def print_help(self, file=None) -> None:
        if os.environ.get("RANK", "0") == "0":  # torchrun: every rank is asked, rank 0 answers
            super().print_help(file)

    def error(self, message: str):
        if os.environ.get("RANK", "0") != "0":  # torchrun: every rank meets the same mistake, and rank 0 says it
            self.exit(2)
        self.exit(2, f"{self.prog}: error: {message}{self.suggestion(message)} (see --help)\n")
