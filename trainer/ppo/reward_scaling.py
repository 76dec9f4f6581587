"""PPO's reward scaling by the running standard deviation of the discounted return (``scale_rewards``)."""

from __future__ import annotations

import torch

from trainer.common.moments import merged_moments
from trainer.common.world import ALONE, World


class ReturnScaler:
    """Divides rewards by the running std of the discounted return (per env), as in many PPO codes.

    Example:
        >>> scaler = ReturnScaler(num_envs=2, gamma=0.99, device=torch.device("cpu"))
        >>> factor = scaler.scale(torch.ones(8, 2), torch.zeros(8, 2, dtype=torch.bool))
        >>> factor.shape, factor.dtype
        (torch.Size([]), torch.float32)

    The return of each env runs on across rollouts (reset where an episode ends), so a
    checkpoint holds it (``state_dict``: the run's envs, whatever ``world`` stepped them). Statistics are
    float64, over every rank's returns.
    """

    def __init__(self, num_envs: int, gamma: float, device: torch.device, world: World = ALONE) -> None:
        """``num_envs``: the run's; this rank keeps the returns of its share (``world.envs``)."""
        self.gamma, self.world, self.envs = gamma, world, world.envs(num_envs)
        self.ret = torch.zeros(self.envs.stop - self.envs.start, dtype=torch.float64, device=device)
        self.moments = torch.tensor([0.0, 1.0, 1e-4], dtype=torch.float64, device=device)  # mean, var, count

    def scale(self, rewards: torch.Tensor, done: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """The factor ``1 / std`` for a ``[T, n]`` batch of the envs ``rows`` (default: all; a Ray
        ``keep_collecting`` rollout holds one slice), after adding its discounted returns to the statistics."""
        rows = rows if rows is not None else slice(None)
        ret = self.ret[rows]
        rets = torch.empty_like(rewards, dtype=torch.float64)
        for t in range(rewards.shape[0]):
            ret = ret * self.gamma + rewards[t]
            rets[t] = ret
            ret = torch.where(done[t], torch.zeros_like(ret), ret)
        self.ret[rows] = ret
        self.moments = torch.stack(merged_moments(*self.moments, rets.reshape(-1), self.world))
        return (1.0 / torch.sqrt(self.moments[1] + 1e-8)).float()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"ret": self.world.gather_envs(self.ret).cpu(), "moments": self.moments.cpu()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.ret = state["ret"][self.envs].to(self.ret.device)
        self.moments = state["moments"].to(self.moments.device)
