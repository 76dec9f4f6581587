"""``--compile``: the acting step compiled (policy and torch env), when it is chosen, and the GPU defaults."""

import dataclasses
import functools

import pytest
import torch
from torch._dynamo.utils import counters

import checkpoints
import envs
import trainer.run_layout as run_layout_module
from collectors import make_collector
from tests.messages import names, raises, suggestion, usage_error
from trainer.common import noise
from trainer.config import TrainConfig, new_run_config
from trainer.flags import parse_args
from trainer.ppo.algorithm import PPO
from trainer.run_layout import Machine, run_layout


def test_compiled_noise_has_the_eager_bits():
    """Integer hashing is exact on every CPU: the compiled bits must be the eager bits (inductor once folded
    ``arange * G2`` into index arithmetic, which Triton runs in int32, and failed to build the policy on CUDA)."""
    keys, steps = torch.arange(64, dtype=torch.int64) * 7919, torch.arange(64, dtype=torch.int64) + 3

    def bits(k, s):
        return noise.hash_bits(k, s, (64, 8, 6))

    assert torch.equal(torch.compile(bits, fullgraph=True, dynamic=False)(keys, steps), bits(keys, steps))


def _device_collector(compiled: bool, policy: torch.nn.Module):
    return make_collector([functools.partial(envs.VREdgeTorchEnv, 16, compile=compiled)], policy, backend="device",
                          num_steps=24, seed=3, compile_policy=compiled)


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_compiled_acting_step_follows_the_eager_one_without_recompiling():
    cfg = TrainConfig(num_envs=16, device="cpu")
    eager_policy, compiled_policy = PPO.make_model(cfg), PPO.make_model(cfg)
    with _device_collector(False, eager_policy) as eager, _device_collector(True, compiled_policy) as compiled:
        e, c = eager.collect(), compiled.collect()
        graphs = counters["stats"]["unique_graphs"]
        # the same sampling noise up to float rounding (inductor's log may differ in the last bit), so the
        # actions agree except where two choices are within rounding of each other
        _assert_same_acting(e.batch, c.batch)
        assert torch.allclose(e.batch["observations"][0], c.batch["observations"][0])
        new_weights = PPO.make_model(TrainConfig(num_envs=16, device="cpu", seed=9)).state_dict()
        compiled.update_policy(new_weights)  # loaded in place: the compiled code acts with the new weights
        eager.update_policy(new_weights)
        for _ in range(2):
            e, c = eager.collect(), compiled.collect()
        _assert_same_acting(e.batch, c.batch)
        # a new policy object is compiled for (it is the one that acts), reusing the graph: same class, same shapes
        new_policy = PPO.make_model(TrainConfig(num_envs=16, device="cpu", seed=5))
        compiled.update_policy(new_policy)
        eager.update_policy(PPO.make_model(TrainConfig(num_envs=16, device="cpu", seed=5)))
        _assert_same_acting(eager.collect().batch, compiled.collect().batch)
        assert counters["stats"]["unique_graphs"] == graphs  # no recompilation across rollouts and weights


def _assert_same_acting(eager, compiled) -> None:
    same = (eager["actions"] == compiled["actions"]).all(-1)
    assert same.float().mean().item() > 0.99
    assert torch.allclose(eager["log_probs"][same], compiled["log_probs"][same], atol=1e-4)
    assert torch.allclose(eager["values"][same], compiled["values"][same], atol=1e-4)


@pytest.mark.slow  # compiling the device collector
def test_compiled_device_collector_resumes_exactly():
    cfg = TrainConfig(num_envs=16, device="cpu")
    with _device_collector(True, PPO.make_model(cfg)) as whole:
        whole.collect()
        state = whole.get_state()
        expected = whole.collect()
    with _device_collector(True, PPO.make_model(cfg)) as resumed:
        assert resumed.set_state(state)
        got = resumed.collect()
    for key in ("observations", "actions", "rewards", "log_probs", "values", "terminated", "truncated"):
        assert torch.equal(got.batch[key], expected.batch[key]), key


