"""No wait without a bound (issue 24): hung env steps, stopped workers and a killed trainer, through the
Python API and the command line with real signals, with a census of the processes left behind; and envs stepped
in the trainer's own process, which hang with no worker to fall silent (issue 43)."""

import functools
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch.multiprocessing as tmp

import checkpoints
from collectors import WorkerTimeoutError, make_collector, watchdog
from collectors.backends.async_ import _worker_main
from collectors.deadlines import DEFAULT_WORKER_TIMEOUT_S, MAX_WORKER_TIMEOUT_S, START_TIMEOUT_S, Deadline
from collectors.processes import collector_process
from collectors.watchdog import GRACE_S, Watchdog
from tests import factories as f
from tests.factories import RandomPolicy, settings_file
from tests.messages import error_line, names, printed_lines, raises, usage_error
from trainer.config import TrainConfig
from trainer.interrupts import Interrupted, StopSignals
from trainer.run_layout import Machine, run_layout

ROOT = Path(__file__).resolve().parent.parent
HANGING = "tests.factories:Hanging-v0"  # CartPole whose 40th step hangs in a worker process
STUCK_IN_PYTHON = "tests.factories:StuckInPython-v0"  # ... in the trainer (with --overlap, its collecting process)
# 1 worker process + the collecting process stepping envs 0-1, whatever the machine's cores
OWN_SHARE = ["--backend", "async", "--config", settings_file("own_share"), "--worker-timeout", "2"]
# eager: a run this long would compile under --compile auto, which these tests about hangs need not wait for
SMALL = ["--num-envs", "4", "--num-steps", "8", "--total-steps", "100000000", "--device", "cpu", "--seed", "3",
         "--checkpoint-every", "1000", "--compile", "off"]


# ---------------------------------------------------------------------------------------------- the deadline
def test_the_deadline_has_a_floor_and_stretches_with_the_slowest_answer():
    d = Deadline(2.0)
    assert d.limit("step") == 2.0 and d.limit("start") == d.limit("reset") == START_TIMEOUT_S
    d.measured(0.5)
    d.measured(0.25)
    assert d.limit("step") == 10.0  # 20 x the slowest, above the floor
    d.measured(1e9)  # an answer that took ages says the env is slow, but a wait takes no longer bound than this
    assert d.limit("step") == MAX_WORKER_TIMEOUT_S


def test_the_trainer_and_the_collectors_default_to_the_same_worker_timeout():
    # TrainConfig spells the number out: importing collectors would load torch before the command line is checked
    assert TrainConfig().worker_timeout == DEFAULT_WORKER_TIMEOUT_S


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), 3e6, True, "5"])
def test_a_bad_worker_timeout_is_a_clear_error(bad):
    with raises(ValueError, "worker_timeout", "1e+06"):  # and the limit
        make_collector([f.cartpole] * 2, RandomPolicy(2), backend="sync", num_steps=4, worker_timeout=bad)


