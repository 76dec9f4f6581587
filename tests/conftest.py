import os

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

import pytest  # noqa: E402 - after the environment above, which imports read

try:  # pytest >= 9.2: a test's id is structured (see _group)
    from _pytest.nodeid import NodeId  # noqa: E402
except ImportError:  # pytest-xdist's own suffix works
    NodeId = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep together, in one of pytest-xdist's test processes (``--dist loadgroup``), what shares state: every Ray
    test (one local Ray at a time on the machine), and a module's tests that use a run it trains once (a module- or
    session-scoped fixture, made once rather than once per process). The other tests go wherever a process is
    free."""
    for item in items:
        if item.get_closest_marker("ray"):
            _group(config, item, "ray")
        elif _uses_a_shared_fixture(item):
            _group(config, item, item.module.__name__)


def _group(config: pytest.Config, item: pytest.Item, name: str) -> None:
    """Put ``item`` in pytest-xdist's group ``name``. pytest-xdist reads the mark and appends ``@name`` to the
    test's id, which its scheduler groups by; since pytest 9.2 a test's id is no longer the ``_nodeid`` it sets, so
    every group was ignored (a module's shared run made in both processes, two local Rays at once): where that is
    so, the id is given its ``@name`` here."""
    item.add_marker(pytest.mark.xdist_group(name))
    structured = NodeId is not None and isinstance(getattr(item, "_id", None), NodeId)
    if structured and getattr(config.option, "loadgroup", False):
        item._id = NodeId.parse(f"{item.nodeid}@{name}")


def _uses_a_shared_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a module- or session-scoped fixture of these tests (pytest's own, such as
    ``tmp_path_factory``, share nothing between tests)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info else ()
    return any(d.scope in ("module", "session") and d.func.__module__.startswith("tests.")
               for group in defs for d in group)