def test_a_bad_compile_option_is_a_clear_error():
    with raises(ValueError, "compile_policy", "'fast'", "False", "True"):  # and what it takes
        _device_collector("fast", PPO.make_model(TrainConfig(num_envs=16)))


# ---------------------------------------------------------------------------- when the run layout compiles

@pytest.mark.parametrize("algo, backend, compile, total_steps, compiled", [
    ("ppo", "device", "auto", 8192, True),  # the device backend: always (eagerly it is slower than sync)
    ("ppo", "sync", "auto", 245 * 8192, True),  # long enough for the measured gain to pay for compiling
    ("ppo", "sync", "auto", 2_000_000, True),  # as typed: the run makes 244 iterations of 8,192 (1,998,848 steps)
    ("ppo", "sync", "auto", 1_999_999, False),
    ("ppo", "async", "auto", 100_000, False),
    ("apex", "sync", "auto", 3_000_000, False),  # not measured: auto leaves it eager
    ("apex", "sync", "on", 100_000, True),
    ("ppo", "sync", "on", 8192, True), ("ppo", "async", "on", 8192, True), ("ppo", "device", "off", 10**7, False),
])
def test_the_layout_decides_what_is_compiled(algo, backend, compile, total_steps, compiled):
    cfg = new_run_config({"algo": algo, "backend": backend, "compile": compile, "total_steps": total_steps,
                          "device": "cpu"})
    layout = run_layout(cfg, Machine(cores=4))
    assert layout.compile is compiled and layout.collector_kwargs()["compile_policy"] is compiled
    assert ("acting step compiled (--compile)" in layout.describe()) is compiled
    assert not layout.warnings


@pytest.mark.parametrize("stored, before, after, given, kept, said", [
    ("auto", 3_000_000, 600_000, {}, "on", "the run compiled so far, and goes on so (--compile on;"),  # shorter
    ("auto", 1_000_000, 4_000_000, {}, "off", "the run ran eagerly so far, and goes on so (--compile off;"),
    ("auto", 3_000_000, 2_500_000, {}, "auto", ""),  # both compile: nothing to keep
    ("auto", 3_000_000, 600_000, {"compile": "auto"}, "auto", "the run compiled so far, and runs eagerly for "
                                                              "--total-steps 600,000 from here on (compiled kernels"),
    ("on", 600_000, 600_000, {"compile": "auto"}, "auto", "the run compiled so far, and runs eagerly"),  # kept on
    ("off", 4_000_000, 4_000_000, {"compile": "auto"}, "auto", "the run ran eagerly so far, and compiles"),
])
def test_a_resume_keeps_the_compile_decision_of_the_run(stored, before, after, given, kept, said):
    from trainer.run_layout import compile_kept_on_resume
    cfg = new_run_config({"total_steps": after, "device": "cpu", **given})
    resumed, note = compile_kept_on_resume(cfg, {"compile": stored, "total_steps": before}, given)
    assert resumed.compile == kept and (said in note if said else note == ""), note
    if kept != "auto":  # the resumed layout compiles as the run's own did
        assert run_layout(resumed, Machine(cores=4)).compile is \
            run_layout(dataclasses.replace(cfg, total_steps=before), Machine(cores=4)).compile


def test_a_resume_of_another_length_goes_on_as_the_run_was_compiled_and_says_so(tmp_path, capsys, monkeypatch):
    """Through ``train``: the kept decision reaches the layout and the resumed run's stored config (a run eager
    for its length, as compiling takes seconds here, resumed for longer)."""
    from trainer import train as train_module
    from trainer.ppo.spec import PPOSpec
    monkeypatch.setattr(PPOSpec, "compile_pays_after", 6 * 8 * 16)
    argv = ["--env", "CartPole-v1", "--num-envs", "8", "--num-steps", "16", "--device", "cpu"]
    cli = parse_args(argv + ["--total-steps", str(4 * 8 * 16), "--run-dir", str(tmp_path)])
    train_module.train(cli.config, progress=False, given=cli.given)
    cli = parse_args(["--resume", str(tmp_path), "--total-steps", str(8 * 8 * 16)])
    capsys.readouterr()
    train_module.train(cli.config, progress=False, resume=cli.resume, given=cli.given)
    err = capsys.readouterr().err
    names(err, "--compile auto", "--compile off")  # the decision kept, as the flag that says it
    assert "compiled" not in err.split("layout:")[1].splitlines()[0]
    assert checkpoints.latest_loadable(tmp_path)[1]["config"]["compile"] == "off"