@pytest.mark.parametrize("value", ["0", "3e6"])  # 3e6 s overflowed poll()'s millisecond timeout: a traceback
def test_a_bad_worker_timeout_flag_is_a_one_line_error(value):
    out = subprocess.run([sys.executable, "-m", "trainer.train", "--worker-timeout", value], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    usage_error(out.returncode, out.stderr, "--worker-timeout", float(value), "1e6")  # the value, the limit


# ---------------------------------------------------------------------------------------------- the API
def test_a_hung_async_worker_is_named_after_the_deadline_and_shut_down():
    fns = [f.cartpole, f.cartpole, f.hanging, f.hanging]  # the worker hosts envs 2-3
    collector = make_collector(fns, RandomPolicy(2), backend="async", num_steps=8, num_workers=1, worker_timeout=1.0)
    procs = list(collector.stepper.procs)
    with raises(WorkerTimeoutError, "worker 0", "envs 2-3", "step", "1 s"):  # who, doing what, the limit
        for _ in range(10):
            collector.collect()
    assert not any(p.is_alive() for p in procs)


def test_a_hung_step_in_the_collecting_process_is_named_after_the_deadline():
    with make_collector([f.hanging] * 2, RandomPolicy(2), backend="sync", num_steps=8, background=True,
                        worker_timeout=1.0) as collector:
        process = collector._process
        started = time.monotonic()
        with raises(WorkerTimeoutError, "collecting process", f"pid {process.pid}", "envs 0-1", "collect"):
            for _ in range(10):
                collector.collect()
        assert time.monotonic() - started < 30
    assert not process.is_alive()


def test_a_hung_step_of_the_collecting_processs_own_envs_is_named_after_the_deadline():
    """The async backend's own share (main_share): envs stepped in this process, where no worker falls silent.
    Past the deadline the step is interrupted; the error names them, this process and the flag; the workers are
    shut down, and SIGALRM (the trainer's stop signals use it too) is given back."""
    before = signal.getsignal(signal.SIGALRM)
    collector = make_collector([f.stuck_in_python] * 4, RandomPolicy(2), backend="async", num_steps=8, num_workers=1,
                               worker_timeout=1.0)
    procs = list(collector.stepper.procs)
    started = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as raised:
        for _ in range(10):
            collector.collect()
    assert time.monotonic() - started < 15  # the env's hang (30 s) was cut short
    names(str(raised.value), "envs 0-1", f"pid {os.getpid()}", "--worker-timeout")
    assert not any(p.is_alive() for p in procs)
    assert signal.getsignal(signal.SIGALRM) == before


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # pure Python: no system call for a signal to cut short
        pass


def _swallowing(seconds: float) -> None:
    try:
        time.sleep(seconds)
    except Exception:  # an env that hides its errors must not hide the interrupt too
        time.sleep(seconds)


@pytest.mark.parametrize("hang", [time.sleep, _spin, _swallowing])
def test_a_call_of_this_processs_envs_past_its_deadline_is_interrupted(hang):
    dog = Watchdog(Deadline(0.5), [], "envs 0-1")
    try:
        started = time.monotonic()
        with pytest.raises(WorkerTimeoutError):
            dog.call("step", hang, 20.0)
        assert time.monotonic() - started < 5
        assert dog.call("step", sum, [1, 2]) == 3  # the next call runs as before
    finally:
        dog.close()


def test_a_call_from_another_thread_runs_unbounded_and_leaves_the_main_thread_alone():
    """Only the main thread runs signal handlers: the interrupt of a call made elsewhere would land in whatever
    the main thread is doing."""
    dog = Watchdog(Deadline(0.2), [], "envs 0-1")
    try:
        elsewhere = threading.Thread(target=dog.call, args=("step", time.sleep, 0.8))
        elsewhere.start()
        time.sleep(1.2)  # the main thread, busy with something else the whole time
        elsewhere.join()
    finally:
        dog.close()


def test_stop_signals_keep_their_patience_and_their_meaning_while_a_watchdog_is_open():
    """The watchdog interrupts with SIGALRM, which also carries a stop signal's patience (trainer.interrupts): a
    stop in a patient section that waits on a hung call still comes within the patience, a Ctrl-C in a watched
    call is a stop (not a timeout), and the handlers are the trainer's again once the watchdog is closed."""
    with StopSignals() as signals:
        theirs = signal.getsignal(signal.SIGALRM)
        dog = Watchdog(Deadline(60.0), [], "envs 0-1")
        try:
            started = time.monotonic()
            with pytest.raises(Interrupted):
                with signals.critical(patience_s=0.5):
                    os.kill(os.getpid(), signal.SIGTERM)
                    dog.call("get_states", time.sleep, 10)
            assert time.monotonic() - started < 5
        finally:
            dog.close()
        assert signal.getsignal(signal.SIGALRM) == theirs
    with StopSignals():
        dog = Watchdog(Deadline(60.0), [], "envs 0-1")
        try:
            with pytest.raises(Interrupted) as stopped:
                dog.call("step", lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(10)))
            assert stopped.value.signum == signal.SIGINT
        finally:
            dog.close()


