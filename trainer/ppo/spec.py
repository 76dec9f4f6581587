"""PPO as the command line knows it before torch loads: its help, its settings (``trainer.ppo.settings``), its
defaults per env."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from envs.settings import ConfigError
from trainer.algorithm import AlgorithmSpec
from trainer.ppo.settings import PPOSettings

if TYPE_CHECKING:
    from trainer.config import TrainConfig


class PPOSpec(AlgorithmSpec):
    """``--algo ppo``; the run itself is :class:`trainer.ppo.algorithm.PPO`.

    Example:
        >>> PPOSpec.defaults_for("CartPole-v1")
        {'num_envs': 8, 'total_steps': 200000}
    """

    description: ClassVar[str] = "actor-critic, on-policy"
    model_name: ClassVar[str] = "a PPO actor-critic"
    Settings: ClassVar[type] = PPOSettings
    exportable: ClassVar[bool] = True
    critic: ClassVar[bool] = True
    # VR-edge: TrainConfig's own defaults (docs/benchmarks.md, "The defaults over 5 seeds"); other envs: the
    # CartPole command of docs/training.md (8 envs x 128 steps, 200k steps)
    defaults: ClassVar[dict[str, dict[str, Any]]] = {
        "VREdge-v0": {},
        "*": {"num_envs": 8, "total_steps": 200_000},
    }
    # VR-edge on a GPU: stepped as torch tensors next to the policy, with envs enough to fill the GPU and the same
    # number of iterations (so the same minibatch count and learning-rate schedule) over 64x the batch
    gpu_defaults: ClassVar[dict[str, dict[str, Any]]] = {
        "VREdge-v0": {"backend": "device", "num_envs": 4096, "total_steps": 3_000_000 * 64},
    }
    implementation: ClassVar[str] = "trainer.ppo.algorithm:PPO"
    # compiled, VR-edge defaults ran 1.39x faster on 2 cores after ~23 s of compiling with a cold cache (1 s warm):
    # it pays from ~2M env steps (docs/benchmarks.md, "Compiling the acting step and the loss")
    compile_pays_after: ClassVar[int | None] = 2_000_000
    data_parallel: ClassVar[bool] = True  # torchrun: gradients, normaliser and figures averaged over the ranks

    @classmethod
    def check_config(cls, cfg: TrainConfig) -> None:
        """``dagger_labels`` needs an expert that can label the run's env, every step of its envs in order (not
        --keep-collecting, which drops rollouts) and a minibatch step of PPO's own (not --cuda-graphs)."""
        ppo: PPOSettings = cfg.algo_settings
        if not ppo.dagger_labels:
            return
        from envs.profiles import profile_of  # (imports no torch)

        expert = profile_of(cfg.env).expert
        why = f"{cfg.env} declares no expert to label its states" if expert is None else expert.refusal(cfg.env_options)
        if cfg.keep_collecting:
            why = why or "--keep-collecting drops rollouts, and the expert must see every step"
        if ppo.cuda_graphs:
            why = why or "not with --cuda-graphs: its step is not captured"
        if why:
            raise ConfigError("dagger_labels", ppo.dagger_labels, f"cannot label during training: {why}; leave it 0",
                              flag=False)

    @classmethod
    def keep_collecting(cls, cfg: TrainConfig) -> bool:
        return cfg.keep_collecting  # IMPALA-style: V-trace corrects for the lag