def test_ray_acts_eagerly_and_says_so():
    layout = run_layout(TrainConfig(backend="ray", compile="on", device="cpu"), Machine(cores=4, ray_cpus=4))
    assert not layout.compile and "compile_policy" not in layout.collector_kwargs()
    [warning] = layout.warnings
    names(warning, "--compile on", "--backend ray")


def test_without_a_compiler_auto_acts_eagerly_with_one_line_and_on_is_refused(monkeypatch):
    monkeypatch.setattr(run_layout_module, "compile_unavailable", lambda device: "CalledProcessError: no g++")
    layout = run_layout(TrainConfig(backend="device", device="cpu"), Machine(cores=2))
    assert not layout.compile and len(layout.warnings) == 1
    names(layout.warnings[0], "--compile auto", "CalledProcessError: no g++", "apt install g++")  # the cause, the fix
    with raises(ValueError, "--compile on", "no g++", "--compile off"):
        run_layout(TrainConfig(backend="sync", compile="on", device="cpu"), Machine(cores=2))


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_without_a_compiler_the_reason_is_the_cause_not_its_header(tmp_path):
    """torch's error opens with a header ("backend='inductor' raised:"); the one line says what follows it."""
    import os
    import subprocess
    import sys

    (tmp_path / "bin").mkdir()  # a PATH without a C++ compiler; a fresh cache, so that nothing built is reused
    probe = subprocess.run([sys.executable, "-c", "from trainer.common.devices import compile_unavailable; "
                            "print(compile_unavailable('cpu'))"], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PATH": str(tmp_path / "bin"),
                                "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")})
    said = probe.stdout.strip()  # (BackendCompilerFailed or InductorError, as torch's caches stand)
    assert probe.returncode == 0 and "No working C++ compiler" in said and not said.endswith(":"), \
        (said, probe.stderr[-2000:])
    from collectors.base import one_line
    header = "backend='inductor' raised:\nInvalidCxxCompiler: No working C++ compiler found in ...\n\nSet ..."
    assert one_line(RuntimeError(header)) == "RuntimeError: InvalidCxxCompiler: No working C++ compiler found in ..."