def test_where_no_thread_can_interrupt_another_the_run_says_its_own_share_is_unbounded(monkeypatch):
    """Windows has no signal.pthread_kill: the collecting process's envs step unbounded, and the run layout says so,
    with the flag that puts every env in a worker process."""
    monkeypatch.setattr(watchdog, "CAN_BOUND", False)
    before = signal.getsignal(signal.SIGALRM)
    dog = Watchdog(Deadline(0.1), [], "envs 0-1")
    assert dog.call("step", time.sleep, 0.3) is None and signal.getsignal(signal.SIGALRM) == before
    dog.close()
    shared = run_layout(TrainConfig(env="CartPole-v1", backend="async", num_envs=4), Machine(cores=4))
    assert shared.main_share
    assert [w for w in shared.warnings if "--worker-timeout" in w and "--num-workers 4" in w], shared.warnings
    every_env_in_a_worker = run_layout(TrainConfig(env="CartPole-v1", backend="async", num_envs=4, num_workers=4),
                                       Machine(cores=4))
    assert not every_env_in_a_worker.main_share and not every_env_in_a_worker.warnings


@pytest.mark.parametrize("call, phase", [("collect", "step"),
                                         pytest.param("get_state", "get_states", marks=pytest.mark.slow)])
def test_a_stopped_async_worker_of_the_collecting_process_is_named(call, phase):
    """The collecting process's deadline leaves room for its own deadline on its workers: a worker stopped
    beneath it is named with its envs, in a rollout and in the per-iteration snapshot alike; both deadlines
    share a floor, and the outer one used to fire first."""
    with make_collector([f.cartpole] * 4, RandomPolicy(2), backend="async", num_steps=8, background=True,
                        num_workers=1, worker_timeout=1.0) as collector:
        for _ in range(3):
            collector.collect()
        worker = _newest_worker(psutil.Process(collector._process.pid).children(recursive=True))
        os.kill(worker.pid, signal.SIGSTOP)
        with raises(WorkerTimeoutError, "worker 0", f"pid {worker.pid}", "envs 2-3", phase):
            getattr(collector, call)()
    _assert_none_left([worker])


@pytest.mark.slow  # the stretched deadline is waited out
def test_a_worker_is_named_when_the_collecting_process_deadline_on_it_stretched_in_the_first_rollout():
    """The collecting process's deadline on its workers measures the first rollout's steps (a slow warm-up step of
    its own envs: 0.3 s, a 6 s limit), which this process's deadline does not count: it must still wait for that
    deadline to fire, not report the collecting process silent first."""
    slow_first_step = functools.partial(f.StuckInPythonEnv, fail_at=1, hang_s=0.15)  # its 2 envs: 0.3 s
    with make_collector([slow_first_step] * 4, RandomPolicy(2), backend="async", num_steps=8, background=True,
                        num_workers=1, worker_timeout=0.5) as collector:
        for _ in range(3):
            collector.collect()
        worker = _newest_worker(psutil.Process(collector._process.pid).children(recursive=True))
        os.kill(worker.pid, signal.SIGSTOP)
        with raises(WorkerTimeoutError, "worker 0", f"pid {worker.pid}", "envs 2-3"):
            collector.collect()
    _assert_none_left([worker])


def test_the_learners_own_time_does_not_stretch_the_collecting_process_deadline():
    """With --overlap the learner reads each rollout after its update: the deadline must measure the collecting
    process's work, not the learner's (a slow or compiling update would make a hang noticed minutes late)."""
    with make_collector([f.cartpole] * 2, RandomPolicy(2), backend="sync", num_steps=8, background=True,
                        worker_timeout=1.0) as collector:
        for _ in range(3):  # the first rollout is not measured (start-up)
            collector.start()
            time.sleep(1.5)  # "learning" while the rollout, a few milliseconds of work, is long done
            collector.wait()
        assert 0 < collector.deadline.slowest_s < 0.5
        assert collector.deadline.limit("collect") == 1.0


