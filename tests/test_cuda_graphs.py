"""--cuda-graphs: PPO's minibatch step captured as one CUDA graph, its learning rate a device tensor written in place.

On the CPU: what the capture stands on (the learning-rate tensor, the optimiser state a checkpoint
restores, warm-up steps that leave no trace) and what the layout and the command line decide. On
CUDA (marked ``cuda``, run by ``benchmarks.device_check``): the captured update against the eager one.
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import pytest
import torch

import trainer.run_layout as run_layout_module
from tests.messages import raises, usage_error
from trainer.common.flat_params import flat_parameters
from trainer.config import TrainConfig, new_run_config
from trainer.flags import parse_args
from trainer.ppo.algorithm import PPO
from trainer.ppo.cuda_graph import CapturedStep, training_state_kept
from trainer.ppo.model import ActorCritic
from trainer.ppo.optimizer import fused_adam, load_optimizer_state, set_learning_rate
from trainer.ppo.update import LearnerSamples, MinibatchStep, UpdateSettings, ppo_update
from trainer.run_layout import Machine, run_layout

SETTINGS = UpdateSettings(epochs=2, minibatch_size=16, clip_coef=0.2, clip_value=False, ent_coef=0.01, vf_coef=0.5,
                       max_grad_norm=0.5, norm_adv=True, target_kl=None)


def learner(device: str = "cpu", capturable: bool = False, seed: int = 0) -> tuple[ActorCritic, MinibatchStep]:
    env = gym.make("CartPole-v1")
    model = ActorCritic(env.observation_space, env.action_space, seed=seed).to(device)
    optimizer = fused_adam(flat_parameters(model), 1e-3, capturable=capturable)
    return model, MinibatchStep(model, optimizer, SETTINGS)


def samples(model: ActorCritic, n: int = 64, seed: int = 0) -> LearnerSamples:
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 4, generator=g).to(device)
    out = model.act(obs, torch.arange(n, device=device), torch.zeros(n, dtype=torch.int64, device=device))
    adv = torch.randn(n, generator=g).to(device)
    return LearnerSamples(obs, out["action"], out["log_prob"], out["value"], adv, out["value"] + adv)


def state_of(step: MinibatchStep) -> list[torch.Tensor]:
    p = step.params[0]
    return [p.detach().clone(), p.grad.clone(), *(t.clone() for t in step.optimizer.state[p].values())]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------------------- the learning-rate tensor

def test_a_tensor_learning_rate_on_the_cpu_gives_the_bits_of_a_float_one():
    """The CPU's fused kernel reads the tensor as a double: eager CPU runs are what they were with a float."""
    runs = []
    for as_tensor in (False, True):
        torch.manual_seed(0)
        param = torch.nn.Parameter(torch.randn(500))
        optimizer = fused_adam(param, 3e-4) if as_tensor else torch.optim.Adam([param], lr=3e-4, eps=1e-5, fused=True)
        for i in range(20):
            param.grad = torch.randn(500)
            lr = 3e-4 * (1 - i / 20)  # annealed, as the trainer does
            if as_tensor:
                set_learning_rate(optimizer, lr)
            else:
                optimizer.param_groups[0]["lr"] = lr
            optimizer.step()
        runs.append(param.detach().clone())
    assert torch.equal(*runs)


def test_annealing_writes_the_same_tensor_in_place():
    _, step = learner()
    lr = step.optimizer.param_groups[0]["lr"]
    set_learning_rate(step.optimizer, 2.5e-4)
    assert step.optimizer.param_groups[0]["lr"] is lr and lr.item() == 2.5e-4


