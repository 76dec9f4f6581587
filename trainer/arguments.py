"""What the command lines share when they parse: one-line errors that name the closest valid spelling.

Python 3.11's argparse says ``unrecognized arguments: --num-evns`` and nothing more; these errors add "did you
mean --num-envs?" (:func:`envs.settings.did_you_mean`). Imports only the standard library and ``envs.settings``,
so that ``--help`` and a typo answer before torch loads.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import select
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NoReturn

from envs.settings import ConfigError, did_you_mean

RANK_0_GRACE_S = 15.0  # how long another rank waits for rank 0 to say what they both met
# a command whose standard output's reader has gone (`| head -1`): what a shell reports for a tool that a closed
# pipe stopped (SIGPIPE, 13 on every Unix; Windows has no such signal)
CLOSED_STDOUT_STATUS = 128 + getattr(signal, "SIGPIPE", 13)


def exit_after_rank_0(status: int) -> NoReturn:
    """Under torchrun, end a rank other than 0 that met what rank 0 meets too (and says), with exit ``status``, once
    rank 0 has had time to say it. Exiting first, this rank would have torchrun stop rank 0 (SIGTERM) before a word
    was said; torchrun's SIGTERM after rank 0 has exited ends the wait, as does the grace running out."""
    def leave(*_) -> NoReturn:
        raise SystemExit(status)  # quietly (rank 0 speaks for every rank), and what this rank holds is closed

    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, leave)
    time.sleep(RANK_0_GRACE_S)
    leave()


@contextlib.contextmanager
def ending_quietly_when_stdout_closes() -> Iterator[None]:
    """Around a command's ``main`` (as a decorator, ``@ending_quietly_when_stdout_closes()``): standard output's
    reader gone (``python -m trainer.evaluate ... | head -1``) ends the command quietly with exit status
    :data:`CLOSED_STDOUT_STATUS` (141, as a shell reports a tool that a closed pipe stopped: ``set -o pipefail``
    sees it), not with a ``BrokenPipeError`` traceback, nor with Python's "Exception ignored" at exit. What the
    command had left to do after that moment is not done; what it wrote before is whole (its files are written
    before it says so). A ``BrokenPipeError`` of another pipe (a worker's) is raised as it was."""
    try:
        yield
        if sys.stdout is not None:  # (None: started with no standard output at all)
            sys.stdout.flush()  # what is still buffered meets a closed pipe here, not in the interpreter's exit
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        with contextlib.suppress(AttributeError, OSError, ValueError):  # (no file descriptor: a stream in this process)
            # the interpreter's flush at exit writes what is still buffered nowhere, rather than fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(CLOSED_STDOUT_STATUS) from None


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe (or socket) whose reader has gone, as ``poll`` tells it on Unix; where it
    cannot tell (Windows; a stream without a file descriptor, as a test's), a ``BrokenPipeError`` is taken for it."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):
        return True
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in events)


