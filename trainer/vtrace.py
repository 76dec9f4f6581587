"""V-trace targets (Espeholt et al., 2018) for learning from rollouts of a slightly stale behaviour policy."""

from __future__ import annotations

import torch


def vtrace(behaviour_log_probs: torch.Tensor, target_log_probs: torch.Tensor, rewards: torch.Tensor,
           values: torch.Tensor, next_vals: torch.Tensor, done: torch.Tensor, gamma: float,
           rho_bar: float = 1.0, c_bar: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(vs, pg_advantages)``, both ``[T, N]``.

    ``next_vals`` is how each step bootstraps (value of the next observation; of the final
    observation on truncation; 0 on termination, see :func:`trainer.gae.next_values`), and
    ``done`` cuts the recursion between episodes. With ``rho_bar = c_bar = lam = 1`` and
    equal policies, ``vs`` is the n-step return to the end of the rollout.
    """
    rho = torch.exp(target_log_probs - behaviour_log_probs)
    clipped_rho = rho.clamp(max=rho_bar)
    cs = lam * rho.clamp(max=c_bar) * (~done).to(values.dtype)
    deltas = clipped_rho * (rewards + gamma * next_vals - values)
    correction = torch.zeros_like(values)
    running = torch.zeros_like(values[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + gamma * cs[t] * running
        correction[t] = running
    vs = values + correction
    # the target for step t's Q estimate: v_s of the next step within the episode, else the bootstrap
    vs_next = torch.cat([vs[1:], next_vals[-1:]], dim=0)
    vs_next = torch.where(done, next_vals, vs_next)
    pg_advantages = clipped_rho * (rewards + gamma * vs_next - values)
    return vs, pg_advantages