def test_a_stop_signal_waits_at_most_the_patience_of_a_section_that_waits_on_workers():
    with StopSignals() as signals:
        started = time.monotonic()
        with pytest.raises(Interrupted):
            with signals.critical():
                with signals.critical(patience_s=0.5):
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(10)  # a worker that does not answer
                pytest.fail("the patient section was not abandoned")
        assert time.monotonic() - started < 5
    with StopSignals() as signals:  # a plain critical section still holds the signal until it ends
        finished = False
        with pytest.raises(Interrupted):
            with signals.critical():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                finished = True
        assert finished


def test_the_first_spawn_keeps_stop_signals_blocked():
    """The resource tracker, started by the first spawn, unblocked SIGINT/SIGTERM while a child was starting."""
    script = textwrap.dedent("""
        import signal, torch.multiprocessing as tmp
        from collectors.stop_signals import stop_signals_blocked
        if __name__ == "__main__":
            p = tmp.get_context("spawn").Process(target=print, args=("child",))
            with stop_signals_blocked():
                p.start()
                print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
            p.join()
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    blocked = [line for line in out.stdout.splitlines() if line.startswith("[")]
    assert blocked and {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1} <= set(eval(blocked[0])), out


def test_stop_signals_held_back_wait_for_the_block_though_another_thread_takes_them():
    """A process with other threads (torch's OpenMP pool, started with the signals unblocked) gets a stop signal in
    one of those; Python then ran its handler in the main thread in the middle of the block (a Ctrl-C half-way
    through starting a process, which was then orphaned). It is delivered when the block ends, once, to the
    handler it would have met; the handlers are as they were."""
    script = textwrap.dedent("""
        import os, signal, subprocess, threading, time
        from collectors.stop_signals import held_back, stop_signals_blocked
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()  # its mask has the signals unblocked
        signal.signal(signal.SIGTERM, lambda s, f: print("SIGTERM handled", flush=True))
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            with stop_signals_blocked():
                for name in ("TERM", "TERM", "INT"):  # from another process: the kernel picks the thread
                    subprocess.run(["kill", f"-{name}", str(os.getpid())], check=True)
                time.sleep(0.5)
                print("held back", held_back(), flush=True)
        except KeyboardInterrupt:
            print("KeyboardInterrupt after the block", flush=True)
        print("handlers kept", before == {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)})
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines() == ["held back True", "SIGTERM handled", "KeyboardInterrupt after the block",
                                       "handlers kept True"], out


def test_stop_signals_held_are_all_delivered_though_the_first_raises():
    """A Ctrl-C and a SIGTERM both held: the Ctrl-C's KeyboardInterrupt, raised by its handler first (Python runs
    pending handlers in signal-number order), lost the SIGTERM (the CI failure of 366d93a, a timing race there)."""
    script = textwrap.dedent("""
        import os, signal
        from collectors.stop_signals import stop_signals_held
        signal.signal(signal.SIGTERM, lambda s, f: print("SIGTERM handled", flush=True))
        try:
            with stop_signals_held():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
                print("whole", flush=True)
        except KeyboardInterrupt:
            print("KeyboardInterrupt after the block", flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines() == ["whole", "SIGTERM handled", "KeyboardInterrupt after the block"], out


@pytest.mark.parametrize("first", [
    pickle.dumps(("buffers", [0], {"actions": list(range(1000))}))[:40],  # truncated: the parent died mid-send
    pickle.dumps(("close", None)),  # closed during start-up (Ctrl-C): it printed a ValueError traceback
])
def test_a_worker_whose_parent_dies_mid_send_exits_quietly(capfd, first):
    ctx = tmp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = collector_process(ctx, _worker_main, ([[f.cartpole]], [0], child), name="env-worker-0", daemon=True)
    p.start()
    child.close()
    assert parent.recv()[0] == "ready"
    parent.send_bytes(first)
    parent.close()
    p.join(timeout=60)
    assert p.exitcode == 0
    assert "Error" not in capfd.readouterr().err


# ---------------------------------------------------------------------------------------------- the command line
def _start(args, run_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "trainer.train", *SMALL, *args, "--run-dir", str(run_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _descendants_once_running(proc, run_dir, count, timeout=90.0):
    """The trainer's descendants once it has completed an iteration and ``count`` of them are up."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        kids = psutil.Process(proc.pid).children(recursive=True)
        log = run_dir / "metrics.jsonl"
        if len(kids) >= count and log.exists() and log.read_text().count("\n") >= 2:
            return kids
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    pytest.fail("the run did not get going")


def _assert_none_left(procs):
    """The census: every process the trainer started is gone (children, and those re-parented to pid 1)."""
    _, alive = psutil.wait_procs(procs, timeout=10)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.ppid(), p.cmdline()) for p in alive]


