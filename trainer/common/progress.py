"""Progress bars on standard error for the long work after training (distillation, evaluation): drawn where
standard error is a terminal, and where it is not (a pipe, a log file, CI) the bar's state as a line now and then,
so that minutes of work are never silent in a log either.

Why lines: a bar redrawn in place is what a terminal shows, but in a pipe it was switched off, and distillation
then printed nothing for 17 minutes of a loaded 2-core machine (``make train ... | tee``); every redraw written to
a file instead would be thousands of carriage returns.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

HEARTBEAT_S = 20.0  # where standard error is no terminal: a line at most this often, the first after as long


class StatusLines:
    """A file for tqdm where standard error is no terminal: the bar's latest state as one line, at most every
    ``every`` seconds and the first once the work has run that long, so that a long stretch says how far it got and
    a short one prints nothing more than it did.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> lines = StatusLines(out, every=0.0)
        >>> lines.write("\\rlabelling  40%|####      | 0:10<0:15"); lines.write("")
        >>> out.getvalue()
        'labelling  40%|####      | 0:10<0:15\\n'
    """

    encoding = "ascii"  # tqdm draws its bar in ASCII for a log

    def __init__(self, stream: TextIO, every: float | None = None) -> None:
        self.stream, self.every = stream, HEARTBEAT_S if every is None else every
        self.last = time.monotonic()

    def write(self, text: str) -> None:
        status, now = text.strip(), time.monotonic()
        if status and now - self.last >= self.every:
            self.stream.write(status + "\n")
            self.stream.flush()
            self.last = now

    def flush(self) -> None:
        """(A line is flushed as it is written.)"""


def progress_bar(total: float, desc: str, shown: bool | None = None, **kwargs: Any) -> Any:
    """A tqdm bar of ``total`` units on standard error: redrawn in place where it is a terminal, else a line of its
    state now and then (:class:`StatusLines`). ``shown=False``: nothing at all (a caller's own output, a test);
    ``True``: drawn as on a terminal. ``kwargs``: tqdm's (``unit``, ``bar_format``, ...)."""
    from tqdm import tqdm

    if shown is None and not sys.stderr.isatty():
        return tqdm(total=total, desc=desc, ncols=100, file=StatusLines(sys.stderr), **kwargs)
    return tqdm(total=total, desc=desc, dynamic_ncols=True, file=sys.stderr, disable=shown is False, **kwargs)
