"""What an env argument's value must be, by the type of the argument: VR-edge's config checks its fields with
these, and the trainer checks any env's ``--env-kwargs`` against the kinds of its constructor's defaults."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def is_number(x: Any) -> bool:
    return isinstance(x, (float, np.floating)) or is_int(x)


def is_bool(x: Any) -> bool:
    return isinstance(x, (bool, np.bool_))


def is_str(x: Any) -> bool:
    return isinstance(x, str)


def finite(value: Any) -> bool:
    """Whether the numbers of ``value`` (a number, or a sequence of them) are finite; other values are."""
    numbers = value if isinstance(value, (tuple, list)) else [value]
    return all(math.isfinite(v) for v in numbers if is_number(v))


def shown(value: Any) -> str:
    """``value`` as a user writes it: a list (or tuple) in brackets, anything else as its ``repr``.

    >>> shown((8, 16.0, "x"))
    "[8, 16.0, 'x']"
    """
    if isinstance(value, (tuple, list)):
        return f"[{', '.join(map(shown, value))}]"
    return repr(value)


def kind_of(value: Any) -> str:
    """What ``value`` is, in a user's words: ``a list`` for a list or tuple, else its type's name."""
    return "a list" if isinstance(value, (tuple, list)) else type(value).__name__


# a type's name (an annotation under ``from __future__ import annotations``, or a default's type) -> (check, what
# it expects); an int is a number too, a bool is neither
KINDS = {"int": (is_int, "an integer"), "float": (is_number, "a number"), "str": (is_str, "text"),
         "bool": (is_bool, "true or false")}
