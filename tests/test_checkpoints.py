import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import checkpoints
from checkpoints import CheckpointError, latest_loadable, load, save, save_in_run_dir
from tests.messages import names, not_names, raises


def sample_state():
    return {
        "model": {"w": torch.randn(3, 4), "b": torch.zeros(4, dtype=torch.float64)},
        "env": {"key": np.array([2**64 - 1, 7], dtype=np.uint64), "buffer": np.random.rand(2, 3),
                "fade": np.array([True, False])},
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "counters": [1, 2.5, None, "text", (3, 4)],
    }


def assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b


def test_round_trip_is_exact_and_loads_with_weights_only(tmp_path):
    state = sample_state()
    save(tmp_path / "c.pt", state)
    assert_same(state, load(tmp_path / "c.pt"))
    torch.load(tmp_path / "c.pt", weights_only=True)  # no pickled Python objects inside


@pytest.mark.parametrize("step", ["save", pytest.param("load", marks=pytest.mark.slow)])
def test_a_large_state_is_saved_and_loaded_with_at_most_two_more_copies_of_it(tmp_path, step):
    """An Ape-X checkpoint may hold a replay of many GiB: its bytes are built and read without extra copies
    (the peak was three more copies, each way). Each measured in a fresh process (``ru_maxrss`` is a peak)."""
    path, size = str(tmp_path / "big.pt"), 200 * 2**20

    def peak_rise(code: str) -> int:
        script = (f"import resource, torch, checkpoints\nstate = {{'storage': torch.ones({size // 4})}}\n"
                  "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
                  f"{code}\nprint((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[-1])  # ru_maxrss: KiB on Linux

    saved = peak_rise(f"checkpoints.save({path!r}, state)")
    # loading: the state in memory first, so that the rise is what loading needs besides its result
    extra = saved if step == "save" else peak_rise(f"checkpoints.load({path!r})")
    assert extra <= 2.2 * size, extra / size


def test_crash_during_save_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    save_in_run_dir(tmp_path, {"x": torch.ones(3)}, 1, keep=3)

    def exploding_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", exploding_save)
    with raises(OSError, "disk full"):  # the cause, passed on
        save_in_run_dir(tmp_path, {"x": torch.zeros(3)}, 2, keep=3)
    monkeypatch.undo()
    path, state, problems = latest_loadable(tmp_path)
    assert path.name == "ckpt_00000001.pt" and torch.equal(state["x"], torch.ones(3)) and not problems
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt_00000001.pt", "latest"]


def test_kill_9_during_saves_never_leaves_latest_pointing_to_a_partial_file(tmp_path):
    script = (
        "import sys, torch\n"
        "from checkpoints import save_in_run_dir\n"
        "i = 0\n"
        "while True:\n"
        "    i += 1\n"
        "    save_in_run_dir(sys.argv[1], {'big': torch.full((4_000_000,), float(i))}, i, keep=2)\n"
        "    print(i, flush=True)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            cwd=root, env={**os.environ, "PYTHONPATH": root})
    first = proc.stdout.readline()  # at least one save completed
    time.sleep(0.35)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.strip()
    path, state, problems = latest_loadable(tmp_path)
    assert not problems, problems
    assert state["big"][0] == int(path.stem.split("_")[1])


def test_retention_keeps_the_newest_k(tmp_path):
    for i in range(1, 6):
        save_in_run_dir(tmp_path, {"i": i}, i, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert names == ["ckpt_00000004.pt", "ckpt_00000005.pt"]
    assert latest_loadable(tmp_path)[1]["i"] == 5


def test_truncated_latest_falls_back_to_an_older_checkpoint_and_says_why(tmp_path):
    for i in (1, 2):
        save_in_run_dir(tmp_path, {"i": i}, i, keep=5)
    newest = tmp_path / "checkpoints" / "ckpt_00000002.pt"
    newest.write_bytes(newest.read_bytes()[:40])
    path, state, problems = latest_loadable(tmp_path)
    assert state["i"] == 1 and path.name == "ckpt_00000001.pt"
    assert len(problems) == 1
    names(problems[0], "ckpt_00000002.pt", "40 bytes")  # the file passed over, and where it ends


@pytest.mark.parametrize("damage, named", [  # what is wrong with the file, in a word or a number
    # torch's text for these is about its legacy .tar format, which says nothing of what happened to the file
    (lambda p: p.write_bytes(b"\x00" * 100), ["100 bytes", "zeros"]),
    (lambda p: p.write_bytes(b"\x00" * 10_000), ["4,096 bytes", "zeros"]),
    (lambda p: p.write_bytes(b""), ["empty"]),
    (lambda p: p.write_bytes(b"PK\x03\x04" + b"x" * 50), ["zip", "54 bytes"]),
    # cut mid-way: torch said "OSError: [Errno 22] Invalid argument"
    (lambda p: (save(p, {"w": torch.ones(10_000)}), p.write_bytes(p.read_bytes()[:30_000])), ["zip", "30,000 bytes"]),
    (lambda p: p.write_bytes(b"PK\x03\x04" + b"x" * 50 + b"PK\x05\x06" + b"\0" * 18),  # framed, broken inside
     ["RuntimeError"]),  # torch's first sentence, whatever it is
    (lambda p: p.write_text('{"config": {}}\n'), ["torch.save", "zip"]),  # not torch's advice to unpickle
    (lambda p: torch.save(ValueError("x"), p), ["weights-only"]),
    (lambda p: torch.save({"weights": torch.ones(1)}, p), ["parallel-rollouts"]),
    (lambda p: torch.save({"format_version": 99, "state": {}}, p), ["format version 99"]),
])
def test_bad_files_name_the_file_and_the_problem(tmp_path, damage, named):
    path = tmp_path / "bad.pt"
    damage(path)
    with raises(CheckpointError, path, *named):
        load(path)


def test_an_unreadable_file_names_its_runs_other_checkpoints(tmp_path):
    for i in (1, 2, 3):
        save_in_run_dir(tmp_path, {"i": i}, i, keep=5)
    newest = tmp_path / "checkpoints" / "ckpt_00000003.pt"
    newest.write_bytes(b"")
    with pytest.raises(CheckpointError) as info:
        latest_loadable(newest)  # the file asked for, not loaded in its place: named
    names(str(info.value), newest)
    names(str(info.value).splitlines()[-1], tmp_path, "2", "ckpt_00000002.pt")  # its run's others: how many, newest
    assert latest_loadable(tmp_path)[1]["i"] == 2
    for i in (1, 2):
        (tmp_path / "checkpoints" / f"ckpt_{i:08d}.pt").unlink()
    with raises(CheckpointError, newest, lines=None) as info:
        latest_loadable(newest)
    not_names(str(info.value), "ckpt_00000001.pt", "ckpt_00000002.pt")  # no other checkpoint to name


def test_missing_and_empty_locations(tmp_path):
    with raises(CheckpointError, tmp_path / "nope"):
        latest_loadable(tmp_path / "nope")
    with raises(CheckpointError, tmp_path):
        latest_loadable(tmp_path)
    with raises(ValueError, "keep", "0"):
        checkpoints.save_in_run_dir(tmp_path, {}, 1, keep=0)


def test_a_checkpoint_gets_the_permissions_of_any_new_file(tmp_path):
    """As the run's other files (``open()``'s 0666 less the umask), not ``mkstemp``'s owner-only 0600."""
    umask = os.umask(0o022)
    os.umask(umask)
    (tmp_path / "other").write_text("")
    path = checkpoints.save(tmp_path / "ckpt_00000001.pt", {"i": 1})
    assert path.stat().st_mode & 0o777 == (tmp_path / "other").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_checkpoints_content_hash_is_the_sha256_of_its_bytes_read_in_chunks(tmp_path, monkeypatch):
    """Any size (read a chunk at a time: a small chunk here, so that a small file spans several), and another
    content under the same path is another hash; what is not a regular file is refused, never waited on."""
    import hashlib

    monkeypatch.setattr(checkpoints.files, "HASH_CHUNK", 1000)
    path = checkpoints.save(tmp_path / "ckpt_00000001.pt", sample_state())
    assert path.stat().st_size > 3 * 1000
    assert checkpoints.content_hash(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    before = checkpoints.content_hash(path)
    checkpoints.save(path, {**sample_state(), "counters": [2]})  # the same path, other weights
    assert checkpoints.content_hash(path) not in ("", before)
    with pytest.raises(checkpoints.UnreadableFileError):
        checkpoints.content_hash(tmp_path)
