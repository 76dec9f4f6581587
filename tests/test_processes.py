"""How a collector starts its processes: forked from one forkserver (or spawned), named, stop signals held back
until they ignore them, and gone with the process that started them."""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import checkpoints
from collectors import make_collector
from collectors.backends.async_ import AsyncStepper
from collectors.processes import process_context
from tests import factories as f
from tests.messages import raises

ROOT = Path(__file__).resolve().parents[1]
FORKSERVER = "forkserver" in mp.get_all_start_methods()


def _run(script: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, **kwargs)


@pytest.mark.skipif(not FORKSERVER, reason="this platform has no forkserver")
def test_workers_are_forked_from_one_forkserver_and_named():
    """Every collector of this process forks its workers from the same forkserver (torch imported once), and
    each worker is named for ps and top, where all of them share the forkserver's command line."""
    first = AsyncStepper([f.cartpole] * 3, num_workers=2)
    second = AsyncStepper([f.cartpole] * 2, num_workers=1)
    try:
        workers = [psutil.Process(p.pid) for p in (*first.procs, *second.procs)]
        servers = {w.ppid() for w in workers}
        assert len(servers) == 1 and os.getpid() not in servers
        server = psutil.Process(servers.pop())
        assert server.ppid() == os.getpid() and "multiprocessing.forkserver" in " ".join(server.cmdline())
        assert [w.name() for w in workers] == ["env-worker-0", "env-worker-1", "env-worker-0"]
        obs = second.shared["next_obs"].numpy()
        second.reset([1, 2], obs)  # the forked workers serve commands
        assert obs.any()
    finally:
        first.close()
        second.close()
    assert not mp.active_children()


def test_spawn_where_asked_gives_the_same_envs_and_workers_that_die_with_this_process():
    """``start_method="spawn"`` (the only one on Windows): workers are this process's children, and give the
    same observations as forked ones."""
    methods = ["spawn", *(["forkserver"] if FORKSERVER else [])]
    observations = []
    for method in methods:
        stepper = AsyncStepper([f.cartpole] * 2, num_workers=1, start_method=method)
        try:
            parent = psutil.Process(stepper.procs[0].pid).ppid()
            assert (parent == os.getpid()) == (method == "spawn")
            stepper.reset([7, 8], stepper.shared["next_obs"].numpy())
            observations.append(stepper.shared["next_obs"].clone())
        finally:
            stepper.close()
    assert all((o == observations[0]).all() for o in observations)
    assert not mp.active_children()


@pytest.mark.parametrize("method", ["fork", "threads", ""])
def test_a_start_method_a_collector_cannot_use_is_refused_before_any_process_starts(method):
    offered = ["'forkserver'"] if FORKSERVER else []
    with raises(ValueError, "start_method", repr(method), *offered, "'spawn'", "None"):  # and what it takes
        AsyncStepper([f.cartpole] * 2, num_workers=1, start_method=method)
    assert not mp.active_children()


@pytest.mark.skipif(not (FORKSERVER and sys.platform.startswith("linux")), reason="needs a forkserver and /proc")
@pytest.mark.slow  # (16 s)
def test_the_forkserver_holds_stop_signals_back_for_collectors_processes_only():
    """The forkserver is started while stop signals are held back, so a Ctrl-C cannot reach a collector's
    process before it ignores it (a traceback from a worker's start-up). The program's own processes, forked
    from the same forkserver (one per program), get them as usual: SIGTERM still ends them. This process's mask
    is restored."""
    out = _run("""
        import multiprocessing, signal, time
        from collectors.backends.async_ import AsyncStepper
        from tests import factories as f
        if __name__ == "__main__":
            stepper = AsyncStepper([f.cartpole] * 2, num_workers=1)
            import psutil
            pid = psutil.Process(stepper.procs[0].pid).ppid()
            print("server", open(f"/proc/{pid}/status").read().split("SigBlk:")[1].split()[0], flush=True)
            ctx = multiprocessing.get_context("forkserver")
            own = ctx.Process(target=f.print_blocked_signals)
            own.start()
            own.join()
            sleeper = ctx.Process(target=time.sleep, args=(60,))
            sleeper.start()
            sleeper.terminate()
            sleeper.join(10)
            print("terminated", sleeper.exitcode, flush=True)
            print("here", sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])), flush=True)
            stepper.close()
    """)
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.stdout.splitlines() if " " in line}
    assert out.returncode == 0 and {"server", "blocked", "terminated", "here"} <= set(lines), out
    server_blocked = {s for s in range(1, 65) if int(lines["server"], 16) >> (s - 1) & 1}
    assert {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP} <= server_blocked, lines["server"]
    assert not {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP} & set(eval(lines["blocked"])), out
    assert lines["terminated"] == str(-signal.SIGTERM), out
    assert not {signal.SIGINT, signal.SIGTERM} & set(eval(lines["here"])), out


