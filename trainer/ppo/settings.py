"""PPO's own settings, declared once with their help and limits (``envs.settings``); the run's are
``trainer.config.TrainConfig``'s. Imports no torch: the command line reads them before torch loads."""

from __future__ import annotations

from dataclasses import dataclass

from envs.settings import setting


@dataclass
class PPOSettings:
    """What ``--algo ppo`` reads besides the run's settings: the loss, the update, the targets.

    Example (a run's config holds them as ``algo_settings``; flat keys are sorted to their owner):
        >>> from trainer.config import TrainConfig
        >>> cfg = TrainConfig.from_dict({"env": "CartPole-v1", "epochs": 2})
        >>> cfg.algo_settings.epochs, cfg.algo_settings.clip_coef, cfg.to_dict()["epochs"]
        (2, 0.2, 2)
    """

    epochs: int = setting(4, "PPO epochs per rollout", at_least=1)
    minibatch_size: int = setting(0, "minibatch size", at_least=0, zero="planned from num_envs x num_steps "
                                  "(python -m trainer.batching shows the plan)")
    gae_lambda: float = setting(0.95, "GAE lambda", at_least=0, at_most=1)
    clip_coef: float = setting(0.2, "PPO clip range", above=0)
    ent_coef: float = setting(0.001, "entropy bonus")
    target_kl: float = setting(0.0, "stop the epochs early above this KL", at_least=0, zero="off")
    distill_episodes: int = setting(64, "once a run of at least 1M env steps on VR-edge's synthetic cell has "
                                    "finished: distil the causal reference into its policy, BeliefMPC labelling the "
                                    "states of this many episodes it plays (python -m trainer.distill)", at_least=0,
                                    at_most=100_000, zero="off", resumable=True, flag=False)
    distill_rounds: int = setting(1, "rounds of that distillation, each on episodes of its own played by the policy "
                                  "the round before left (DAgger)", at_least=1, at_most=10, resumable=True, flag=False)
    dagger_labels: int = setting(0, "DAgger inside the loop: states of each rollout the env's expert (VR-edge: "
                                 "BeliefMPC) labels while the run trains, every k-th step of up to 8 envs, the actor "
                                 "then taking one cross-entropy step toward its actions (trainer/ppo/dagger.py)",
                                 at_least=0, at_most=100_000, zero="off", flag=False)
    cuda_graphs: bool = setting(False, "on a CUDA learner: capture each minibatch step (loss, backward, clip, "
                                "Adam) as one CUDA graph, replayed with one launch; with --backend device and "
                                "--compile, the acting step too (torch.compile's reduce-overhead); measured by "
                                "benchmarks.device_check, not yet on by default", resumable=True)
    vf_coef: float = setting(0.5, "value loss weight", flag=False)
    clip_value: bool = setting(False, "clip the value loss too", flag=False)
    norm_adv: bool = setting(True, "normalise advantages per minibatch", flag=False)
    normalize_obs: bool = setting(True, "running observation normalisation", flag=False)
    scale_rewards: bool = setting(False, "divide rewards by the running return's std", flag=False)
    shared_trunk: bool = setting(False, "one trunk for actor and critic (a set policy: one encoder pass whose "
                                 "output both read; not available with a per_head one)", flag=False)
    # learning from a lagging policy (--overlap, --keep-collecting)
    overlap_targets: str = setting("vtrace", "with --overlap: vtrace (V-trace corrects the targets for the "
                                   "one-update lag) or gae (stored values, PPO ratio against the behaviour "
                                   "log-probs; measured not to pay: docs/benchmarks.md)", choices=("gae", "vtrace"),
                                   flag=False)
    max_lag: int = setting(4, "with --keep-collecting: drop batches collected more than this many policy versions "
                           "ago", at_least=0, flag=False)
    rho_bar: float = setting(1.0, "V-trace importance-weight clip for the targets and advantages", above=0,
                             flag=False)
    c_bar: float = setting(1.0, "V-trace trace-cutting clip", above=0, flag=False)
