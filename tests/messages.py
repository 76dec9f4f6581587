"""What a test checks of an error a user meets: its kind (the exception type, the exit status), that it is one
line, and the things it names (a flag, a TOML key, a file path, the value given, a number computed), never the
sentence around them. The sentences of the messages users meet most are pinned whole in one place,
tests/test_messages.py, so that a rewording is made there, on purpose.

``names(text, "--num-envs", 0)`` holds for "--num-envs=0 is invalid: must be >= 1" and for
"--num-envs must be >= 1, got 0", not for "--num-envs-per-worker=0 ..." or "--num-envs=10 ...": a thing that
begins or ends with a letter or digit must stand apart from the letters, digits and hyphens next to it."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["mentions", "names", "not_names", "one_line", "suggestion", "raises", "error_line", "usage_error", "exits"]

_UNSET = object()


def _pattern(thing: Any) -> re.Pattern:
    text = str(thing)
    assert text, "an empty thing names nothing"
    left = r"(?<![\w-])(?<!\d\.)" if re.match(r"[\w-]", text) else ""
    right = r"(?![\w-]|\.\d)" if re.search(r"\w$", text) else ""
    return re.compile(left + re.escape(text) + right)


def mentions(text: str, *things: Any) -> bool:
    """Whether ``text`` names each of ``things`` (for a test that looks for the one message, among several, that
    does; :func:`names` asserts it)."""
    return all(_pattern(t).search(text) for t in things)


def names(text: str, *things: Any) -> str:
    """Assert that ``text`` names each of ``things`` (a flag, key, path, value or number: str() of it), as a
    whole token; return ``text``."""
    missing = [str(t) for t in things if not mentions(text, t)]
    assert not missing, f"{missing} not named in: {text!r}"
    return text


def not_names(text: str, *things: Any) -> str:
    """Assert that ``text`` names none of ``things`` (as whole tokens); return ``text``."""
    there = [str(t) for t in things if mentions(text, t)]
    assert not there, f"{there} named in: {text!r}"
    return text


def one_line(text: str) -> str:
    """Assert that ``text`` (less surrounding blank space) is one non-empty line; return that line."""
    line = str(text).strip()
    assert line and "\n" not in line, f"not one line: {text!r}"
    return line


def suggestion(text: str) -> str | None:
    """The correction a message offers for a typo ("did you mean X?"), or None."""
    found = re.findall(r"did you mean\s+([^\s?)]+)", text)
    assert len(found) <= 1, f"more than one suggestion in: {text!r}"
    return found[0] if found else None


@contextlib.contextmanager
def raises(kind: type[BaseException], *things: Any, key: str | None = None, value: Any = _UNSET,
           lines: int | None = 1) -> Iterator[pytest.ExceptionInfo]:
    """``pytest.raises(kind)`` whose message names ``things`` and is ``lines`` lines (None: any); ``key`` and
    ``value``: the error's ``.key`` and ``.value`` (a ConfigError's: the setting as its field is named, and the
    value given)."""
    with pytest.raises(kind) as info:
        yield info
    said = str(info.value)
    if lines == 1:
        one_line(said)
    elif lines is not None:
        assert len(said.strip().splitlines()) == lines, said
    names(said, *things)
    if key is not None:
        assert getattr(info.value, "key", None) == key, (getattr(info.value, "key", None), said)
    if value is not _UNSET:
        assert getattr(info.value, "value", _UNSET) == value, (getattr(info.value, "value", None), said)


def error_line(stderr: str, *things: Any) -> str:
    """The one error line of a command's ``stderr`` (``prog: error: ...`` or ``error: ...``), naming ``things``;
    no traceback."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if re.match(r"(\S+( -m \S+)?: )?error: ", line)]
    assert len(errors) == 1, stderr
    return names(errors[0], *things)


def usage_error(status: int, stderr: str, *things: Any) -> str:
    """A usage error: exit status 2 and one error line naming ``things``; return that line."""
    assert status == 2, (status, stderr)
    return error_line(stderr, *things)


@contextlib.contextmanager
def exits(status: int, *things: Any, capsys: pytest.CaptureFixture | None = None) -> Iterator[pytest.ExceptionInfo]:
    """A command's ``main`` ends with exit status ``status``, saying one error line that names ``things``: in the
    SystemExit (``sys.exit("error: ...")``, status 1) or, with ``capsys``, on stderr (argparse's usage errors)."""
    if capsys is not None:
        capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        yield info
    code = info.value.code
    said = code if isinstance(code, str) else capsys.readouterr().err if capsys is not None else ""
    assert (1 if isinstance(code, str) else code) == status, (code, said)
    if isinstance(code, str):
        names(one_line(said), *things)
    else:
        assert said or not things, "pass capsys to read what the command said"
        error_line(said, *things)


def printed_lines(stdout: str) -> dict[str, str]:
    """A command's ``name: value`` lines (a finished run's ``run directory:``, ``quality:``, ``evaluate:`` ...)."""
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in stdout.splitlines() if ":" in line}
