import os
from collections.abc import Iterator

# deterministic cuBLAS for the CUDA resume tests (as benchmarks.device_check sets it); read when CUDA starts
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# Ray: keep every node on loopback (this machine's tests never use another address). Read when ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# each pytest-xdist test process compiles into an inductor cache of its own, which the commands it starts inherit:
# the one time two test processes shared a cold cache (CI, 2026-12-03), every compiled policy after the first
# failed to build in both, while one process had never failed; running three compiling trainings at once on one
# cold cache, 4 times, did not fail here, so the cause is unproven and the cache is simply not shared
if os.environ.get("PYTEST_XDIST_WORKER") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{os.getuid()}_{os.environ['PYTEST_XDIST_WORKER']}")


def _cores_of_this_test_process() -> set[int] | None:
    """Pin this pytest-xdist test process to its own share of the machine's cores (gw0 the first share, gw1 the
    next, ...), and return the whole affinity mask it had (``None`` where nothing was pinned).

    Why: with two test processes on two cores, each one's torch (and each training command it starts) otherwise
    runs as many OpenMP threads as the machine has cores, and threads that spin-wait for each other across
    processes made in-process training tests 1.6-1.8x slower (tests/test_set_policy.py, test_learner.py,
    test_targets.py, AMD EPYC 2 cores, a loaded machine). Pinned, each process and its commands see the cores a
    SLURM job of that size would (``usable_cores()`` reads the mask), and the threads they choose fit them. More
    processes than cores: nothing is pinned. Before torch loads: OpenMP sizes its pool from the mask once."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // count
    if share < 1:
        return None
    index = int(worker.removeprefix("gw")) % count
    os.sched_setaffinity(0, cpus[index * share:(index + 1) * share])
    return set(cpus)


MACHINE_CPUS = _cores_of_this_test_process()

import pytest  # noqa: E402 - after the environment above, which imports read


@pytest.fixture
def whole_machine() -> Iterator[None]:
    """This test process's whole CPU affinity mask back for the test (pytest-xdist's processes each hold a share of
    the cores: above), for a test of what the trainer plans over all of a machine's cores; the share after it."""
    if MACHINE_CPUS is None:
        yield
        return
    share = os.sched_getaffinity(0)
    os.sched_setaffinity(0, MACHINE_CPUS)
    try:
        yield
    finally:
        os.sched_setaffinity(0, share)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep together, in one of pytest-xdist's test processes (``--dist loadgroup``), what shares state: every Ray
    test (one local Ray at a time on the machine), and a module's tests that use a run it trains once (a module- or
    session-scoped fixture, made once rather than once per process). The other tests go wherever a process is
    free."""
    for item in items:
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif _uses_a_shared_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def _uses_a_shared_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a module- or session-scoped fixture of these tests (pytest's own, such as
    ``tmp_path_factory``, share nothing between tests)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info else ()
    return any(d.scope in ("module", "session") and d.func.__module__.startswith("tests.")
               for group in defs for d in group)