def test_a_worker_takes_the_environment_its_collector_has_when_it_starts(tmp_path, monkeypatch):
    """Forked from a forkserver started earlier, a worker would have the forkserver's environment: a variable
    set between two collectors (CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, an env's setting) must reach it."""
    first = AsyncStepper([f.cartpole] * 2, num_workers=1)  # the forkserver is up
    first.close()
    monkeypatch.setenv("PARALLEL_ROLLOUTS_TEST", "set after the forkserver started")
    log = tmp_path / "env.log"
    second = AsyncStepper([functools.partial(f.EnvironmentLogger, str(log), "PARALLEL_ROLLOUTS_TEST")] * 2,
                          num_workers=1)
    second.close()
    seen = dict(line.split(" ", 1) for line in log.read_text().splitlines())
    assert seen == {str(os.getpid()): "set after the forkserver started",
                    str(second.procs[0].pid): "set after the forkserver started"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.slow  # hung workers outlived
@pytest.mark.parametrize("method", ["spawn", *(["forkserver"] if FORKSERVER else [])])
def test_a_killed_collector_takes_its_hung_workers_and_forkserver_with_it(method):
    """SIGKILL a process whose worker hangs in a step: the worker is not reading its pipe, so only the
    parent-death signal can end it; for a forked one, through the forkserver, which exits once nothing holds
    its lifeline (each forked process closes the copy it inherits)."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from collectors.backends.async_ import _FIELDS, AsyncStepper
        from collectors.env_group import StepViews
        from tests import factories as f
        if __name__ == "__main__":
            stepper = AsyncStepper([f.hanging] * 2, num_workers=1, start_method={method!r})
            stepper.reset([1, 2], stepper.shared["next_obs"].numpy())
            views = StepViews(*(stepper.shared[k].numpy() for k in _FIELDS))
            print("stepping", flush=True)
            for _ in range(60):  # the worker's env hangs in its 40th step, and this process waits on it
                stepper.step(stepper.shared["actions"].numpy(), views)
        """)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "stepping\n", proc.communicate()
    descendants = psutil.Process(proc.pid).children(recursive=True)
    assert [p.name() for p in descendants].count("env-worker-0") == 1, descendants
    time.sleep(1.0)  # 40 steps take milliseconds
    assert proc.poll() is None, proc.communicate()
    proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # returns once every holder of its stdout is gone
        proc.communicate(timeout=30)
    _, alive = psutil.wait_procs(descendants, timeout=10)
    left = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for p in left:  # not left to hang on after a failure
        p.kill()
    assert not left, [(p.pid, p.name(), p.cmdline()) for p in left]


def test_the_default_is_the_forkserver_where_there_is_one():
    assert process_context().get_start_method() == ("forkserver" if FORKSERVER else "spawn")


@pytest.mark.slow  # a hung answer outlived
@pytest.mark.parametrize("method", ["spawn", *(["forkserver"] if FORKSERVER else [])])
def test_a_worker_whose_collector_is_gone_before_its_answer_leaves_quietly(tmp_path, method):
    """A forked worker outlives a killed collector by the moment its forkserver takes to exit: a step it was
    running then answers into a closed pipe. It leaves without a traceback (one was printed into the device
    check's report when its timeout stopped it) and with its envs closed."""
    out = _run(f"""
        import functools
        from collectors.backends.async_ import _FIELDS, AsyncStepper
        from collectors.env_group import StepViews
        from tests import factories as f
        if __name__ == "__main__":
            env = functools.partial(f.TimedEnv, {str(tmp_path / "steps.log")!r}, 0.5)
            stepper = AsyncStepper([env] * 2, num_workers=1, start_method={method!r})
            stepper.reset([1, 2], stepper.shared["next_obs"].numpy())
            views = StepViews(*(stepper.shared[k].numpy() for k in _FIELDS))
            stepper.start_group(0, stepper.shared["actions"].numpy(), views)  # the worker's step takes 0.5 s
            for conn in stepper.conns:  # as if this process were gone: nothing reads the answer
                conn.close()
            stepper.procs[0].join(timeout=30)
            print("exit code", stepper.procs[0].exitcode, flush=True)
    """)
    assert "exit code 0" in out.stdout, out
    assert "Traceback" not in out.stderr and "Error" not in out.stderr, out.stderr
    steps = (tmp_path / "steps.log").read_text().splitlines()
    assert len(steps) == 2  # the collector's own env's step and the worker's: the worker did step