def _ours(procs):
    """The processes a collector started (named by them), without multiprocessing's resource tracker and
    forkservers: forked from one, a worker shares its command line."""
    return [p for p in procs if p.name() == "collector" or p.name().startswith("env-worker-")]


def _newest_worker(procs):
    """The newest process the trainer started besides multiprocessing's helpers: an async worker."""
    return max(_ours(procs), key=lambda p: p.create_time())


@pytest.mark.parametrize("overlap", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_killed_worker_stops_the_run_with_one_line_whatever_it_was_doing(tmp_path, overlap):
    """SIGKILL an async worker (with --overlap: the collecting process) at a moment the test does not choose:
    most of an iteration is learning, so its death is mostly found by the next command sent to it, not by a
    reply. One line naming it, the last completed iteration saved, the resume line, nothing left running."""
    import random
    run_dir = tmp_path / "run"
    proc = _start(["--backend", "async", "--num-workers", "1", "--overlap", str(overlap).lower()], run_dir)
    kids = _descendants_once_running(proc, run_dir, count=3 if overlap else 2)
    victim = min(_ours(kids), key=lambda p: p.create_time()) if overlap else _newest_worker(kids)
    time.sleep(random.uniform(0.0, 1.0))
    victim.kill()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    line = error_line(err, f"pid {victim.pid}", "SIGKILL", "out-of-memory", "kill -9")  # who, how, what may have
    names(line, "collecting process") if overlap else names(line, "worker 0", "envs 2-3")  # done it
    assert err.rstrip().endswith(f"--resume {run_dir.resolve()}"), err
    state = checkpoints.latest_loadable(run_dir)[1]
    assert state["iteration"] == (run_dir / "metrics.jsonl").read_text().count("\n") >= 2
    assert not (run_dir / "lock").exists()
    _assert_none_left(kids)


CASES = [(signal.SIGINT, False)]  # the rest are slow: the same path, the other signals and --overlap
# each stop signal once and --overlap both ways (all six pairs repeated one handler's path)
SLOW_CASES = [(signal.SIGTERM, True), (signal.SIGUSR1, False)]


@pytest.mark.parametrize(("signum", "overlap"), CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW_CASES])
@pytest.mark.slow  # (25 s; quick: the other hung-worker tests)
def test_a_stopped_worker_costs_no_stop_signal(tmp_path, signum, overlap):
    """SIGSTOP an async worker (or the collecting process's), then signal the trainer: it stops within seconds,
    saves the last completed iteration, prints the resume line, and leaves nothing running."""
    run_dir = tmp_path / "run"
    proc = _start(["--backend", "async", "--num-workers", "1", "--overlap", str(overlap).lower()], run_dir)
    kids = _descendants_once_running(proc, run_dir, count=3 if overlap else 2)
    os.kill(_newest_worker(kids).pid, signal.SIGSTOP)
    time.sleep(1.0)
    started = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 20, err
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err
    assert f"--resume {run_dir}" in err
    state = checkpoints.latest_loadable(run_dir)[1]
    assert state["iteration"] == (run_dir / "metrics.jsonl").read_text().count("\n") >= 2
    assert not (run_dir / "lock").exists()
    _assert_none_left(kids)


