"""What an env argument's value must be, by the type of the argument: VR-edge's config checks its fields' types
with these (their limits: ``envs.settings``), and the trainer checks any env's ``--env-kwargs`` against the kinds
of its constructor's defaults."""

from __future__ import annotations

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


def shown(value: Any) -> str:
    """``value`` as ``--env-kwargs`` and TOML write it: a list (or tuple) in brackets without spaces, text in
    double quotes, ``true``/``false``, anything else as its ``repr``.

    >>> shown((8, 16.0, "x", True))
    '[8,16.0,"x",true]'
    """
    if isinstance(value, (tuple, list)):
        return f"[{','.join(map(shown, value))}]"
    if isinstance(value, bool):
        return str(value).lower()
    return f'"{value}"' if isinstance(value, str) else repr(value)


# a type's name (an annotation under ``from __future__ import annotations``, or a default's type) -> (check, what
# it expects); an int is a number too, a bool is neither
KINDS = {"int": (is_int, "an integer"), "float": (is_number, "a number"), "str": (is_str, "text"),
         "bool": (is_bool, "true or false"),
         "int | str": (lambda x: is_int(x) or is_str(x), "a number or a range 'LOW-HIGH'"),
         "float | str": (lambda x: is_number(x) or is_str(x), "a number or a range 'LOW-HIGH'")}
