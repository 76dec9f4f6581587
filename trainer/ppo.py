"""The PPO update on one ``[T, N]`` rollout that is already on the learner's device."""

from __future__ import annotations

import math

import torch
from tensordict import TensorDictBase

from trainer.gae import compute_gae, next_values
from trainer.model import ActorCritic
from trainer.vtrace import vtrace


class NonFiniteLossError(RuntimeError):
    """A loss became NaN or inf; the model keeps its last good weights."""


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


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    var = target.var()
    return torch.where(var > 0, 1 - (target - pred).var() / var, torch.zeros_like(var))


def ppo_update(model: ActorCritic, optimizer: torch.optim.Optimizer, batch: TensorDictBase,
               advantages: torch.Tensor, returns: torch.Tensor, *, epochs: int, minibatch_size: int,
               clip_coef: float, clip_value: bool, ent_coef: float, vf_coef: float, max_grad_norm: float,
               norm_adv: bool, target_kl: float | None, generator: torch.Generator) -> dict[str, float]:
    """Clipped-surrogate PPO over ``epochs`` random permutations of the flattened batch.

    Minibatches are index slices on the device; diagnostics accumulate as tensors and
    are read once at the end (plus one KL read per epoch when ``target_kl`` is set).
    """
    obs = batch["observations"].flatten(0, 1)
    act = batch["actions"].flatten(0, 1)
    old_logp = batch["log_probs"].flatten()
    old_values = batch["values"].flatten()
    adv_all, ret_all = advantages.flatten(), returns.flatten()
    total = obs.shape[0]
    stats = {k: torch.zeros((), device=obs.device) for k in
             ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "loss")}
    updates = 0
    for _epoch in range(epochs):
        perm = torch.randperm(total, device=obs.device, generator=generator)
        epoch_kl = torch.zeros((), device=obs.device)
        for start in range(0, total - minibatch_size + 1, minibatch_size):
            idx = perm[start:start + minibatch_size]
            logp, entropy, value = model.evaluate(obs[idx], act[idx])
            log_ratio = logp - old_logp[idx]
            ratio = log_ratio.exp()
            adv = adv_all[idx]
            if norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
            if clip_value:
                v_clipped = old_values[idx] + (value - old_values[idx]).clamp(-clip_coef, clip_coef)
                value_loss = 0.5 * torch.max((value - ret_all[idx]) ** 2, (v_clipped - ret_all[idx]) ** 2).mean()
            else:
                value_loss = 0.5 * ((value - ret_all[idx]) ** 2).mean()
            entropy_mean = entropy.mean()
            loss = policy_loss - ent_coef * entropy_mean + vf_coef * value_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            with torch.no_grad():
                kl = ((ratio - 1) - log_ratio).mean()  # low-variance KL estimator
                epoch_kl += kl
                for k, v in (("policy_loss", policy_loss), ("value_loss", value_loss), ("entropy", entropy_mean),
                             ("approx_kl", kl), ("clip_fraction", ((ratio - 1).abs() > clip_coef).float().mean()),
                             ("loss", loss)):
                    stats[k] += v.detach()
            updates += 1
        if target_kl is not None and (epoch_kl / (total // minibatch_size)).item() > target_kl:
            break
    out = {k: (v / max(updates, 1)).item() for k, v in stats.items()}
    if not all(math.isfinite(v) for v in out.values()):
        raise NonFiniteLossError(f"non-finite loss ({out})")
    with torch.no_grad():
        out["explained_variance"] = explained_variance(batch["values"].flatten(), ret_all).item()
    out["epochs"] = _epoch + 1
    return out
