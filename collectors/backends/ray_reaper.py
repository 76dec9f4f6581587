"""The reaper of a local Ray instance: kills what the trainer started once the trainer is gone.

A local ``ray.init`` starts daemons (GCS, raylet, and agents under the raylet). When the trainer is
SIGKILLed, the GCS and the raylet notice within seconds, but the raylet's agents were seen living
60-70 s on, reparented to init. Their parent is gone by then, so nothing that watches a parent can
reach them; this process watches the trainer instead: it records the trainer's descendants that are
Ray's once a second and, when the trainer has exited, kills those still running (psutil compares start
times, so a recycled pid is never hit; other children of the trainer are not Ray's business).

Run as a script, not imported, so that it loads neither torch nor the project::

    python -I ray_reaper.py TRAINER_PID

It ignores stop signals (a scheduler's SIGTERM to the job's process group is the trainer's to handle;
the reaper stays to clean up after it) and dies with the trainer's SIGKILL of the group like the rest.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 1.0  # psutil walks /proc for the trainer's descendants: once a second costs little on a busy node


def _is_ray(p) -> bool:
    try:
        return "ray" in " ".join(p.cmdline())  # gcs_server and raylet in ray's package dir, ray:: workers, agents
    except Exception:  # psutil.Error: gone, or not ours to read
        return False


def reap_after(trainer_pid: int, poll_s: float = POLL_S) -> int:
    """Record ``trainer_pid``'s descendants whose command line names Ray until it exits (this process is its
    child: a new parent pid means it is gone), then kill those still running. Returns how many were killed."""
    import psutil

    me = os.getpid()
    known: dict[int, psutil.Process] = {}
    while os.getppid() == trainer_pid:
        try:
            for p in psutil.Process(trainer_pid).children(recursive=True):
                if p.pid != me and p.pid not in known and _is_ray(p):
                    known[p.pid] = p
        except psutil.Error:  # exiting right now: what was recorded a moment ago is what is left
            break
        time.sleep(poll_s)
    killed = 0
    for p in known.values():
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                p.kill()
                killed += 1
        except psutil.Error:
            pass
    return killed


if __name__ == "__main__":
    for signum in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", signal.SIGTERM)):
        signal.signal(signum, signal.SIG_IGN)
    reap_after(int(sys.argv[1]))