@pytest.mark.parametrize("saved_lr", [7e-4, torch.tensor(7e-4, dtype=torch.float32)])  # an older float, a CUDA save
def test_loading_a_checkpoints_optimizer_keeps_this_runs_tensor_and_capturable(saved_lr):
    model, step = learner()
    for _ in range(2):
        step(samples(model))
    saved = step.optimizer.state_dict()
    saved["param_groups"][0].update(lr=saved_lr, capturable=True)  # as a CUDA run with --cuda-graphs saves it
    _, fresh = learner(seed=1)
    lr = fresh.optimizer.param_groups[0]["lr"]
    load_optimizer_state(fresh.optimizer, saved)
    group = fresh.optimizer.param_groups[0]
    assert group["lr"] is lr and group["lr"].dtype == torch.float64 and group["lr"].item() == pytest.approx(7e-4)
    assert group["capturable"] is False  # this run's: on the CPU, nothing is captured
    p = fresh.params[0]
    assert torch.equal(fresh.optimizer.state[p]["exp_avg"], step.optimizer.state[step.params[0]]["exp_avg"])


# ---------------------------------------------------------------------------- warm-up steps that leave no trace

@pytest.mark.parametrize("steps_before", [0, 2])  # the optimiser's state made inside (its first step), or existing
def test_steps_inside_training_state_kept_leave_no_trace(steps_before):
    model, step = learner()
    ref_model, ref = learner()
    batch = samples(model)
    for s in (step, ref):
        for _ in range(steps_before):
            s(batch)
    before = [p.detach().clone() for p in step.params]
    with training_state_kept(step):
        for _ in range(3):
            step(samples(model, seed=1))
        assert not torch.equal(step.params[0], before[0])  # they did learn, inside
    assert torch.equal(step.params[0], before[0])
    out, expected = step(batch), ref(batch)  # the next step is the one that would have come next
    assert torch.equal(out.loss, expected.loss)
    assert same(state_of(step), state_of(ref))


def test_a_step_is_captured_only_on_cuda_with_a_capturable_optimizer():
    _, step = learner()
    with raises(ValueError, "CUDA", "cpu"):  # what it needs, where the parameters are
        CapturedStep(step)


# ---------------------------------------------------------------------------- what the layout and the CLI decide

def test_cuda_graphs_on_a_cpu_learner_is_refused_naming_the_fix():
    with raises(ValueError, "--cuda-graphs", "true", "cpu", "--device cuda", "--cuda-graphs false", key="cuda_graphs"):
        run_layout(TrainConfig.from_dict(dict(device="cpu", cuda_graphs=True)), Machine(cores=2))


@pytest.mark.slow  # (a process that trains or waits: the whole suite runs it)
def test_cuda_graphs_on_the_command_line_without_a_gpu_is_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "trainer.train", "--device", "cpu", "--cuda-graphs", "true",
                          "--total-steps", "1024", "--run-dir", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    usage_error(run.returncode, run.stderr, "--cuda-graphs", "true", "cpu")
    assert not (tmp_path / "r" / "checkpoints").exists()
    toml = tmp_path / "run.toml"
    toml.write_text("cuda-graphs = true\n")
    run = subprocess.run([sys.executable, "-m", "trainer.train", "--device", "cpu", "--config", str(toml)],
                         capture_output=True, text=True, timeout=120)
    usage_error(run.returncode, run.stderr, toml, "cuda_graphs = true", "cpu")


def test_cuda_graphs_are_ppos_setting():
    with pytest.raises(SystemExit):
        parse_args(["--algo", "apex", "--cuda-graphs", "true"])


