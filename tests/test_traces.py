"""Real-trace replay in VR-edge: parsing both formats, bad files, the split by file, single vs batched envs."""


import numpy as np
import pytest

import envs
from envs.make_traces import write_traces
from envs.settings import ConfigError
from envs.traces import TraceError, load_traces
from tests.messages import names, raises, suggestion


def windows(path, **kw):
    return load_traces(str(path), segment_s=1.0, split="all", scale=1.0, nominal_mbps=1e-9, **kw).rates


def test_pensieve_hand_computed(tmp_path):
    path = tmp_path / "p.log"
    # 2 Mbit/s for 0.5 s, 4 for 1 s, 0 for 0.5 s: windows [0, 1) = 1 + 2 = 3 Mbit, [1, 2) = 2 + 0 = 2 Mbit
    path.write_text("0 2\n0.5 4\n\n1.5 0\n2 8\n")
    np.testing.assert_allclose(windows(path), [3.0, 2.0])


def test_mahimahi_hand_computed(tmp_path):
    path = tmp_path / "m.mahi"
    # (0, 1000] ms: 4 opportunities of 1500 bytes = 0.048 Mbit; (1000, 2000]: 2 = 0.024 Mbit
    path.write_text("1\n500\n1000\n1000\n1500\n2000\n")
    np.testing.assert_allclose(windows(path), [0.048, 0.024])


@pytest.mark.parametrize("text, where, named", [  # the file's line, and what is wrong there
    ("", "", ["empty"]),
    ("\n  \n", "", ["empty"]),
    ("0 1\n2 3\n1 4\n", ":3", ["1 s", "2 s"]),  # the timestamp, and the previous one
    ("0 1\n1 -2\n2 3\n", ":2", ["-2 Mbit/s"]),
    ("0 1\n1 x\n", ":2", ["field 2"]),
    ("0 1\n1 2 3\n", ":2", ["3 fields"]),
    ("0 1 2\n", ":1", ["3 fields"]),
    ("0 1\n0.5 1\n", "", ["0.5 s", "1 s"]),  # the span, and one segment
    ("0 0\n5 0\n", "", ["nothing"]),
    ("5\n12\n10\n2000\n", ":3", ["10 ms", "12 ms"]),
    ("5\n-3\n", ":2", ["non-negative"]),
    ("5\n7.5\n", ":2", ["non-negative"]),
    ("0 1\n1 x\n", ":2", ["field 2"]),
    ("0 5\n1e9 6\n", ":2", ["1e+09 s", "4194304"]),  # would be a 7.45 GiB array
    ("0 5\n-1e308 6\n1e308 7\n", ":2", ["-1e+308 s", "0 s"]),
    ("-1e308 5\n1e308 6\n", ":2", ["inf s", "4194304"]),
    ("0 5\n1 1e308\n2 4\n", ":2", ["1e+308 Mbit/s", "1e+06 Mbit/s"]),  # would overflow to NaN capacities
    ("1600000000000\n1600000000001\n", ":1", ["1.6e+12 ms", "epoch"]),  # epoch milliseconds: would be 12 GiB
])
def test_bad_files_are_one_line_errors_naming_file_and_line(tmp_path, text, where, named):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with raises(ValueError, f"{path}{where}", *named):
        windows(path)
    with raises(ValueError, path):  # also through the env's constructor
        envs.SyntheticVREdgeEnv(capacity_trace=str(path))