@pytest.mark.slow  # (two processes that compile: the whole suite runs it)
def test_a_kernel_left_cut_short_by_a_killed_build_is_built_again(monkeypatch, tmp_path):
    """A run killed while inductor linked a kernel leaves the file empty or short, and inductor takes any file as
    built: the next compile of that kernel failed to load it, in every later run, until the file was found."""
    import os
    import subprocess
    import sys

    from filelock import FileLock

    def probe() -> str:
        said = subprocess.run([sys.executable, "-c", "from trainer.common.devices import compile_unavailable; "
                               "print(compile_unavailable('cpu'))"], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)})
        assert said.returncode == 0, said.stderr[-2000:]
        return said.stdout.strip()

    assert probe() == "None"
    kernel = next(tmp_path.glob("*/*.main.so"))  # the probe's addition
    whole = kernel.read_bytes()
    others = {p: p.read_bytes() for p in tmp_path.glob("*/*.so") if p != kernel}  # whole: kept
    for cut in (0, len(whole) // 2):
        kernel.write_bytes(whole[:cut])
        assert probe() == "None"  # built again, not loaded cut short
        assert kernel.read_bytes()[:4] == b"\x7fELF" and kernel.stat().st_size == len(whole)
    from trainer.common.devices import remove_broken_builds
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    kernel.write_bytes(b"")
    with FileLock(tmp_path / "locks" / f"{kernel.name.split('.')[0]}.lock"):  # being built by another process now
        assert remove_broken_builds() == [] and kernel.exists()  # its builder's to finish
    assert remove_broken_builds() == [kernel] and others == {p: p.read_bytes() for p in tmp_path.glob("*/*.so")}


def test_a_compile_typo_gets_a_did_you_mean(capsys):
    with pytest.raises(SystemExit) as refused:
        parse_args(["--compile", "of"])
    line = usage_error(refused.value.code, capsys.readouterr().err, "--compile", "'of'", "auto", "on")
    assert suggestion(line) == "off"


@pytest.mark.parametrize("given, meant", [("true", "on"), ("yes", "on"), ("1", "on"), ("false", "off"),
                                          ("No", "off"), ("0", "off"), ("auto", "auto"), ("on", "on")])
def test_compile_takes_the_true_and_false_every_switch_takes(given, meant):
    assert parse_args(["--compile", given]).config.compile == meant


# ---------------------------------------------------------------------------- defaults with a GPU

def test_ppo_on_vr_edge_with_a_gpu_defaults_to_the_device_backend_and_envs_that_fill_it():
    cfg = new_run_config({}, gpu=True)
    assert (cfg.backend, cfg.num_envs, cfg.num_steps) == ("device", 4096, 128)
    # the same iterations as the CPU default, so the same learning-rate schedule, over 64x the batch
    cpu = new_run_config({})
    assert cfg.total_steps // (cfg.num_envs * cfg.num_steps) == cpu.total_steps // (cpu.num_envs * cpu.num_steps)
    assert new_run_config({"num_envs": 512}, gpu=True).num_envs == 512  # flags win
    assert new_run_config({"env": "CartPole-v1"}, gpu=True).backend == "sync"  # no torch version of CartPole


@pytest.mark.parametrize("argv, backend, num_envs", [
    (["--device", "cuda"], "device", 4096),
    (["--device", "cuda", "--backend", "sync"], "sync", 64),  # another backend: no GPU defaults at all
    (["--device", "cpu"], "sync", 64),
    (["--device", "cuda", "--algo", "apex"], "sync", 16),
])
def test_the_gpu_defaults_follow_the_device_flag(argv, backend, num_envs, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # a machine with a GPU
    cfg = parse_args(argv).config
    assert (cfg.backend, cfg.num_envs) == (backend, num_envs)


def test_the_layout_on_a_gpu_machine_prints_the_envs_it_fills_it_with(monkeypatch):
    monkeypatch.setattr(run_layout_module, "compile_unavailable", lambda device: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    layout = run_layout(parse_args(["--device", "cuda"]).config, Machine(cores=16, gpus=1))
    text = layout.describe()
    assert "VREdge-v0, 4096 envs as 1 x VREdgeTorchEnv(4096); device:" in text and "learner on cuda" in text
    assert layout.compile


# ---------------------------------------------------------------------------- what the bar says

@pytest.mark.parametrize("compile", ["on", "off"])
def test_a_compiling_run_labels_its_bar_until_the_first_iteration_is_done(tmp_path, monkeypatch, capsys, compile):
    """The compile makes the first iteration a minute or more on a busy 2-core CPU (the cell recipe): the bar says
    why it waits at 0, and drops the label once an iteration is done; an eager run's bar has no label. (torch.compile
    is the identity here: the label follows the run's layout, and compiling would take most of a minute.)"""
    import sys

    from trainer.loop import COMPILING, train

    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: fn if fn is not None else (lambda f: f))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the bar as a terminal draws it
    cfg = TrainConfig(env="CartPole-v1", num_envs=2, num_steps=8, total_steps=48, backend="sync", device="cpu",
                      compile=compile, run_dir=str(tmp_path / "run"))
    train(cfg, progress=True)
    frames = [f for f in capsys.readouterr().err.split("\r") if "/3 [" in f]
    first = [f for f in frames if " 0/3 [" in f]
    later = [f for f in frames if " 0/3 [" not in f]
    assert first and later and any(" 3/3 [" in f for f in later)
    assert all((COMPILING in f) == (compile == "on") for f in first)
    assert not any(COMPILING in f for f in later)


def test_in_a_log_the_training_bar_is_lines(tmp_path, monkeypatch, capsys):
    """Where standard error is no terminal (a pipe, a log, CI), the training bar is whole lines now and then, not
    a redraw in place: a log read line by line had nothing for 70-85 s of a default run."""
    from trainer.common import progress
    from trainer.loop import train

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)  # every redraw a line, so that the test sees them
    cfg = TrainConfig(env="CartPole-v1", num_envs=2, num_steps=8, total_steps=48, backend="sync", device="cpu",
                      run_dir=str(tmp_path / "run"))
    train(cfg, progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert [line for line in err.splitlines() if " 3/3 [" in line]


def test_a_bar_ticks_through_a_long_step_on_a_terminal_and_in_a_log():
    """``ticking``: a bar is redrawn between updates, so its elapsed time moves through a long iteration on a
    terminal, and a log gets a line every heartbeat however long the iteration (here 0.05 s); ``shown=False``:
    nothing more."""
    import io
    import time

    from tqdm import tqdm

    from trainer.common.progress import StatusLines, ticking

    def redraws(out: io.StringIO, file: object, shown: bool = True) -> str:
        bar = tqdm(total=5, file=file)
        drawn = len(out.getvalue())
        with ticking(bar, every=0.01, shown=shown):
            time.sleep(0.3)
        return out.getvalue()[drawn:]

    terminal = io.StringIO()
    assert redraws(terminal, terminal).count("0/5") >= 3
    assert redraws(terminal, terminal, shown=False) == ""
    log = io.StringIO()
    lines = redraws(log, StatusLines(log, every=0.05)).splitlines()
    assert len(lines) >= 3 and all("0/5" in line for line in lines)


# ---------------------------------------------------------------------------- the PPO loss

@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_ppo_learns_the_same_with_a_compiled_loss_without_recompiling():
    """--compile also compiles PPO's loss (forward and backward): the same learning up to float rounding, one
    graph for the whole run (every minibatch has the planned size)."""
    from collectors import make_collector as collector_for

    def iterations(compile: str, n: int) -> tuple[PPO, list[dict]]:
        cfg = TrainConfig(env="CartPole-v1", num_envs=4, num_steps=32, device="cpu", compile=compile)
        layout = run_layout(cfg, Machine(cores=1))
        ppo = PPO.new(cfg, layout)
        with collector_for(layout.env_factories(), ppo.acting, num_steps=cfg.num_steps, seed=cfg.seed,
                           **layout.collector_kwargs(), **ppo.collector_options()) as collector:
            ppo.attach(collector)
            return ppo, [ppo.iterate(start=(0, 0.0)) for _ in range(n)]

    eager, eager_rows = iterations("off", 3)
    compiled, first = iterations("on", 1)
    assert compiled.start_notes()[0] == "compiled too (--compile): the PPO loss, forward and backward"
    assert eager.start_notes() == []
    graphs = counters["stats"]["unique_graphs"]
    layout = run_layout(compiled.cfg, Machine(cores=1))  # the same threads: dynamo guards on the count
    with collector_for(layout.env_factories(), compiled.acting, num_steps=32, seed=compiled.cfg.seed,
                       **layout.collector_kwargs()) as collector:
        compiled.attach(collector)
        rows = [compiled.iterate(start=(0, 0.0)) for _ in range(2)]
    assert counters["stats"]["unique_graphs"] == graphs  # later iterations: no new graph
    for name in ("loss", "approx_kl", "entropy"):
        assert first[0][name] == pytest.approx(eager_rows[0][name], rel=1e-3, abs=1e-5), name
    assert all(r["iteration"] == i for r, i in zip(rows, (2, 3)))


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
@pytest.mark.parametrize("backend", ["device", pytest.param("async", marks=pytest.mark.slow)])
def test_a_compiled_run_and_its_resume_never_recompile(tmp_path, backend):
    """Through the command line, as users run it: dynamo reports every recompilation (TORCH_LOGS=recompiles);
    a run of three iterations and its resume must have none (one graph per compiled function)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCH_LOGS": "recompiles"}
    flags = ["--backend", backend, "--compile", "on", "--num-envs", "8", "--num-steps", "16", "--device", "cpu"]
    for extra in (["--total-steps", "384", "--run-dir", str(tmp_path / "run")],
                  ["--resume", str(tmp_path / "run"), "--total-steps", "640"]):
        done = subprocess.run([sys.executable, "-m", "trainer.train", *flags, *extra], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "acting step compiled (--compile)" in done.stderr
        assert "Recompiling" not in done.stderr, done.stderr[-3000:]


def test_a_policy_that_cannot_be_compiled_is_explained_at_its_first_call():
    def untraceable(obs):  # a host round trip (Python lists): a graph break, which fullgraph=True refuses
        return torch.tensor([[int(x > 0.5) for x in row[:8]] for row in obs.tolist()], dtype=torch.int64)

    collector = make_collector([functools.partial(envs.VREdgeTorchEnv, 4)], untraceable, backend="device", num_steps=2,
                               compile_policy=True)
    with raises(RuntimeError, "compile_policy", "torch.compile", "compile_policy=False") as e:  # the way out
        collector.collect()
    assert e.value.__cause__ is not None  # the compiler's own error stays attached
    with make_collector([functools.partial(envs.VREdgeTorchEnv, 4)], untraceable, backend="device",
                        num_steps=2) as eager:
        assert eager.collect().batch["actions"].shape == (2, 4, 8)


def test_a_compile_failure_names_what_follows_the_compilers_header(monkeypatch):
    """inductor's own error opens with "backend='inductor' raised:": the one line says what it raised."""
    def compiled_that_fails(fn, **_kw):
        def call(*args, **kwargs):
            raise RuntimeError("backend='inductor' raised:\nImportError: kernel.so: file too short")
        return call

    monkeypatch.setattr(torch, "compile", compiled_that_fails)
    collector = make_collector([functools.partial(envs.VREdgeTorchEnv, 4)], lambda obs: obs, backend="device",
                               num_steps=2, compile_policy=True)
    with raises(RuntimeError, "compile_policy", "ImportError", "file too short"):
        collector.collect()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("argv", [["--device", "cuda"], ["--device", "cuda:1", "--backend", "sync"]])
def test_cuda_without_a_gpu_is_one_line_before_any_line_about_the_run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    usage_error(e.value.code, err, "--device", argv[1], "cpu")  # the device asked for, and the way out
    assert torch.__version__ in err  # and why torch sees no GPU: a CPU build of torch (below), or no GPU found


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("cuda", [None, "12.8"])
def test_cuda_without_a_gpu_says_whether_the_torch_build_or_the_machine_lacks_it(cuda, monkeypatch, capsys):
    """A CPU build of torch sees no GPU even where nvidia-smi shows one: the line says so, and where a CUDA build
    is; a CUDA build that finds none says so, and where to look."""
    monkeypatch.setattr(torch.version, "cuda", cuda)
    with pytest.raises(SystemExit) as e:
        parse_args(["--device", "cuda"])
    if cuda is None:
        usage_error(e.value.code, capsys.readouterr().err, "is a CPU build", "nvidia-smi", "install a CUDA build",
                    "docs/device.md#a-cuda-build-of-torch", "--device cpu")
    else:
        usage_error(e.value.code, capsys.readouterr().err, "(CUDA 12.8) finds no GPU", "nvidia-smi", "--device cpu")