@pytest.mark.parametrize("backend, compile, acting", [
    ("device", "on", "reduce-overhead"),  # the acting step is compiled, so it is captured too
    ("device", "off", False),  # only the update is captured
    ("sync", "on", True),  # the collector acts on the CPU: compiled, not captured
])
def test_the_layout_on_a_gpu_captures_the_update_and_a_compiled_acting_step_on_the_device(
        backend, compile, acting, monkeypatch):
    monkeypatch.setattr(run_layout_module, "compile_unavailable", lambda device: None)
    cfg = new_run_config({"device": "cuda", "backend": backend, "compile": compile, "cuda_graphs": True}, gpu=True)
    layout = run_layout(cfg, Machine(cores=16, gpus=1))  # a simulated GPU server
    assert layout.cuda_graphs and layout.acting_compile == acting
    assert layout.collector_kwargs()["compile_policy"] == acting
    if backend == "device":
        assert layout.env_factories()[0].keywords["compile"] == acting
    described = "acting step and PPO minibatch step captured" if acting == "reduce-overhead" else \
        ", PPO minibatch step captured"
    assert f"{described} as CUDA graphs (--cuda-graphs)" in layout.describe()
    assert not run_layout(cfg.replaced(cuda_graphs=False), Machine(cores=16, gpus=1)).cuda_graphs


def test_cuda_graphs_may_change_on_resume():
    from trainer.flags import RESUMABLE_CHANGES
    assert "cuda_graphs" in RESUMABLE_CHANGES  # not state: how the same update runs


# ---------------------------------------------------------------------------- on CUDA

@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compiled", [False, True])  # the loss eager, or compiled (inductor's kernels, captured)
def test_the_captured_update_follows_the_eager_one_and_reads_the_live_learning_rate(compiled):
    from trainer.ppo.update import compiled_ppo_loss
    runs = []
    for capture in (False, True):
        model, step = learner("cuda", capturable=capture)
        if compiled:
            step.loss_fn = compiled_ppo_loss()
        update = CapturedStep(step) if capture else step
        rows = []
        for it, lr in enumerate((1e-3, 5e-4, 0.0)):  # annealed; 0 must leave the weights as they are
            set_learning_rate(step.optimizer, lr)
            before = step.params[0].detach().clone()
            rows.append(ppo_update(update, samples(model, 256, seed=it), torch.Generator("cuda").manual_seed(it)))
            if lr == 0.0:
                assert torch.equal(step.params[0], before)  # the graph reads the live learning rate
        runs.append((step.params[0].detach().cpu(), rows))
    (eager, eager_rows), (graphed, graphed_rows) = runs
    assert not torch.equal(eager, learner()[1].params[0].detach())  # it learned
    assert torch.allclose(eager, graphed, atol=1e-5)
    for a, b in zip(eager_rows, graphed_rows):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replacing_the_optimizer_state_after_the_capture_is_refused():
    model, step = learner("cuda", capturable=True)
    captured = CapturedStep(step)
    batch = samples(model, 64)
    captured(batch.index(slice(0, 16)))
    step.optimizer.load_state_dict(step.optimizer.state_dict())  # new state tensors: the graph's are stale
    with raises(RuntimeError, "load_state_dict", "CapturedStep"):  # what replaced it, and the way out
        captured(batch.index(slice(16, 32)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_run_resumes_exactly(tmp_path):
    from benchmarks.device_check import resume_matches
    assert resume_matches("cuda", 16, 2, 32, tmp_path, backend="device", cuda_graphs=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ppo_with_cuda_graphs_trains_through_the_command_line(tmp_path):
    cfg = TrainConfig.from_dict(dict(backend="device", device="cuda", cuda_graphs=True, compile="off", num_envs=64,
                                     total_steps=3 * 64 * 128, run_dir=str(tmp_path / "r")))
    layout = run_layout(cfg, Machine.detect())
    ppo = PPO.new(cfg, layout)
    assert isinstance(ppo.step, CapturedStep) and any("captured (--cuda-graphs)" in n for n in ppo.start_notes())
    run = subprocess.run([sys.executable, "-m", "trainer.train", "--device", "cuda", "--backend", "device",
                          "--cuda-graphs", "true", "--compile", "off", "--num-envs", "64",
                          "--total-steps", str(3 * 64 * 128), "--run-dir", str(tmp_path / "cli")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "PPO minibatch step captured as CUDA graphs (--cuda-graphs)" in run.stdout + run.stderr