def _with_preload(tmp_path: Path, module: str, source: str, script: str, **popen) -> subprocess.Popen:
    """A program whose collectors' forkserver also imports ``module`` (``source``, in ``tmp_path``), and whose
    start-up floor is 3 s (what a collector with ``worker_timeout`` below it waits for a start)."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    prelude = f"""
        import collectors.deadlines, collectors.processes
        collectors.processes.PRELOAD = (*collectors.processes.PRELOAD, {module!r})
        collectors.deadlines.START_TIMEOUT_S = 3.0
    """
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(prelude) + textwrap.dedent(script)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _no_descendants_after(proc: subprocess.Popen, descendants: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(descendants, timeout=10)
    left = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for p in left:
        p.kill()
    assert not left, [(p.pid, p.name(), p.cmdline()) for p in left]


@pytest.mark.slow  # a program started and ended
@pytest.mark.skipif(not FORKSERVER, reason="this platform has no forkserver")
def test_the_forkserver_is_gone_when_the_program_has_ended(tmp_path):
    """A program that has ended leaves no forkserver behind, closed collectors or not: it was left to end by
    itself, tearing down an interpreter that imported torch for about a second after the program (here its
    teardown takes 60 s, as an exit handler that waits would make it), and holding the program's output open
    (``train | tee log`` waited for it)."""
    pids = tmp_path / "pids"
    proc = _with_preload(tmp_path, "slow_teardown", "import atexit, time\natexit.register(time.sleep, 60)\n", f"""
        from multiprocessing import forkserver
        from pathlib import Path
        from collectors.backends.async_ import AsyncStepper
        from tests import factories as f
        if __name__ == "__main__":
            closed, left_open = (AsyncStepper([f.cartpole] * 2, num_workers=1) for _ in range(2))
            closed.close()
            Path({str(pids)!r}).write_text(f"{{forkserver._forkserver._forkserver_pid}} {{left_open.procs[0].pid}}")
    """)
    returncode = proc.wait(timeout=120)
    left = [pid for pid in map(int, pids.read_text().split())
            if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    assert returncode == 0 and not left, (left, out, err)


@pytest.mark.slow  # the start deadline waited out
@pytest.mark.skipif(not FORKSERVER, reason="this platform has no forkserver")
def test_a_forkserver_whose_imports_hang_is_killed_at_the_start_deadline_and_the_next_collector_starts():
    """The first fork waits for the forkserver's imports: an import that hangs (a dead network filesystem) is a
    one-line WorkerTimeoutError at the start-up deadline, not a wait for ever, and leaves no process behind; a
    later collector starts a new forkserver (here without the hanging import)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        proc = _with_preload(Path(tmp), "hangs_on_import", "import time\ntime.sleep(60)\n", """
            import time
            import collectors.processes
            from collectors import WorkerTimeoutError
            from collectors.backends.async_ import AsyncStepper
            from tests import factories as f
            if __name__ == "__main__":
                began = time.monotonic()
                try:
                    AsyncStepper([f.cartpole] * 2, num_workers=1, worker_timeout=1.0)
                except WorkerTimeoutError as e:
                    print(f"after {time.monotonic() - began:.1f} s: {e}", flush=True)
                collectors.processes.PRELOAD = collectors.processes.PRELOAD[:-1]
                stepper = AsyncStepper([f.cartpole] * 2, num_workers=1)
                stepper.reset([1, 2], stepper.shared["next_obs"].numpy())
                print("started", stepper.shared["next_obs"].any().item(), flush=True)
                stepper.close()
        """)
        out, err = proc.communicate(timeout=120)
    after = re.search(r"after (\S+) s: the forkserver \(pid \d+\) that starts this collector's processes "
                      r"\(importing torch first\) has not forked env-worker-0 within 3 s \(an import that hangs\?\) "
                      r"and was killed; .* start_method='spawn' \(.*start_method = \"spawn\".*--config.*\)$", out,
                      re.M)  # the collector's argument, and the trainer's TOML key
    assert proc.returncode == 0 and after and 3.0 <= float(after.group(1)) < 20, (out, err)
    assert "started True" in out, (out, err)


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
@pytest.mark.skipif(not FORKSERVER, reason="this platform has no forkserver")
def test_a_forkserver_that_dies_in_its_imports_is_one_line_with_its_exit():
    """An import that raises something other than ImportError (which multiprocessing ignores) ends the
    forkserver: multiprocessing's bare EOFError becomes a WorkerDiedError that says so, with the exit code."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        proc = _with_preload(Path(tmp), "raises_on_import", "raise RuntimeError('no licence server')\n", """
            from collectors import WorkerDiedError
            from collectors.backends.async_ import AsyncStepper
            from tests import factories as f
            if __name__ == "__main__":
                try:
                    AsyncStepper([f.cartpole] * 2, num_workers=1)
                except WorkerDiedError as e:
                    print(f"{type(e).__name__}: {e}", flush=True)
        """)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, err)
    assert re.fullmatch(r"WorkerDiedError: the forkserver \(pid \d+\) that starts this collector's processes "
                        r"\(importing torch first\) ended before it forked env-worker-0 \(exit code 1; what it "
                        r"printed is above\); start the processes with start_method='spawn' .*\n", out), (out, err)
    assert "RuntimeError: no licence server" in err, err  # the forkserver's own traceback


@pytest.mark.skipif(not FORKSERVER, reason="this platform has no forkserver")
def test_ctrl_c_while_the_forkserver_imports_stops_at_once_and_leaves_nothing():
    """Stop signals are held back while a process starts; one that arrives while the forkserver's imports hang
    ends the wait at once (not at the deadline), and the program stops as Ctrl-C stops it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        proc = _with_preload(Path(tmp), "hangs_on_import", "import time\ntime.sleep(60)\n", """
            import collectors.deadlines
            from collectors.backends.async_ import AsyncStepper
            from tests import factories as f
            if __name__ == "__main__":
                collectors.deadlines.START_TIMEOUT_S = 60.0
                print("starting", flush=True)
                AsyncStepper([f.cartpole] * 2, num_workers=1)
        """)
        assert proc.stdout.readline() == "starting\n", proc.communicate()
        deadline = time.monotonic() + 30
        while not any("forkserver" in " ".join(p.cmdline()) for p in psutil.Process(proc.pid).children()):
            assert time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)
        descendants = psutil.Process(proc.pid).children(recursive=True)
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - began
    assert proc.returncode != 0 and took < 10, (took, out, err)
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    _no_descendants_after(proc, descendants)


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_the_start_method_reaches_a_collector_and_its_collecting_process_through_make_collector():
    """``start_method`` is a collector option: a ``RolloutCollector``'s async workers, and a background collector's
    collecting process and the workers beneath it, are spawned where asked (this process's children, and the
    collecting process's), and a method a collector cannot use is refused on every backend before anything
    starts."""
    with make_collector([f.cartpole] * 2, f.RandomPolicy(2), backend="async", num_workers=1,
                        start_method="spawn", num_steps=4) as c:
        assert psutil.Process(c.stepper.procs[0].pid).ppid() == os.getpid()
        assert c.collect().batch.batch_size == (4, 2)
    with make_collector([f.cartpole] * 2, f.RandomPolicy(2), backend="async", num_workers=1, background=True,
                        start_method="spawn", num_steps=4) as c:
        collecting = psutil.Process(c._process.pid)
        assert collecting.ppid() == os.getpid() and collecting.name() == "collector"
        assert [w.name() for w in collecting.children()] == ["env-worker-0"]  # its child: spawned, not forked
        assert c.collect().batch.batch_size == (4, 2)
    for backend in ("serial", "sync"):
        with raises(ValueError, "start_method", "'fork'"):
            make_collector([f.cartpole] * 2, f.RandomPolicy(2), backend=backend, start_method="fork")
    with raises(ValueError, "backend='device'", "start_method"):
        make_collector([f.cartpole], f.RandomPolicy(2), backend="device", start_method="spawn")
    assert not mp.active_children()


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_a_run_spawns_its_workers_with_start_method_spawn_and_a_resume_may_change_it(tmp_path, capsys):
    """The command line: ``start_method = "spawn"`` (a key of the ``--config`` file) is in the layout line and the
    stored layout; how processes start changes no number, so a resume may change it (and stores the change)."""
    from trainer import train as train_cli

    run_dir = tmp_path / "run"
    train_cli.main(["--backend", "async", "--num-envs", "2", "--num-workers", "1", "--num-steps", "8",
                    "--total-steps", "16", "--device", "cpu", "--config", f.settings_file("start_spawn"),
                    "--run-dir", str(run_dir)])
    assert "1 worker process (spawned) + this process" in capsys.readouterr().err
    assert json.loads((run_dir / "config.json").read_text())["layout"]["start_method"] == "spawn"
    train_cli.main(["--resume", str(run_dir), "--total-steps", "32", "--config", f.settings_file("start_auto")])
    assert "1 worker process + this process" in capsys.readouterr().err
    state = checkpoints.latest_loadable(run_dir)[1]
    assert state["env_steps"] == 32 and state["config"]["start_method"] == "auto"