def counted(n: int, noun: str, plural: str = "") -> str:
    """``n`` and its noun, singular for one: ``counted(1, "env")`` is ``'1 env'``, ``counted(3, "minibatch",
    "minibatches")`` is ``'3 minibatches'``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def command(*args: str) -> str:
    """A shell command with this interpreter and absolute paths, so that it runs as printed from any
    directory (the packages may live in a venv that is not on the PATH)."""
    return " ".join(shlex.quote(a) for a in (os.path.abspath(sys.executable), *args))  # (no "../.venv": any dir)


def is_count(text: str) -> bool:
    """Whether ``text`` is a whole number written in the digits 0-9, as the lists of ``--seeds`` and ``--users``
    take them. Not ``str.isdigit``: it takes ``"²"`` too, which ``int`` refuses (a traceback, not the list's
    one-line error).

    >>> is_count("12"), is_count("²"), is_count(""), is_count("-1")
    (True, False, False, False)
    """
    return re.fullmatch(r"[0-9]+", text) is not None


def seed_list(text: str) -> tuple[int, ...]:
    """The seeds of ``--seeds``: ranges and single seeds separated by commas, each once, in order; an
    ``argparse.ArgumentTypeError`` saying what is wrong otherwise.

    >>> seed_list("1-3,7"), seed_list("5")
    ((1, 2, 3, 7), (5,))
    """
    seeds: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not (is_count(low) and (is_count(high) or not dash)) or dash and int(high) < int(low):
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


USERS_RULE = "must be user counts >= 1 or ranges 'LOW-HIGH', comma-separated (e.g. 2,4,8,12,16 or 4-12)"
CHURN_RULE = "must be probabilities within 0..1, comma-separated (e.g. 0,0.05)"


def user_counts(text: str) -> tuple[int | str, ...]:
    """The active-user counts of ``trainer.evaluate --users``: numbers and ranges ``"LOW-HIGH"`` (drawn per episode),
    comma-separated, each once, in order; a :class:`envs.settings.ConfigError` saying what is wrong otherwise.

    >>> user_counts("2,4,8"), user_counts("4-12,16")
    ((2, 4, 8), ('4-12', 16))
    >>> try:
    ...     user_counts("4,0")
    ... except ConfigError as e:
    ...     str(e).endswith("got '4,0': 0 is not one")
    True
    """
    counts: list[int | str] = []
    for part in (p.strip() for p in text.split(",")):
        low, dash, high = part.partition("-")
        if is_count(low) and is_count(high) and int(high) < int(low) >= 1:
            raise ConfigError("users", text, f"{USERS_RULE}: {part} runs backwards (write {high}-{low})")
        if not (is_count(low) and int(low) >= 1 and (not dash or is_count(high) and int(high) >= int(low))):
            raise ConfigError("users", text, f"{USERS_RULE}: {part or 'an empty entry'} is not one")
        count = f"{int(low)}-{int(high)}" if dash else int(low)
        if count in counts:
            raise ConfigError("users", text, f"{USERS_RULE}: {count} is given twice")
        counts.append(count)
    return tuple(counts)


def most_users(count: int | str) -> int:
    """The most active users of a :func:`user_counts` entry: the number, or a range's high end.

    >>> most_users(6), most_users("4-12")
    (6, 12)
    """
    return int(str(count).rpartition("-")[2])


def churn_levels(text: str) -> tuple[float, ...]:
    """The churn levels of ``trainer.evaluate --churn``: probabilities within 0..1, comma-separated, each once, in
    order; a :class:`envs.settings.ConfigError` saying what is wrong otherwise.

    >>> churn_levels("0,0.05")
    (0.0, 0.05)
    """
    levels: list[float] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            level = float(part)
        except ValueError:
            level = math.nan
        if not 0 <= level <= 1:
            raise ConfigError("churn", text, f"{CHURN_RULE}: {part or 'an empty entry'} is not one")
        if level in levels:
            raise ConfigError("churn", text, f"{CHURN_RULE}: {part} is given twice")
        levels.append(level)
    return tuple(levels)


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


def not_writable(flag: str, value: str) -> str:
    """What stops ``flag``'s output directory ``value`` from being written (a read-only file system, ``/proc``, no
    permission), for ``parser.error``; ``""`` otherwise. A folder is made and removed in it, or in the nearest of
    its parents that exists where it does not (nothing is left behind: a usage error found later writes nothing)."""
    existing = next((p for p in (Path(value), *Path(value).parents) if p.exists()), Path("."))
    try:
        with tempfile.TemporaryDirectory(dir=existing, prefix=".check-"):
            pass
    except OSError as e:
        return f"{flag} {value}: cannot write there ({e.strerror or e}); pass {flag} DIR, a folder you can write"
    return ""


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
            exit_after_rank_0(2)
        self.exit(2, f"{self.prog}: error: {message}{self.suggestion(message)} (see --help)\n")
