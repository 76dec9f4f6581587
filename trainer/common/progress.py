"""Progress bars on standard error for long work (training, distillation, evaluation): drawn where
standard error is a terminal, and where it is not (a pipe, a log file, CI) the bar's state as a line now and then,
so that minutes of work are never silent in a log either.

Why lines: a bar redrawn in place is what a terminal shows, but in a pipe it was switched off, and distillation
then printed nothing for 17 minutes of a loaded 2-core machine (``make train ... | tee``); every redraw written to
a file instead would be thousands of carriage returns.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

HEARTBEAT_S = 20.0  # where standard error is no terminal: a line at most this often, the first after as long


class StatusLines:
    """A file for tqdm where standard error is no terminal: the bar's latest state as one line, at most every
    ``every`` seconds and the first once the work has run that long, so that a long stretch says how far it got and
    a short one prints nothing more than it did; where it said anything, its last state too as the bar closes
    (the line a log ends the stretch with says that it finished, not where it was 20 s before).

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> lines = StatusLines(out, every=0.0)
        >>> lines.write("\\rlabelling  40%|####      | 0:10<0:15"); lines.write("")
        >>> out.getvalue()
        'labelling  40%|####      | 0:10<0:15\\n'
        >>> lines.every = 3600.0  # later states come too soon to be said ...
        >>> lines.write("\\rlabelling 100%|##########| 0:25<0:00"); lines.write("\\n")  # ... but the last, at close
        >>> out.getvalue().splitlines()[-1]
        'labelling 100%|##########| 0:25<0:00'
    """

    encoding = "ascii"  # tqdm draws its bar in ASCII for a log

    def __init__(self, stream: TextIO, every: float | None = None) -> None:
        self.stream, self.every = stream, HEARTBEAT_S if every is None else every
        self.last = time.monotonic()
        self.said, self.unsaid = False, ""  # whether a state was written; the latest state not written

    def write(self, text: str) -> None:
        status, now = text.strip(), time.monotonic()
        if status and now - self.last >= self.every:
            self._line(status)
            self.last = now
        elif status:
            self.unsaid = status
        elif "\n" in text and self.said and self.unsaid:  # tqdm closes a bar with a newline after its last state
            self._line(self.unsaid)

    def _line(self, status: str) -> None:
        self.stream.write(status + "\n")
        self.stream.flush()
        self.said, self.unsaid = True, ""

    def flush(self) -> None:
        """(A line is flushed as it is written.)"""


def progress_bar(total: float, desc: str | None, shown: bool | None = None, **kwargs: Any) -> Any:
    """A tqdm bar of ``total`` units on standard error: redrawn in place where it is a terminal, else a line of its
    state now and then (:class:`StatusLines`). ``shown=False``: nothing at all (a caller's own output, a test);
    ``True``: drawn as on a terminal. ``kwargs``: tqdm's (``unit``, ``bar_format``, ...)."""
    from tqdm import tqdm

    if shown is None and not sys.stderr.isatty():
        return tqdm(total=total, desc=desc, ncols=100, file=StatusLines(sys.stderr), **kwargs)
    return tqdm(total=total, desc=desc, dynamic_ncols=True, file=sys.stderr, disable=shown is False, **kwargs)


TICK_S = 1.0  # a terminal's bar redrawn this often between updates


@contextlib.contextmanager
def ticking(bar: Any, every: float = TICK_S, shown: bool = True) -> Iterator[None]:
    """While the block runs, ``bar`` (one of :func:`progress_bar`'s) redrawn every ``every`` seconds, so that a long
    step still moves it: a training iteration that compiles takes a minute or more on a busy 2-core CPU, and a bar
    that does not move reads as a hang. On a terminal its elapsed time moves; in a log the redraws go through
    :class:`StatusLines`, which keeps a line every :data:`HEARTBEAT_S` however long the step. ``shown=False``: no
    redraws.

    Example:
        >>> import io, time
        >>> from tqdm import tqdm
        >>> out = io.StringIO()
        >>> bar = tqdm(total=3, file=out)
        >>> with ticking(bar, every=0.01):
        ...     time.sleep(0.1)
        >>> out.getvalue().count("0/3") > 2  # redrawn with no update
        True
    """
    if bar.disable or not shown:
        yield
        return
    done = threading.Event()

    def tick() -> None:
        while not done.wait(every):
            bar.refresh()  # under tqdm's own lock, as its updates and writes are

    clock = threading.Thread(target=tick, name="bar-clock", daemon=True)
    clock.start()
    try:
        yield
    finally:
        done.set()
        clock.join()