@pytest.mark.parametrize("overlap", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_hung_env_step_stops_the_run_with_one_line(tmp_path, overlap):
    """A step that never returns: after --worker-timeout, one line naming the worker; the last completed
    iteration is saved; nothing is left running."""
    run_dir = tmp_path / "run"
    proc = _start(["--env", HANGING, "--backend", "async", "--num-workers", "1", "--worker-timeout", "2",
                   "--overlap", str(overlap).lower()], run_dir)
    kids = psutil.Process(proc.pid).children(recursive=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    # with --overlap too: the worker that hosts the hung envs, not the collecting process waiting on it
    error_line(err, "worker 0", "2 s")  # and the limit
    assert f"--resume {run_dir.resolve()}" in err  # what was completed is saved, and says how to go on
    state = checkpoints.latest_loadable(run_dir)[1]
    assert state["iteration"] == (run_dir / "metrics.jsonl").read_text().count("\n") >= 1
    assert not (run_dir / "lock").exists()
    _assert_none_left(kids)


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_nothing_outlives_a_killed_trainer_with_a_hung_worker(tmp_path):
    """SIGKILL while an async worker of the collecting process hangs in a step: the collecting process, the
    worker and the resource tracker go with the trainer, so a pipe to the trainer's stdout closes (`| tee`)."""
    run_dir = tmp_path / "run"
    proc = _start(["--env", HANGING, "--backend", "async", "--num-workers", "1", "--worker-timeout", "600",
                   "--overlap", "true"], run_dir)
    kids = _descendants_once_running(proc, run_dir, count=3)
    time.sleep(2.0)  # the worker reaches its hanging step
    proc.kill()
    proc.communicate(timeout=30)  # returns only once every holder of its stdout and stderr is gone
    _assert_none_left(kids)


def _stderr_once_ended(proc, timeout):
    """``proc``'s stderr once it has ended within ``timeout`` s; else it is killed, and the test fails."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still running after {timeout} s:\n{proc.communicate()[1][-3000:]}")


def _assert_stopped_with_its_checkpoint(proc, err, run_dir, kids, here):
    """Exit status 1, one line naming the envs of process ``here`` and the flag, the last completed iteration saved
    with the resume line, the run directory given back, and nothing left running."""
    assert proc.returncode == 1, err
    error_line(err, "envs 0-1", f"pid {here}", "--worker-timeout")
    assert f"--resume {run_dir.resolve()}" in err
    state = checkpoints.latest_loadable(run_dir)[1]
    assert state["iteration"] == (run_dir / "metrics.jsonl").read_text().count("\n") >= 2
    assert not (run_dir / "lock").exists()
    _assert_none_left(kids)


@pytest.mark.slow  # a trainer's start-up, then the deadline
@pytest.mark.parametrize("overlap", [False, True])
def test_a_hung_step_in_the_trainers_own_envs_stops_the_run_with_one_line(tmp_path, overlap):
    """The default async layout steps a share of the envs in the trainer itself (with --overlap, in its collecting
    process): a step there that never returns is stopped like a worker's, after --worker-timeout."""
    run_dir = tmp_path / "run"
    proc = _start(["--env", STUCK_IN_PYTHON, *OWN_SHARE, "--overlap", str(overlap).lower()], run_dir)
    kids = _descendants_once_running(proc, run_dir, count=3 if overlap else 2)
    here = next(p.pid for p in kids if p.name() == "collector") if overlap else proc.pid
    going = time.monotonic()
    err = _stderr_once_ended(proc, timeout=2 + 60)
    assert time.monotonic() - going < 2 + 60
    _assert_stopped_with_its_checkpoint(proc, err, run_dir, kids, here)


@pytest.mark.slow  # the deadline, then the interrupt's grace
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the env deadlocks on a glibc mutex")
def test_an_env_stuck_in_c_code_in_the_trainer_ends_the_run_with_its_checkpoint(tmp_path):
    """A step stuck inside C code (the GIL released) never comes back to Python, so no interrupt ends it: once the
    interrupt has had its grace, the watchdog kills the workers, the last completed iteration is saved, and the
    process ends, with the same line."""
    run_dir = tmp_path / "run"
    proc = _start(["--env", "tests.factories:StuckInC-v0", *OWN_SHARE], run_dir)
    kids = _descendants_once_running(proc, run_dir, count=2)
    going = time.monotonic()
    err = _stderr_once_ended(proc, timeout=2 + GRACE_S + 60)
    assert time.monotonic() - going < 2 + GRACE_S + 60
    _assert_stopped_with_its_checkpoint(proc, err, run_dir, kids, proc.pid)


@pytest.mark.parametrize("backend", ["sync", "serial"])
def test_a_hung_step_of_the_sync_and_serial_backends_stops_the_run_with_one_line(tmp_path, backend):
    """The sync and serial backends step every env in the trainer itself (issue 52): a step that hangs is stopped
    after --worker-timeout as the async backend's own share is, the last completed iteration saved."""
    run_dir = tmp_path / "run"
    going = time.monotonic()
    proc = _start(["--env", STUCK_IN_PYTHON, "--backend", backend, "--worker-timeout", "2", "--threads", "1"],
                  run_dir)
    err = _stderr_once_ended(proc, timeout=2 + 60)  # the env would sleep an hour: unbounded, the test fails
    assert time.monotonic() - going < 2 + 60
    assert proc.returncode == 1, err
    error_line(err, "envs 0-3", f"pid {proc.pid}", "step", "2 s", "--worker-timeout")
    assert f"--resume {run_dir.resolve()}" in err
    state = checkpoints.latest_loadable(run_dir)[1]
    assert state["iteration"] == (run_dir / "metrics.jsonl").read_text().count("\n") >= 2
    assert not (run_dir / "lock").exists()


def test_a_hung_validation_step_stops_the_run_with_one_line(tmp_path):
    """Validation episodes (--eval-every) are played in the trainer: a step of theirs that hangs is stopped after
    --worker-timeout, with one line, the last completed iteration saved (issue 52)."""
    run_dir = tmp_path / "run"
    going = time.monotonic()
    proc = _start(["--env", "tests.factories:StuckInValidation-v0", "--backend", "sync", "--eval-every", "2",
                   "--eval-episodes", "2", "--checkpoint-every", "1", "--worker-timeout", "2", "--threads", "1"],
                  run_dir)
    err = _stderr_once_ended(proc, timeout=2 + 60)  # a validation step would sleep an hour
    assert time.monotonic() - going < 2 + 60
    assert proc.returncode == 1, err
    error_line(err, "validation's", "step", "--worker-timeout")
    assert f"--resume {run_dir.resolve()}" in err
    assert checkpoints.latest_loadable(run_dir)[1]["iteration"] == 1  # validated at 2: iteration 1 is the last
    assert not (run_dir / "lock").exists()


def test_a_hung_step_in_the_final_validation_leaves_the_run_finished(tmp_path):
    """The end of a run plays its policy on the validation episodes: a step that hangs there is given up after
    --worker-timeout, said on the quality line, and the finished run exits 0 with the commands that go on from it."""
    run_dir = tmp_path / "run"
    proc = _start(["--env", "tests.factories:StuckInValidation-v0", "--backend", "sync", "--eval-episodes", "2",
                   "--total-steps", "64", "--worker-timeout", "2", "--threads", "1"], run_dir)
    out, err = proc.communicate(timeout=2 + 90)  # a validation step would sleep an hour
    lines = printed_lines(out)
    assert proc.returncode == 0, err
    assert "--worker-timeout" in lines["quality"] and "reward" not in lines["quality"] and "evaluate" in lines
    assert checkpoints.latest_loadable(run_dir)[1]["iteration"] >= 1 and not (run_dir / "lock").exists()
