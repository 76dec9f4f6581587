"""The PPO update on one ``[T, N]`` rollout that is already on the learner's device."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
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


STAT_NAMES = ("policy_loss", "value_loss", "entropy", "loss", "approx_kl", "clip_fraction")


def ppo_update(model: ActorCritic, optimizer: torch.optim.Optimizer, batch: TensorDictBase,
               advantages: torch.Tensor, returns: torch.Tensor, *, epochs: int, minibatch_size: int,
               clip_coef: float, clip_value: bool, ent_coef: float, vf_coef: float, max_grad_norm: float,
               norm_adv: bool, target_kl: float | None, generator: torch.Generator) -> dict[str, float]:
    """Clipped-surrogate PPO over ``epochs`` random permutations of the flattened batch.

    Each epoch shuffles every per-sample tensor once on the device; its minibatches are
    then contiguous slices (views, no copy). Each minibatch stores its log-ratios, and the
    approximate KL and clip fraction are computed from them once per epoch. Diagnostics
    stay on the device until the end (plus one KL read per epoch when ``target_kl`` is set).
    """
    flat = (batch["observations"].flatten(0, 1), batch["actions"].flatten(0, 1), batch["log_probs"].flatten(),
            batch["values"].flatten(), advantages.flatten(), returns.flatten())
    total, device = flat[0].shape[0], flat[0].device
    used = total - total % minibatch_size  # a remainder smaller than a minibatch waits for the next epoch
    params = [p for group in optimizer.param_groups for p in group["params"]]
    losses = torch.zeros(4, device=device)  # policy, value, entropy, total: summed over minibatches
    log_ratios = torch.empty(used, device=device)
    kl_sum, clip_sum = torch.zeros((), device=device), torch.zeros((), device=device)
    updates = epochs_run = 0
    for _ in range(epochs):
        perm = torch.randperm(total, device=device, generator=generator)
        shuffled = [x[perm] for x in flat]
        for start in range(0, used, minibatch_size):
            obs, act, old_logp, old_values, adv, ret = (x[start:start + minibatch_size] for x in shuffled)
            logp, entropy, value = model.evaluate(obs, act)
            log_ratio = logp - old_logp
            ratio = log_ratio.exp()
            if norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = -torch.min(adv * ratio, adv * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
            if clip_value:
                v_clipped = old_values + (value - old_values).clamp(-clip_coef, clip_coef)
                value_loss = 0.5 * torch.max((value - ret) ** 2, (v_clipped - ret) ** 2).mean()
            else:
                value_loss = 0.5 * F.mse_loss(value, ret)
            entropy_mean = entropy.mean()
            loss = policy_loss - ent_coef * entropy_mean + vf_coef * value_loss
            for p in params:  # zeroed in place (flat_parameters' gradient views stay attached), without
                if p.grad is not None:  # optimizer.zero_grad()'s per-call profiler bookkeeping
                    p.grad.zero_()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True)
            optimizer.step()
            with torch.no_grad():
                log_ratios[start:start + minibatch_size] = log_ratio
                losses += torch.stack([policy_loss, value_loss, entropy_mean, loss])
            updates += 1
        epochs_run += 1
        with torch.no_grad():
            ratio_m1 = log_ratios.exp() - 1
            epoch_kl = (ratio_m1 - log_ratios).mean()  # low-variance KL estimator, k3
            kl_sum += epoch_kl
            clip_sum += (ratio_m1.abs() > clip_coef).float().mean()
        if target_kl is not None and epoch_kl.item() > target_kl:
            break
    out = dict(zip(STAT_NAMES, [*(losses / max(updates, 1)).tolist(), (kl_sum / epochs_run).item(),
                                (clip_sum / epochs_run).item()]))
    if not all(math.isfinite(v) for v in out.values()):
        raise NonFiniteLossError(f"non-finite loss ({out})")
    with torch.no_grad():
        out["explained_variance"] = explained_variance(flat[3], flat[5]).item()
    out["epochs"] = epochs_run
    return out
