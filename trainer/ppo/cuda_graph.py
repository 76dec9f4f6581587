"""PPO's minibatch step captured as one CUDA graph (``--cuda-graphs true``): a launch per minibatch, not one per op."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from trainer.ppo.update import LearnerSamples, MinibatchStep, PPOLoss


@contextmanager
def training_state_kept(step: MinibatchStep) -> Iterator[None]:
    """Run steps inside it that leave no trace: the parameters, their gradients and the optimiser's state are as
    before afterwards, in place (the same tensors, so a graph captured inside it reads the live ones).

    State the optimiser creates inside it (at its first step) is zeroed afterwards: Adam's state
    starts at zeros, so the next step is the first one, as if none had run.

    Example:
        >>> import gymnasium as gym
        >>> from trainer.common.flat_params import flat_parameters
        >>> from trainer.ppo.model import ActorCritic
        >>> from trainer.ppo.optimizer import fused_adam
        >>> from trainer.ppo.update import UpdateSettings
        >>> env = gym.make("CartPole-v1")
        >>> model = ActorCritic(env.observation_space, env.action_space)
        >>> settings = UpdateSettings(epochs=1, minibatch_size=8, clip_coef=0.2, clip_value=False, ent_coef=0.0,
        ...                        vf_coef=0.5, max_grad_norm=0.5, norm_adv=True, target_kl=None)
        >>> step = MinibatchStep(model, fused_adam(flat_parameters(model), 1e-3), settings)
        >>> obs = torch.randn(8, 4)
        >>> out = model.act(obs)
        >>> mb = LearnerSamples(obs, out["action"], out["log_prob"], out["value"], torch.randn(8), torch.randn(8))
        >>> before = step.params[0].detach().clone()
        >>> with training_state_kept(step):
        ...     _ = step(mb)
        >>> torch.equal(step.params[0], before), float(step.optimizer.state[step.params[0]]["step"])
        (True, 0.0)
    """
    params = step.params
    before = {id(t) for p in params for t in step.optimizer.state.get(p, {}).values()}
    saved = [(t, t.detach().clone()) for p in params for t in (p, p.grad) if t is not None]
    saved += [(t, t.detach().clone()) for p in params for t in step.optimizer.state.get(p, {}).values()
              if torch.is_tensor(t)]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, copy in saved:
                t.copy_(copy)
            for p in params:
                for t in step.optimizer.state.get(p, {}).values():
                    if torch.is_tensor(t) and id(t) not in before:
                        t.zero_()


class CapturedStep:
    """A :class:`~trainer.ppo.update.MinibatchStep` captured as one CUDA graph at its first call, then replayed for
    every minibatch: its input copied into fixed buffers, one ``graph.replay()``, the same :class:`PPOLoss` back
    (its tensors overwritten by the next call, so read them before).

    Capturing runs the step a few times on a side stream first (allocations, cuBLAS workspaces, a
    compiled loss's compilation) inside :func:`training_state_kept`, so the run learns exactly as
    if they had not run. What a replay relies on, all kept in place by the trainer: one minibatch
    shape (the plan's; a remainder waits for the next shuffle), the flat parameter and its
    gradient, Adam's state (``capturable=True``), the learning-rate tensor
    (``trainer.ppo.optimizer``) and the observation normaliser's buffers. Replacing the
    optimiser's state or learning rate after the capture (``load_state_dict``) is refused.

    Use (on CUDA; what ``PPO.new`` builds with ``--cuda-graphs true``)::

        optimizer = fused_adam(flat_parameters(model), lr, capturable=True)   # trainer.ppo.optimizer
        step = CapturedStep(MinibatchStep(model, optimizer, settings))
        stats = ppo_update(step, samples, generator)                          # captured at the first minibatch
    """

    def __init__(self, step: MinibatchStep, warmup: int = 3) -> None:
        device = step.params[0].device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; this step's parameters are on {device}")
        if not all(group.get("capturable") for group in step.optimizer.param_groups):
            raise ValueError("CUDA graphs need an optimiser built with capturable=True "
                             "(trainer.ppo.optimizer.fused_adam(..., capturable=True))")
        self.step, self.settings, self.warmup = step, step.settings, warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: LearnerSamples | None = None
        self.outputs: PPOLoss | None = None
        self._live: list[torch.Tensor] = []  # the optimiser tensors the graph reads and writes

    def _optimizer_tensors(self) -> list[torch.Tensor]:
        optimizer = self.step.optimizer
        return [group["lr"] for group in optimizer.param_groups] + [
            t for p in self.step.params for t in optimizer.state.get(p, {}).values() if torch.is_tensor(t)]

    def _capture(self) -> None:
        with training_state_kept(self.step):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())  # after the state's copies, which the warm-up overwrites
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.step(self.inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.outputs = self.step(self.inputs)
        self.graph, self._live = graph, self._optimizer_tensors()

    def __call__(self, mb: LearnerSamples) -> PPOLoss:
        if self.graph is not None and _replaced(self._optimizer_tensors(), self._live):
            raise RuntimeError("the optimiser's state or learning rate was replaced after its step was captured "
                               "(load_state_dict?); load before the first update, or build a new CapturedStep")
        if self.inputs is None:
            self.inputs = LearnerSamples(*(torch.empty_like(x) for x in mb))
        for dst, src in zip(self.inputs, mb):
            dst.copy_(src)
        if self.graph is None:  # the first minibatch: its values in the buffers serve the warm-up
            self._capture()
        self.graph.replay()
        return self.outputs


def _replaced(now: list[torch.Tensor], captured: list[torch.Tensor]) -> bool:
    return len(now) != len(captured) or any(a is not b for a, b in zip(now, captured))
