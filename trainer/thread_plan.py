"""The torch thread counts of an iteration's two phases, collecting and learning, chosen by timing the run's own
iterations (as FFTW plans a transform by measuring it), and chosen again when the machine's load changes.

Why measure: the fastest count depends on the CPU (its vendor, OpenMP's wait between ops), the network, the
batch and what else runs on the machine. On a quiet 2-core Intel Xeon one thread was fastest for PPO on CartPole
and two for VR-edge; next to two busy processes, a team of two threads waits on its descheduled half
(docs/benchmarks.md, "Threads chosen by measuring").

How: each candidate count (1, 2, 4, ... up to the cores the run layout gives the phase, and that cap) runs one
real iteration in an upward sweep, then once more in reverse order, and the faster of a count's two times
decides. A phase's upward sweep stops at a count 25% slower than its best
so far (time is U-shaped in the count), and before a count larger than the cores other processes leave free
(measured over the trial before: a team of threads that cannot all run waits on its descheduled members at every
op, which on a busy 2-core AMD EPYC made one iteration take over 45 s instead of 0.5). The first iteration of a
process (allocations, compiling) is not timed. Afterwards the plan is watched: three iterations in a row whose
collecting or learning time is 1.3x above (the cores were taken) or below (they came back) the median of the five
after the choice, or one iteration 3x above it, start a new plan. The trials are real iterations, so planning
costs only the difference between a trial's count and the best one.

Numbers: a thread count changes float rounding (CPU reductions are split by thread), so a planned run's numbers
depend on the counts it ran with, as with ``torch.backends.cudnn.benchmark``. Every metrics row records them, a
checkpoint holds the plan (a resume on the same machine goes on with it), and ``--threads N`` fixes them for runs
that must repeat bit for bit. Runs shorter than :data:`PLAN_MIN_ITERATIONS` (most tests) are not planned: they
run one thread per phase, which has no team to wait for and no other count's rounding.

    >>> planner = ThreadPlanner(collect_cap=1, learn_cap=2, machine="cpu x2")
    >>> for collect_s, learn_s in [(0.1, 9.9), (0.1, 1.0), (0.1, 0.6), (0.1, 0.5), (0.1, 0.9)]:
    ...     _ = planner.record(collect_s, learn_s)  # the first (warm-up) is not timed
    >>> planner.chosen
    {'collect': 1, 'learn': 2}
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any

import torch

from collectors.resources import CpuSample, cores_busy_elsewhere, cpu_model, cpu_sample

PHASES = ("collect", "learn")
PLAN_MIN_ITERATIONS = 100  # runs with fewer iterations ahead keep one thread per phase (see the module's text)
SWEEP_STOP = 1.25  # an upward sweep stops at a count this much slower than the phase's best so far
DRIFT = 1.3  # a phase this much slower (or faster) than after the choice, ...
DRIFT_RUN = 3  # ... this many iterations in a row, is planned again; ...
COLLAPSE = 3.0  # ... and at once after one iteration this much slower
BASELINE = 5  # iterations after a choice whose median the plan is watched against


def candidate_counts(cap: int) -> list[int]:
    """1, 2, 4, ... below ``cap``, and ``cap``: ``candidate_counts(12) == [1, 2, 4, 8, 12]``."""
    counts, n = [], 1
    while n < cap:
        counts.append(n)
        n *= 2
    return [*counts, max(1, cap)]


class ThreadPlanner:
    """Chooses each phase's thread count by timing iterations: :meth:`threads` before an iteration,
    :meth:`record` with its phases' seconds after it.

    ``collect_cap``, ``learn_cap``: the most threads of each phase (the run layout's counts); ``machine``: what
    a stored plan must have been made on to be reused; ``stored``: :meth:`state` of a checkpoint.
    """

    def __init__(self, collect_cap: int, learn_cap: int, machine: str, stored: dict[str, Any] | None = None) -> None:
        self.caps = {"collect": collect_cap, "learn": learn_cap}
        self.machine = machine
        self.chosen: dict[str, int] | None = None
        self.timings: dict[str, dict[int, list[float]]] = {}
        self.planned_at: tuple[int, int] | None = None  # (first, last) timed iteration of the plan, in this process
        self._warm = False
        self._recorded = 0
        if stored and stored.get("machine") == machine and stored.get("caps") == self.caps and stored.get("chosen"):
            self.chosen = {phase: int(stored["chosen"][phase]) for phase in PHASES}
            self.timings = {p: {int(k): v for k, v in t.items()} for p, t in stored.get("timings", {}).items()}
            self._watch()
        else:
            self._plan()

    # ------------------------------------------------------------------ the sweep
    def _plan(self) -> None:
        self.chosen, self.timings = None, {phase: {} for phase in PHASES}
        self._sweep = {phase: candidate_counts(self.caps[phase]) for phase in PHASES}  # round 1: upward
        self._round = 1
        self._first = None

    def _best(self, phase: str) -> int:
        times = self.timings[phase]
        return min(times, key=lambda n: min(times[n])) if times else self._sweep[phase][0]

    def threads(self) -> dict[str, int]:
        """The counts the next iteration runs with."""
        if self.chosen is not None:
            return dict(self.chosen)
        return {phase: self._sweep[phase][0] if self._sweep[phase] else self._best(phase) for phase in PHASES}

    @property
    def sweeping(self) -> bool:
        """Whether the next iteration is a trial."""
        return self.chosen is None

    def record(self, collect_s: float, learn_s: float, busy_elsewhere: float = 0.0) -> str:
        """Take the seconds of the iteration just run with :meth:`threads` (and, for a trial, the cores other
        processes kept busy meanwhile); returns a line for the user when the plan changed (chosen, or planned
        again), else ``""``."""
        self._recorded += 1
        if not self._warm:  # the first iteration of a process: allocations, compiling, caches
            self._warm = True
            return ""
        seconds = {"collect": collect_s, "learn": learn_s}
        if self.chosen is None:
            return self._trial(seconds, busy_elsewhere)
        return self._watched(seconds)

    def _trial(self, seconds: dict[str, float], busy_elsewhere: float) -> str:
        used = self.threads()
        self._first = self._first or self._recorded
        for phase in PHASES:
            sweep = self._sweep[phase]
            if not sweep:  # done with this phase: it ran at its best so far, which one more time only confirms
                self.timings[phase].setdefault(used[phase], []).append(seconds[phase])
                continue
            self.timings[phase].setdefault(sweep.pop(0), []).append(seconds[phase])
            best = min(min(t) for t in self.timings[phase].values())
            if self._round == 1 and (seconds[phase] > SWEEP_STOP * best or
                                     sweep and sweep[0] > self.caps[phase] - busy_elsewhere + 0.5):
                sweep.clear()  # past the bottom of the U, or more threads than free cores: slower still
        if any(self._sweep.values()):
            return ""
        if self._round == 1:  # round 2: every count measured, again, in reverse order (a trial slowed by chance)
            self._round = 2
            self._sweep = {phase: sorted(self.timings[phase], reverse=True) for phase in PHASES}
            return ""
        self.chosen = {phase: self._best(phase) for phase in PHASES}
        self.planned_at = (self._first, self._recorded)
        self._watch()
        return self.describe()

    # ------------------------------------------------------------------ watching the plan
    def _watch(self) -> None:
        self._baseline: dict[str, list[float]] = {phase: [] for phase in PHASES}
        self._recent = {phase: deque(maxlen=DRIFT_RUN) for phase in PHASES}

    def _watched(self, seconds: dict[str, float]) -> str:
        for phase in PHASES:
            if len(self._baseline[phase]) < BASELINE:
                self._baseline[phase].append(seconds[phase])
                continue
            recent = self._recent[phase]
            recent.append(seconds[phase])
            median = statistics.median(self._baseline[phase])
            drifted = len(recent) == DRIFT_RUN and (all(s > DRIFT * median for s in recent) or
                                                    all(s * DRIFT < median for s in recent))
            if self.caps[phase] > 1 and median > 0 and (drifted or recent[-1] > COLLAPSE * median):
                slower = recent[-1] > median
                self._plan()
                return (f"threads: {phase} took {recent[-1]:.3g} s against {median:.3g} s after the plan was made "
                        f"({'other processes took cores' if slower else 'cores came back'}): planning again")
        return ""

    # ------------------------------------------------------------------ what is said and stored
    def describe(self) -> str:
        """One line: the counts chosen and each candidate's best time."""
        assert self.chosen is not None
        where = f" over iterations {self.planned_at[0]}-{self.planned_at[1]} of this process" if self.planned_at \
            else " (the run's stored plan)"
        times = "; ".join(f"{phase}: " + ", ".join(f"{n} {min(t):.3g} s" for n, t in sorted(times.items()))
                          for phase, times in self.timings.items())
        return (f"threads: {self.chosen['collect']} collecting, {self.chosen['learn']} learning, measured{where} "
                f"({times}; --threads N fixes them)")

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the plan in effect (``None`` while planning), its timings and the machine."""
        return {"machine": self.machine, "caps": dict(self.caps), "chosen": self.chosen,
                "timings": {p: {str(n): t for n, t in times.items()} for p, times in self.timings.items()}
                if self.chosen else {}}


class RunThreads:
    """A run's thread counts, applied around each iteration: the collector's while it collects, this process's
    while it learns. Planned by a :class:`ThreadPlanner`, or fixed (``--threads N``; a CUDA learner, whose CPU
    threads hardly matter, keeps the run layout's; a run too short to plan, one per phase).

        counts = threads.apply()           # before an iteration
        row = algorithm.iterate(start)
        line = threads.record()            # after it: "" or what changed
    """

    def __init__(self, collector: Any, fixed: dict[str, int] | None = None, planner: ThreadPlanner | None = None,
                 why: str = "") -> None:
        self.collector, self.fixed, self.planner, self.why = collector, fixed, planner, why
        self._started: tuple[float, float] | None = None
        self._cpu: CpuSample | None = None

    @classmethod
    def for_run(cls, layout: Any, threads: int, collector: Any, iterations: int,
                stored: dict[str, Any] | None) -> RunThreads:
        """The counts of a run laid out as ``layout`` (``trainer.run_layout.RunLayout``) with ``--threads``
        ``threads``, ``iterations`` in all (so that a resumed run decides as the whole run did), and the plan its
        checkpoint ``stored``."""
        caps = {"collect": 1 if layout.backend == "ray" else layout.collect_threads,  # Ray's collecting only waits
                "learn": layout.learn_threads}
        if threads or not layout.device.startswith("cpu"):
            return cls(collector, {"collect": layout.collect_threads, "learn": layout.learn_threads},
                       why="--threads" if threads else f"the learner is on {layout.device}")
        if max(caps.values()) == 1:
            return cls(collector, caps, why=f"{layout.machine.cores} core{'s' if layout.machine.cores > 1 else ''} "
                       "for the phases: nothing to choose")
        planner = ThreadPlanner(caps["collect"], caps["learn"], f"{cpu_model()}, {layout.machine.cores} cores", stored)
        if iterations < PLAN_MIN_ITERATIONS and not planner.chosen:  # a stored plan goes on
            return cls(collector, {phase: 1 for phase in PHASES},
                       why=f"a run of {iterations} iterations, fewer than the {PLAN_MIN_ITERATIONS} that are planned")
        return cls(collector, planner=planner)

    def describe(self) -> str:
        """The line at the start of a run."""
        if self.fixed is not None:
            return f"threads: {self.fixed['collect']} collecting, {self.fixed['learn']} learning ({self.why})"
        if self.planner.chosen:
            return self.planner.describe()
        caps = self.planner.caps
        return (f"threads: chosen by timing the first iterations, up to {caps['collect']} collecting and "
                f"{caps['learn']} learning (--threads N fixes them)")

    def apply(self) -> dict[str, int]:
        """Set the counts of the next iteration and start timing it; returns them."""
        counts = self.planner.threads() if self.planner else dict(self.fixed)
        self.collector.num_threads = counts["collect"]
        torch.set_num_threads(counts["learn"])
        self._cpu = cpu_sample() if self.planner and self.planner.sweeping else None  # only trials need the load
        self._started = (time.perf_counter(), self.collector.seconds_collecting)
        return counts

    def record(self) -> str:
        """Time the iteration since :meth:`apply`; returns a line when the plan changed, else ``""``."""
        if self.planner is None or self._started is None:
            return ""
        wall, collecting = self._started
        collect_s = self.collector.seconds_collecting - collecting
        learn_s = time.perf_counter() - wall - collect_s
        elsewhere = cores_busy_elsewhere(self._cpu, cpu_sample()) if self._cpu else 0.0
        return self.planner.record(collect_s, learn_s, elsewhere)

    def state(self) -> dict[str, Any] | None:
        """What a checkpoint keeps (``None``: nothing planned)."""
        return self.planner.state() if self.planner else None