def test_a_span_too_long_is_refused_before_any_array_is_sized_from_it(tmp_path):
    import tracemalloc
    path = tmp_path / "seconds_as_ms.log"
    path.write_text("".join(f"{t * 1000} 5\n" for t in range(5000)))  # 5000 s written in ms: 58 days
    tracemalloc.start()
    try:
        with raises(ValueError, f"{path}:4196", "4.195e+06 s", "seconds"):  # what Pensieve times count
            windows(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    fits = load_traces(str(path), segment_s=1000.0, split="all", scale=1.0, nominal_mbps=1.0)  # in 1000 s windows
    assert len(fits.rates) == 4999


def test_a_binary_file_is_named_with_its_line(tmp_path):
    path = tmp_path / "image.png"
    path.write_bytes(b"0 1\n1 2\n\x89PNG\r\n\x1a\n\x00\xff")
    with raises(ValueError, f"{path}:3"):
        windows(path)


@pytest.mark.parametrize("text", ["root:x:0:0:root:/root:/bin/bash\n", "secret token\n", "1 secret\n",
                                  "5\nsecret\n"])
def test_errors_never_quote_the_file(tmp_path, text):
    """A stored config may name any file (capacity_trace=/etc/passwd): what it holds stays out of the error."""
    path = tmp_path / "private"
    path.write_text(text)
    with raises(ValueError, path) as info:
        windows(path)
    said = str(info.value).replace(str(path), "")  # (the path itself may hold anything, e.g. pytest-of-root)
    assert "secret" not in said and "root" not in said


def test_bad_paths_and_arguments(tmp_path):
    """A bad set is a one-line error where the traces are first used (the config reads none: its ``traces``, an
    env), and where the trainer checks its env arguments (:func:`envs.vr_edge_profile.check_arguments`)."""
    from envs.vr_edge_profile import check_arguments

    def refused(*things, **kwargs):
        config = envs.VREdgeConfig(**kwargs)  # pure data: the files are not read here
        for first_use in (lambda: config.traces, lambda: envs.SyntheticVREdgeEnv(**kwargs),
                          lambda: check_arguments(kwargs, "serial")):
            with raises(ValueError, *things):
                first_use()

    refused("capacity_trace", tmp_path / "missing", capacity_trace=str(tmp_path / "missing"))
    refused("capacity_trace", tmp_path, capacity_trace=str(tmp_path))  # an empty folder
    (tmp_path / "a.log").write_text("0 1\n3 1\n")
    refused(tmp_path / "a.log", "trace_split='train'", "2", "trace_split='all'",  # the way out
            capacity_trace=str(tmp_path / "a.log"), trace_split="train")
    with raises(ValueError, "trace_split", "'validation'", "train", "test"):  # and what it takes
        envs.VREdgeConfig(capacity_trace=str(tmp_path), trace_split="validation")
    with raises(ValueError, "trace_split", "capacity_trace"):
        envs.VREdgeConfig(trace_split="test")


def test_a_config_reads_no_file_and_configs_of_the_same_files_share_one_set(tmp_path, monkeypatch):
    """Building a VREdgeConfig lists and opens nothing; its traces are read on first use, once per version of the
    files: every config and env that names them shares one read-only set, and a file that changed is read again."""
    import envs.traces as traces
    listed, opened = [], []
    trace_files, open_trace = traces.trace_files, traces.open_trace
    monkeypatch.setattr(traces, "trace_files", lambda *a, **k: listed.append(a) or trace_files(*a, **k))
    monkeypatch.setattr(traces, "open_trace", lambda path: opened.append(path) or open_trace(path))
    paths = write_traces(tmp_path / "set", files=3, seconds=6)
    kwargs = dict(num_users=2, capacity_trace=str(tmp_path / "set"), user_traces=str(tmp_path / "set"))
    config = envs.VREdgeConfig(**kwargs)
    envs.VREdgeConfig(capacity_trace=str(tmp_path / "missing"), user_traces=str(tmp_path / "missing"))  # data
    assert listed == [] and opened == []
    cell = config.traces
    assert len(listed) == 1 and sorted(opened) == sorted(str(p) for p in paths)  # each file once
    assert config.link_traces is not None and len(opened) == 3  # the users' set: the same files, read
    assert not cell.rates.flags.writeable and not cell.lengths.flags.writeable  # shared: never written
    one, two = envs.SyntheticVREdgeEnv(seed=1, **kwargs), envs.SyntheticVREdgeEnv(seed=2, **kwargs)
    vector = envs.VREdgeVectorEnv(2, **kwargs)
    assert one.config is not two.config and len(opened) == 3  # nothing read again
    for env in (one, two, vector):
        assert env.config.traces is cell and env.config.link_traces is config.link_traces
    paths[0].write_text("0 1\n1 2\n2 3\n3 4\n")  # changed (its size too): read again, by the next config
    changed = envs.VREdgeConfig(**kwargs).traces
    assert changed is not cell and opened[3:] == [str(paths[0])] and len(changed.rates) != len(cell.rates)
    assert config.traces is cell  # a config keeps what it read


def test_train_test_split_is_by_file_disjoint_and_stable(tmp_path):
    write_traces(tmp_path, files=10, seconds=4)
    train = envs.VREdgeConfig(capacity_trace=str(tmp_path), trace_split="train").traces.files
    test = envs.VREdgeConfig(capacity_trace=str(tmp_path), trace_split="test").traces.files
    every = envs.VREdgeConfig(capacity_trace=str(tmp_path)).traces.files
    assert len(test) == 2 and not set(train) & set(test) and sorted(train + test) == sorted(every)
    write_traces(tmp_path / "more", files=1, seconds=4, seed=5)  # a sub-directory is not a trace
    assert envs.VREdgeConfig(capacity_trace=str(tmp_path), trace_split="test").traces.files == test


def test_generator_is_deterministic_and_writes_both_formats(tmp_path):
    a = write_traces(tmp_path / "a", files=2, seconds=5, seed=3)
    b = write_traces(tmp_path / "b", files=2, seconds=5, seed=3)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert {p.suffix for p in a} == {".log", ".mahi"}
    for p in a:
        rates = windows(p)
        assert len(rates) == 5 and np.all(rates > 0)


def test_an_episode_replays_its_file_from_a_seeded_offset(tmp_path):
    path = tmp_path / "t.log"
    values = [10.0, 20.0, 30.0, 40.0, 50.0]
    path.write_text("".join(f"{t} {v}\n" for t, v in enumerate(values)) + "5 0\n")
    starts = set()
    for seed in range(8):
        env = envs.SyntheticVREdgeEnv(num_users=2, seed=seed, capacity_trace=str(path), trace_scale=2.0)
        env.reset()
        start = int(env.get_state()["trace_pos"][0])
        starts.add(start)
        for t in range(12):  # wraps around the 5 windows
            *_, info = env.step(np.zeros(2, dtype=np.int64))
            assert info["capacity_mbps"] == 2.0 * values[(start + 1 + t) % 5]
    assert len(starts) > 1


def test_default_scale_maps_each_file_to_the_nominal_capacity(tmp_path):
    write_traces(tmp_path, files=2, seconds=10)
    traces = envs.VREdgeConfig(num_users=4, capacity_trace=str(tmp_path)).traces
    for offset, length in zip(traces.offsets, traces.lengths):
        assert traces.rates[offset:offset + length].mean() == pytest.approx(400.0)


def test_single_and_batched_envs_agree_exactly_with_traces(tmp_path):
    write_traces(tmp_path, files=4, seconds=30)
    n, seeds = 5, [21, 22, 23, 24, 25]
    kwargs = dict(num_users=3, max_steps=40, capacity_trace=str(tmp_path), trace_split="train")
    venv = envs.VREdgeVectorEnv(n, **kwargs)
    singles = [envs.SyntheticVREdgeEnv(**kwargs) for _ in range(n)]
    vobs, _ = venv.reset(seed=seeds)
    sobs = np.stack([e.reset(seed=s)[0] for e, s in zip(singles, seeds)])
    np.testing.assert_array_equal(vobs, sobs)
    gen = np.random.default_rng(0)
    ended = 0
    for _ in range(200):
        actions = gen.integers(0, 6, size=(n, 3))
        vobs, vrew, vterm, vtrunc, vinfo = venv.step(actions)
        for i, env in enumerate(singles):
            obs, rew, term, trunc, info = env.step(actions[i])
            got = (rew, term, trunc, info["capacity_mbps"])
            assert got == (vrew[i], vterm[i], vtrunc[i], vinfo["capacity_mbps"][i])
            if term or trunc:
                ended += 1
                obs, _ = env.reset()
            np.testing.assert_array_equal(vobs[i], obs)
    assert ended >= n


def test_state_round_trip_with_traces(tmp_path):
    write_traces(tmp_path, files=2, seconds=20)
    env = envs.SyntheticVREdgeEnv(num_users=2, seed=1, capacity_trace=str(tmp_path))
    env.reset()
    for _ in range(7):
        env.step(np.ones(2, dtype=np.int64))
    state = env.get_state()
    assert {"trace", "trace_pos"} <= set(state)
    first = [env.step(np.full(2, 3))[:2] for _ in range(30)]
    other = envs.SyntheticVREdgeEnv(num_users=2, seed=9, capacity_trace=str(tmp_path))
    other.reset()
    other.set_state(state)
    second = [other.step(np.full(2, 3))[:2] for _ in range(30)]
    for (o1, r1), (o2, r2) in zip(first, second):
        np.testing.assert_array_equal(o1, o2)
        assert r1 == r2
    with raises(ValueError, "'trace_pos'"):  # a synthetic env's state lacks the trace position: the key named
        envs.SyntheticVREdgeEnv(num_users=2, seed=0).set_state(state)


def test_training_on_the_train_files_and_evaluating_on_the_held_out_ones(tmp_path, capsys):
    """--env-kwargs reaches every env the run builds; evaluate switches a trace directory to its test files."""
    import json

    from trainer import evaluate as evaluate_cli
    from trainer import train as train_module
    from trainer.flags import parse_args
    traces = tmp_path / "traces"
    write_traces(traces, files=6, seconds=60, mean_mbps=4.0, seed=1)
    run_dir = tmp_path / "run"
    cli = parse_args(["--env-kwargs", f"capacity_trace={traces},trace_split=train,num_users=3", "--num-envs", "4",
                      "--num-steps", "16", "--total-steps", "128", "--run-dir", str(run_dir), "--device", "cpu"])
    train_module.train(cli.config, progress=False)
    layout = json.loads((run_dir / "config.json").read_text())["layout"]
    assert layout["env_kwargs"] == {"capacity_trace": str(traces), "trace_split": "train", "num_users": 3}
    evaluate_cli.main(["--checkpoint", str(run_dir), "--episodes", "2", "--baselines", "fair_share",
                       "--reference", "none"])
    payload = json.loads((run_dir / "evaluation.json").read_text())
    assert payload["env_kwargs"] == {"capacity_trace": str(traces), "trace_split": "test", "num_users": 3}
    # the report says what it played on: the run's traces, though no --capacity-trace was given
    names(capsys.readouterr().out, traces, "own", "test")  # the run's own traces, their test split
    one = sorted(traces.iterdir())[0]  # a file for a run trained on a directory's train split: all of the file
    evaluate_cli.main(["--checkpoint", str(run_dir), "--episodes", "2", "--baselines", "fair_share",
                       "--reference", "none", "--capacity-trace", str(one)])
    payload = json.loads((run_dir / "evaluation.json").read_text())
    assert payload["env_kwargs"] == {"capacity_trace": str(one), "trace_split": "all", "num_users": 3}
    for asked, played in (([], "all"), (["--trace-split", "test"], "test")):  # a folder given: whole, unless asked
        evaluate_cli.main(["--checkpoint", str(run_dir), "--episodes", "2", "--baselines", "fair_share",
                           "--reference", "none", "--capacity-trace", str(traces), *asked])
        assert json.loads((run_dir / "evaluation.json").read_text())["env_kwargs"]["trace_split"] == played


@pytest.mark.parametrize("text, named, suggested", [
    ("num_users", ["'num_users'", "num_users=6"], None),  # and an example
    ("a=1,a=2", ["a"], None),  # the key given twice
    ("9x=1", ["'9x=1'"], None),
    ("reveal_hiden_state=true", ["reveal_hiden_state", "num_users"], "reveal_hidden_state"),  # and its arguments
    ("segment_s=abc", ["segment_s", "'abc'"], None),
    ("num_users=2.5", ["num_users", "an integer", "2.5"], None),  # the kind it takes, the value given
    ("reveal_hidden_state=1", ["reveal_hidden_state", "true or false", "1"], None),
    ("trace_split=3", ["trace_split", "text", "3"], None),
    ("capacity_trace=/no/such/trace", ["capacity_trace", "/no/such/trace"], None),
    ("bitrates_mbps=[5,10", ["bitrates_mbps=[5,10", "bitrates_mbps=[5,10,20]"], None),  # and a list as it is written
    ("bitrates_mbps=[[5]]", ["bitrates_mbps=[[5]]"], None),
    ("bitrates_mbps=[5,,10]", ["bitrates_mbps=[5,,10]"], None),
    ("bitrates_mbps=[10,5]", ["bitrates_mbps", "increasing", "[10, 5]"], None),
    ("bitrates_mbps=5", ["bitrates_mbps", "a list of numbers", "5"], None),
    ("bitrates_mbps=[8,a]", ["bitrates_mbps", "a list of numbers", "[8, 'a']"], None),  # the item that is not one
    ("num_users=[4]", ["num_users", "an integer", "[4]"], None),
    ("regime_multipliers=[1,2]", ["regime_multipliers", "3 numbers", "[1, 2]"], None),  # how many it takes
])
def test_bad_env_kwargs_are_one_line_errors(text, named, suggested):
    from trainer.config import TrainConfig
    with raises(ValueError, "--env-kwargs", *named, key="env_kwargs") as info:
        TrainConfig(env_kwargs=text).validate()
    assert suggestion(str(info.value)) == suggested


# ---------------------------------------------------------------------------- trace sets: shipped, split, named

def test_the_shipped_pensieve_set_is_named_and_keeps_train_and_test_apart():
    from envs.traces import TRACE_SETS_DIR
    train = envs.VREdgeConfig(capacity_trace="pensieve", trace_split="train").traces.files
    test = envs.VREdgeConfig(capacity_trace="pensieve", trace_split="test").traces.files
    both = envs.VREdgeConfig(capacity_trace="pensieve", trace_split="all").traces.files
    assert (len(train), len(test)) == (127, 142)  # the set's own folders, every file of each
    assert all("/train/" in f for f in train) and all("/test/" in f for f in test)
    assert sorted(both) == sorted(train + test)
    assert envs.VREdgeConfig(capacity_trace="pensieve").traces.files == train  # auto: a split set's train folder
    for name in ("LICENSE", "SOURCE.md"):  # beside the files, never read as a trace
        assert (TRACE_SETS_DIR / "pensieve" / name).is_file()


def test_a_users_own_train_and_test_folders_work_as_the_shipped_set(tmp_path):
    write_traces(tmp_path / "train", files=5, seconds=10, seed=1)
    write_traces(tmp_path / "test", files=3, seconds=10, seed=2)
    (tmp_path / "README.md").write_text("not a trace\n")  # beside the folders: not read
    for split, count in (("train", 5), ("auto", 5), ("test", 3), ("all", 8)):
        files = envs.VREdgeConfig(capacity_trace=str(tmp_path), trace_split=split).traces.files
        assert len(files) == count  # no file of a folder dropped by the hash split
    flat = tmp_path / "train"  # one flat folder: auto plays every file, bit for bit as "all" did
    assert envs.VREdgeConfig(capacity_trace=str(flat)).traces.files == \
        envs.VREdgeConfig(capacity_trace=str(flat), trace_split="all").traces.files
    assert len(envs.VREdgeConfig(capacity_trace=str(flat), trace_split="test").traces.files) == 1  # the hash split


def test_a_flat_folder_replays_as_before_under_the_auto_split(tmp_path):
    write_traces(tmp_path, files=3, seconds=30)
    runs = []
    for split in ("auto", "all"):
        env = envs.SyntheticVREdgeEnv(num_users=2, seed=4, capacity_trace=str(tmp_path), trace_split=split)
        env.reset()
        runs.append([env.step(np.ones(2, dtype=np.int64))[1] for _ in range(50)])
    assert runs[0] == runs[1]


def test_evaluation_plays_a_given_folder_whole_and_a_split_set_on_its_test_folder(tmp_path):
    from envs.vr_edge_profile import held_out_arguments as held_out_env_kwargs  # (VR-edge's profile: its rule)
    write_traces(tmp_path / "flat", files=5, seconds=10)
    flat = str(tmp_path / "flat")
    trained = {"capacity_trace": flat, "trace_split": "train"}
    assert held_out_env_kwargs(trained, "")["trace_split"] == "test"  # the run's own folder: as runs always were
    assert held_out_env_kwargs(trained, flat)["trace_split"] == "all"  # a folder given: every file of it
    assert held_out_env_kwargs(trained, flat, "test")["trace_split"] == "test"  # unless a split is asked for
    assert held_out_env_kwargs(trained, "pensieve")["trace_split"] == "test"
    assert held_out_env_kwargs({"capacity_trace": "pensieve", "trace_split": "train"}, "")["trace_split"] == "test"
    # users on a split set: its train files are never played in evaluation, whatever the cell replays
    assert held_out_env_kwargs({"user_traces": "pensieve", "trace_split": "train"}, flat)["trace_split"] == "test"


def test_a_shipped_sets_name_is_stored_as_a_name_and_paths_absolute(tmp_path, monkeypatch):
    from trainer.config import TrainConfig
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(env_kwargs="capacity_trace=pensieve,user_traces=traces/,trace_split=train")
    assert cfg.with_absolute_paths().env_options == {"capacity_trace": "pensieve",
                                                     "user_traces": str(tmp_path / "traces"), "trace_split": "train"}


def test_loading_the_shipped_set_is_quick_enough_to_do_per_env():
    """The 269 shipped files: what a run loads in each worker (measured in the report, not asserted)."""
    from envs.traces import load_traces
    every = load_traces("pensieve", segment_s=1.0, split="all", scale=None, nominal_mbps=800.0)
    assert len(every.files) == 269 and np.all(every.rates > 0)


# ---------------------------------------------------------------------------- hostile files: one line, no hang

def test_a_fifo_is_refused_without_blocking(tmp_path):
    import os
    import threading
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    outcome = []

    def load(path):
        try:
            windows(path)
        except ValueError as e:
            outcome.append(str(e))

    for path in (fifo, tmp_path):  # the FIFO named, and one in a folder of traces
        worker = threading.Thread(target=load, args=(path,), daemon=True)  # a hang would leave it blocked in open()
        worker.start()
        worker.join(timeout=20)
        assert not worker.is_alive(), "opening a FIFO blocked"
    assert len(outcome) == 2
    for said in outcome:
        names(said, fifo, "FIFO")  # "not a regular file", not "no such file"
        assert "\n" not in said


def test_a_file_larger_than_any_trace_is_refused_before_it_is_read(tmp_path):
    import tracemalloc

    from envs.traces import MAX_FILE_BYTES
    huge = tmp_path / "huge.log"
    with open(huge, "wb") as f:
        f.truncate(1 << 30)  # 1 GiB, sparse: read whole it would be 1 GiB of memory
    tracemalloc.start()
    try:
        with raises(ValueError, huge, "1024 MiB", f"{MAX_FILE_BYTES >> 20} MiB"):
            windows(huge)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    just = tmp_path / "just.log"  # a file of the most bytes is read: two lines and blank ones of 32 KiB
    blank = b" " * ((32 << 10) - 1) + b"\n"
    head = b"0 1\n1 2\n"
    just.write_bytes(head + blank * ((MAX_FILE_BYTES - len(head)) // len(blank)) + b"\n" * (
        (MAX_FILE_BYTES - len(head)) % len(blank)))
    assert just.stat().st_size == MAX_FILE_BYTES and windows(just).tolist() == [1.0]


def test_an_endless_line_is_refused_after_its_first_64_kib(tmp_path):
    import tracemalloc

    from envs.traces import MAX_LINE_BYTES
    path = tmp_path / "zeros.log"
    with open(path, "wb") as f:
        f.truncate(48 << 20)  # 48 MiB of NUL bytes (valid UTF-8), no newline
    tracemalloc.start()
    try:
        with raises(ValueError, f"{path}:1", f"{MAX_LINE_BYTES >> 10} KiB"):
            windows(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize("text, where", [("0 1\n1 nan\n2 3\n", 2), ("0 1\n1 1e400\n", 2), ("0 1\ninf 1\n", 2),
                                         ("0 1\n1 -0.5\n2 1\n", 2), ("5\nnan\n", 2), ("0 NaN\n", 1)])
def test_numbers_that_are_not_finite_or_negative_name_their_line(tmp_path, text, where):
    path = tmp_path / "t.log"
    path.write_text(text)
    with raises(ValueError, f"{path}:{where}"):
        windows(path)


def test_a_folder_of_ten_thousand_empty_files_is_one_line(tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(10_000):
        (folder / f"e{i:05d}.log").touch()
    with raises(ValueError, folder / "e00000.log", "empty"):
        envs.VREdgeConfig(capacity_trace=str(folder)).read_traces()


# ---------------------------------------------------------------------------- more formats: HSDPA/4G logs, CSV

def test_hsdpa_log_hand_computed(tmp_path):
    path = tmp_path / "report.log"
    # <unix s> <ms> <lat> <lon> <bytes since last> <ms since last>: 1 Mbit/s over (999, 1000], 2 over
    # (1000, 1001], 2 over (1001, 1002.5]; 1 s windows from 999 s
    path.write_text("1000 0 59.9 10.7 125000 1000\n1001 0 59.9 10.7 250000 1000\n1002 500 59.9 10.7 375000 1500\n")
    np.testing.assert_allclose(windows(path), [1.0, 2.0, 2.0])


@pytest.mark.parametrize("text, where, named", [
    ("1000 0 1 1 100 1000\n1000 0 1 1 100 1000\n", ":2", ["1000.000 s"]),  # the time does not increase
    ("1000 0 1 1 -100 1000\n", ":1", ["field 5"]),
    ("1000 0 1 1 100 0\n", ":1", ["field 6"]),
    ("1000 1500 1 1 100 1000\n", ":1", ["field 2"]),
    ("1000 0 1 1 100 1000\n1001 0 1 1 nan 1000\n", ":2", ["field 5"]),
    ("1000 0 1 1 1e18 1\n", ":1", ["Mbit/s"]),
])
def test_bad_hsdpa_logs_name_file_and_line(tmp_path, text, where, named):
    path = tmp_path / "bad.log"
    path.write_text(text)
    with raises(ValueError, f"{path}{where}", *named):
        windows(path)


def csv_windows(path, column, key=""):
    traces = load_traces(str(path), segment_s=1.0, split="all", scale=1.0, nominal_mbps=1e-9, column=column,
                         key=key)
    return {name: traces.rates[o:o + n].tolist() for name, o, n in zip(traces.files, traces.offsets, traces.lengths)}


def test_a_csv_is_split_into_one_trace_per_key(tmp_path):
    path = tmp_path / "campaign.csv"
    path.write_text('run,area,seq,"Throughput"\n1,a,0,10\n1,a,1,20\n2,a,0,5\n\n2,a,1,7\n1,a,2,30\n1,b,0,4\n1,b,1,4\n')
    assert csv_windows(path, "Throughput") == {str(path): [10.0, 20.0, 5.0, 7.0, 30.0, 4.0, 4.0]}  # rows 1 s apart
    assert csv_windows(path, "Throughput", "run,area") == {
        f"{path}[run=1,area=a]": [10.0, 20.0, 30.0], f"{path}[run=2,area=a]": [5.0, 7.0],
        f"{path}[run=1,area=b]": [4.0, 4.0]}
    cfg = envs.VREdgeConfig(capacity_trace=str(path), trace_column="Throughput", trace_key="run")
    assert len(cfg.traces.files) == 2


@pytest.mark.parametrize("text, column, key, where, named", [
    ("run,mbps\n1,5\n", "Mbps", "", ":1", ["'Mbps'"]),  # the column asked for, not the header's content
    ("run,mbps\n1,5\n", "mbps", "round", ":1", ["'round'"]),
    ("run,mbps\n1,5\n1,x\n", "mbps", "", ":3", ["field 2"]),
    ("run,mbps\n1,5\n1,-1\n", "mbps", "", ":3", ["-1 Mbit/s"]),
    ("run,mbps\n1,5\n1,nan\n", "mbps", "", ":3", ["finite"]),
    ("run,mbps\n1,5\n1,5,6\n", "mbps", "", ":3", ["3 fields"]),
    ("run,mbps\n", "mbps", "", "", ["no rows"]),
])
def test_bad_csvs_name_file_and_line(tmp_path, text, column, key, where, named):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with raises(ValueError, f"{path}{where}", *named):
        csv_windows(path, column, key)


def test_the_csv_settings_need_a_trace_and_each_other(tmp_path):
    with raises(ValueError, "trace_column", "capacity_trace"):
        envs.VREdgeConfig(trace_column="mbps")
    (tmp_path / "t.csv").write_text("run,mbps\n1,5\n1,6\n")
    with raises(ValueError, "trace_key", "trace_column"):
        envs.VREdgeConfig(capacity_trace=str(tmp_path / "t.csv"), trace_key="run")
    with raises(ValueError, "trace_key", "capacity_trace"):
        envs.VREdgeConfig(trace_key="run")


def _heavy_tailed(folder, files: int = 2, seconds: int = 60, seed: int = 0, outages: float = 1 / 6,
                  bursts: tuple[float, float, float] = (0.1, 6.0, 20.0)):
    """Pensieve files of heavy-tailed throughput: mostly 1 Mbit/s, outages of 0.02 in a fraction ``outages`` of the
    seconds, bursts (a fraction, and their range of Mbit/s): the mean well above the median, as in recorded 5G logs
    (issue 64)."""
    folder.mkdir(exist_ok=True)
    gen = np.random.default_rng(seed)
    share, low, high = bursts
    for i in range(files):
        u = gen.random(seconds)
        rates = np.where(u < outages, 0.02, np.where(u > 1 - share, gen.uniform(low, high, seconds), 1.0))
        (folder / f"h{i}.log").write_text("".join(f"{t} {r}\n" for t, r in enumerate(rates)) + f"{seconds} 0\n")
    return str(folder)


@pytest.mark.parametrize("quantile", [0.5, 0.3, 0.9])
def test_trace_quantile_puts_that_quantile_of_each_file_at_the_nominal_capacity(tmp_path, quantile):
    folder = _heavy_tailed(tmp_path / "h")
    by_mean = envs.VREdgeConfig(num_users=4, capacity_trace=folder).traces
    by_quantile = envs.VREdgeConfig(num_users=4, capacity_trace=folder, trace_quantile=quantile).traces
    assert by_quantile.files == by_mean.files
    for offset, length in zip(by_quantile.offsets, by_quantile.lengths):
        window = slice(offset, offset + length)
        assert np.quantile(by_quantile.rates[window], quantile) == pytest.approx(400.0)  # 4 users x 100 Mbit/s
        assert np.quantile(by_mean.rates[window], quantile) != pytest.approx(400.0)  # which is another scale


def test_a_heavy_tailed_set_scaled_by_its_mean_starves_the_cell_and_by_its_median_does_not(tmp_path):
    """The reason for trace_quantile: the same recorded network, the same baseline, the same episodes. Bursts of 150
    to 250 Mbit/s in a sixth of the seconds lift the mean to 30 times the typical 1 Mbit/s: scaled by its mean, the
    4-user cell typically has 3 Mbit/s a user, below the ladder's 5."""
    folder = _heavy_tailed(tmp_path / "h", files=3, seconds=120, seed=1, outages=0.0, bursts=(1 / 6, 150, 250))
    lost = {}
    for quantile in (0.0, 0.5):
        kwargs = dict(num_users=4, max_steps=40, capacity_trace=folder, trace_quantile=quantile)
        env, act = envs.VREdgeVectorEnv(8, **kwargs), envs.make_baseline("fair_share", envs.VREdgeConfig(**kwargs))
        obs, _ = env.reset(seed=list(range(8)))
        ended = np.zeros(8, dtype=bool)  # each env's first episode: ended by a user abandoning, or by its length
        abandoned = np.zeros(8, dtype=bool)
        while not ended.all():
            obs, _, terminated, truncated, _ = env.step(act(obs))
            abandoned |= terminated & ~ended
            ended |= terminated | truncated
        lost[quantile] = abandoned.mean()
    assert lost[0.0] > 0.5 > lost[0.5], lost  # (the cell's verdict: trainer.evaluation.servable)


def test_trace_quantile_without_a_scaled_trace_or_at_an_outage_is_one_line(tmp_path):
    with raises(ConfigError, "trace_quantile", "capacity_trace", "trace_scale 0", lines=1):
        envs.VREdgeConfig(trace_quantile=0.5)
    with raises(ConfigError, "trace_quantile", "trace_scale 0", lines=1):
        envs.VREdgeConfig(capacity_trace="pensieve", trace_scale=2.0, trace_quantile=0.5)
    with raises(ConfigError, "trace_quantile", ">= 0 and <= 1", lines=1):
        envs.VREdgeConfig(capacity_trace="pensieve", trace_quantile=1.5)
    folder = _heavy_tailed(tmp_path / "h", files=1)
    outage = tmp_path / "outage.log"  # 0 Mbit/s in 3 of its 4 seconds: its median is an outage
    outage.write_text("0 0\n1 0\n2 0\n3 5\n4 0\n")
    with raises(TraceError, str(outage), "0.5 quantile", "0 Mbit/s", "higher trace_quantile", lines=1):
        envs.VREdgeConfig(capacity_trace=str(outage), trace_quantile=0.5).read_traces()
    assert envs.VREdgeConfig(capacity_trace=folder, trace_quantile=0.5).read_traces().traces is not None
