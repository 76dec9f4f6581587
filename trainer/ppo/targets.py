"""PPO's targets: how each step bootstraps, GAE, and V-trace for rollouts of a slightly older policy.

The kernels (:func:`next_values`, :func:`compute_gae`, :func:`vtrace`) are pure functions of ``[T, N]``
tensors, vectorised over envs; :func:`advantages_and_returns` and :func:`vtrace_targets` apply them to a
rollout with the model's values. Both recursions backwards in time are :func:`discounted_sums`: a loop over
steps on the CPU, a scan of ``log2(T)`` steps elsewhere (a loop there is a few kernel launches per step).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from trainer.ppo.model import ActorCritic


def next_values(values: torch.Tensor, last_value: torch.Tensor, final_values: torch.Tensor,
                terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Value of the state after each step ``[T, N]``.

    Bootstraps from the next observation's value; on a truncated step from the value
    of the episode's true final observation (``final_values``); 0 on a terminated step.
    """
    following = torch.cat([values[1:], last_value[None]], dim=0)
    following = torch.where(truncated, final_values, following)
    return torch.where(terminated, torch.zeros_like(following), following)


def discounted_sums_by_loop(deltas: torch.Tensor, carry: torch.Tensor) -> torch.Tensor:
    """``x[t] = deltas[t] + carry[t] * x[t + 1]`` backwards from ``x[T] = 0``, all ``[T, N]``: one step at a time."""
    sums = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + carry[t] * running
        sums[t] = running
    return sums


def discounted_sums_by_scan(deltas: torch.Tensor, carry: torch.Tensor) -> torch.Tensor:
    """What :func:`discounted_sums_by_loop` returns (up to float rounding), in ``ceil(log2 T)`` steps over all of time.

    Step ``t`` is the map ``x -> carry[t] * x + deltas[t]``; after the pass with ``span``, ``(factors[t], sums[t])``
    is the map of steps ``t .. t + 2 * span - 1`` composed (a Hillis-Steele scan). A ``carry`` of 0 (an episode's
    end) makes ``factors`` 0 exactly, so nothing after an episode's end reaches the steps before it.

    >>> deltas, carry = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[0.5], [0.0], [0.5]])
    >>> discounted_sums_by_scan(deltas, carry).flatten().tolist()
    [2.0, 2.0, 3.0]
    """
    sums, factors = deltas.clone(), carry.clone()
    span = 1
    while span < deltas.shape[0]:
        # (right sides are computed whole before they are written: each pass reads the previous one's values)
        sums[:-span] = sums[:-span] + factors[:-span] * sums[span:]
        factors[:-span] = factors[:-span] * factors[span:]
        span *= 2
    return sums


def discounted_sums(deltas: torch.Tensor, carry: torch.Tensor) -> torch.Tensor:
    """``x[t] = deltas[t] + carry[t] * x[t + 1]`` backwards from ``x[T] = 0``: by the loop on the CPU (the numbers
    runs there always had), by the scan elsewhere (a CUDA learner: a handful of kernels, not a few per step)."""
    if deltas.device.type == "cpu":
        return discounted_sums_by_loop(deltas, carry)
    return discounted_sums_by_scan(deltas, carry)


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, next_vals: torch.Tensor, done: torch.Tensor,
                gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(advantages, returns)``, both ``[T, N]``.

    ``done`` (terminated or truncated) stops the recursion: the next step belongs to
    another episode. ``next_vals`` already encodes how each step bootstraps.
    """
    deltas = rewards + gamma * next_vals - values
    carry = (gamma * lam) * (~done).to(values.dtype)
    advantages = discounted_sums(deltas, carry)
    return advantages, advantages + values


def vtrace(behaviour_log_probs: torch.Tensor, target_log_probs: torch.Tensor, rewards: torch.Tensor,
           values: torch.Tensor, next_vals: torch.Tensor, done: torch.Tensor, gamma: float,
           rho_bar: float = 1.0, c_bar: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(vs, pg_advantages)``, both ``[T, N]``.

    ``next_vals`` is how each step bootstraps (value of the next observation; of the final
    observation on truncation; 0 on termination, see :func:`next_values`), and
    ``done`` cuts the recursion between episodes. With ``rho_bar = c_bar = lam = 1`` and
    equal policies, ``vs`` is the n-step return to the end of the rollout.
    """
    rho = torch.exp(target_log_probs - behaviour_log_probs)
    clipped_rho = rho.clamp(max=rho_bar)
    cs = lam * rho.clamp(max=c_bar) * (~done).to(values.dtype)
    deltas = clipped_rho * (rewards + gamma * next_vals - values)
    vs = values + discounted_sums(deltas, gamma * cs)
    # the target for step t's Q estimate: v_s of the next step within the episode, else the bootstrap
    vs_next = torch.cat([vs[1:], next_vals[-1:]], dim=0)
    vs_next = torch.where(done, next_vals, vs_next)
    pg_advantages = clipped_rho * (rewards + gamma * vs_next - values)
    return vs, pg_advantages


def _bootstrap(model: ActorCritic, batch: TensorDictBase, values: torch.Tensor, last_obs: torch.Tensor):
    """Next-step values ``[T, N]``; truncated steps bootstrap from the value of their final observation."""
    trunc = batch["truncated"]
    final_values = torch.zeros_like(values)
    if trunc.any():  # one host sync per rollout, not per minibatch
        final_values[trunc] = model.value(batch["final_observations"][trunc])
    return next_values(values, model.value(last_obs), final_values, batch["terminated"], trunc)


def advantages_and_returns(model: ActorCritic, batch: TensorDictBase, last_obs: torch.Tensor, gamma: float,
                           lam: float, reward_scale: torch.Tensor | float = 1.0):
    """GAE on the device with the values the behaviour policy recorded."""
    with torch.no_grad():
        values = batch["values"]
        nxt = _bootstrap(model, batch, values, last_obs)
        done = batch["terminated"] | batch["truncated"]
        return compute_gae(batch["rewards"] * reward_scale, values, nxt, done, gamma, lam)


def vtrace_targets(model: ActorCritic, batch: TensorDictBase, last_obs: torch.Tensor, gamma: float,
                   rho_bar: float, c_bar: float, reward_scale: torch.Tensor | float = 1.0):
    """V-trace for a batch collected by an older policy version (IMPALA-style collection).

    Re-evaluates log-probs and values under the current model, and rewrites the batch's
    ``log_probs`` / ``values`` with them: the PPO ratio then starts at 1 for the current
    policy, while V-trace has already corrected the targets for the behaviour policy.
    Returns ``(advantages, returns)``.
    """
    with torch.no_grad():
        t, n = batch.batch_size
        logp, _, values = model.evaluate(batch["observations"].flatten(0, 1), batch["actions"].flatten(0, 1))
        logp, values = logp.reshape(t, n), values.reshape(t, n)
        nxt = _bootstrap(model, batch, values, last_obs)
        done = batch["terminated"] | batch["truncated"]
        vs, adv = vtrace(batch["log_probs"], logp, batch["rewards"] * reward_scale, values, nxt, done, gamma,
                         rho_bar, c_bar)
        batch["log_probs"].copy_(logp)  # the batch is a locked (consolidated) TensorDict: write in place
        batch["values"].copy_(values)
        return adv, vs
