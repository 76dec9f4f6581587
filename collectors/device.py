"""Collecting on the learner's device: :class:`DeviceCollector` (``backend="device"``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from collectors.base import Collector, Policy, check_env_fns, explicit_seeds
from collectors.collector import call_policy, check_policy_output
from collectors.env_group import (
    batched_env_states,
    build_env,
    checked_vector_state,
    close_envs,
    env_state_count,
)
from collectors.rollout import Rollout
from collectors.seeding import env_seeds, noise_keys


class DeviceCollector(Collector):
    """Collects ``[T, N]`` rollouts from an env written in torch, stepped on ``device`` next to the policy.

    Example:
        >>> import functools, torch, envs
        >>> from collectors import make_collector
        >>> policy = lambda obs: torch.zeros(len(obs), 8, dtype=torch.int64)
        >>> with make_collector([functools.partial(envs.VREdgeTorchEnv, 4)], policy, backend="device",
        ...                     num_steps=16, seed=0) as collector:
        ...     rollout = collector.collect()
        >>> rollout.batch.batch_size, rollout.batch["observations"].device, rollout.next_observations.shape
        (torch.Size([16, 4]), device(type='cpu'), torch.Size([4, 61]))

    ``collect()`` returns the same :class:`~collectors.rollout.Rollout` as :class:`~collectors.RolloutCollector`,
    and a state moves between the two (docs/collectors.md#the-device-backend).

    Args:
        env_fns: one zero-argument factory of a torch-batched env (a list of length one).
        policy: as for :class:`~collectors.RolloutCollector`; it is called on tensors on ``device``,
            so it should live there.
        num_steps: steps per rollout (``T``).
        seed: run seed (env ``i`` gets the i-th ``SeedSequence(seed).spawn`` seed), or one seed per env.
        device: where the env steps, the policy acts and the rollout is written.
        num_threads: torch intra-op threads while ``collect()`` runs (``None``: unchanged).
        compile_policy: ``True`` (or a ``torch.compile`` mode) calls the policy compiled, as one graph
            of fixed shapes (see :class:`~collectors.base.Collector`). The env's step is the env's
            to compile (``envs.VREdgeTorchEnv(compile=True)``).
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], policy: Policy, num_steps: int = 128,
                 seed: int | Sequence[int] = 0, device: str | torch.device = "cpu",
                 num_threads: int | None = None, compile_policy: bool | str = False) -> None:
        env_fns = check_env_fns(env_fns)
        super().__init__(policy, num_steps, device, num_threads, compile_policy)
        if len(env_fns) != 1:
            raise ValueError(f"backend='device' takes one env factory that builds all envs as one torch-batched env "
                             f"(e.g. functools.partial(envs.VREdgeTorchEnv, 64)), got {len(env_fns)} factories")
        explicit = explicit_seeds(seed)
        env = build_env(env_fns[0], 0)
        if not isinstance(env, gym.vector.VectorEnv) or not callable(getattr(env, "to", None)):
            close_envs([env])
            raise ValueError(f"backend='device' needs an env written in torch (a VectorEnv with .to(device), e.g. "
                             f"envs.VREdgeTorchEnv); env factory 0 built {type(env.unwrapped).__name__}, which has "
                             "none: use backend='sync'")
        self.env = env.to(self.device)
        self._closed = False
        try:
            self.num_envs = env.num_envs
            self.observation_space, self.action_space = env.single_observation_space, env.single_action_space
            if explicit is not None and len(explicit) != self.num_envs:
                raise ValueError(f"seed has {len(explicit)} entries for {self.num_envs} envs; pass one integer "
                                 "or one seed per env")
            self.seeds = explicit if explicit is not None else env_seeds(seed, self.num_envs)
            self._noise_keys = torch.tensor(noise_keys(self.seeds), dtype=torch.int64, device=self.device)
            self._steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
            self._obs, _ = self.env.reset(seed=self.seeds)
        except BaseException:
            self.close()
            raise
        self._episode_return = torch.zeros(self.num_envs, dtype=torch.float64, device=self.device)
        self._episode_length = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self._output: tuple | None = None  # (action shape, dtype, extras) of the first policy output

    # ------------------------------------------------------------------ collect
    def _act(self, obs: torch.Tensor, t: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        keys = (self._noise_keys, self._steps + t) if self._keyed else None
        action, extras = call_policy(self._acting_policy(), obs, keys)
        output = (tuple(action.shape), action.dtype, tuple(extras))
        if output != self._output:  # metadata only: no synchronisation
            check_policy_output(action, extras, self.num_envs, self.action_space)
            if self._output is not None:
                first = f"{self._output[1]} with {sorted(self._output[2])}"
                raise TypeError(f"policy output changed between steps: got {action.dtype} actions with "
                                f"{sorted(extras)}, the first step gave {first}")
            self._output = output
        return action, extras

    def _allocate(self, obs: torch.Tensor, action: torch.Tensor, extras: dict[str, torch.Tensor]) -> TensorDict:
        """A ``[T, N]`` batch on the device; every leaf is written at every step, so it starts empty."""
        t, n, dev = self.num_steps, self.num_envs, self.device
        batch = {
            "observations": torch.empty((t, *obs.shape), dtype=obs.dtype, device=dev),
            "actions": torch.empty((t, *action.shape), dtype=action.dtype, device=dev),
            "rewards": torch.empty((t, n), dtype=torch.float32, device=dev),
            "terminated": torch.empty((t, n), dtype=torch.bool, device=dev),
            "truncated": torch.empty((t, n), dtype=torch.bool, device=dev),
            "final_observations": torch.empty((t, *obs.shape), dtype=obs.dtype, device=dev),
            "final_observation_mask": torch.empty((t, n), dtype=torch.bool, device=dev),
            **{k: torch.empty((t, n), dtype=torch.float32, device=dev) for k in extras},
        }
        return TensorDict(batch, batch_size=[t, n], device=dev)

    def _collect(self) -> Rollout:
        obs, batch, ended = self._obs, None, None
        # no_grad, not inference_mode: the env's state and observations stay ordinary tensors, as reset and
        # set_state make them, so a compiled policy and env step see the same kind of input at every call
        with torch.no_grad():
            for t in range(self.num_steps):
                action, extras = self._act(obs, t)
                if batch is None:  # a new batch per rollout: the last one may still be in use by the learner
                    batch = self._allocate(obs, action, extras)
                batch["observations"][t] = obs
                batch["actions"][t] = action
                for k, v in extras.items():
                    batch[k][t] = v
                obs, reward, terminated, truncated, info = self.env.step(action)
                done = info["_final_obs"]
                batch["rewards"][t] = reward
                batch["terminated"][t] = terminated
                batch["truncated"][t] = truncated
                batch["final_observation_mask"][t] = done
                batch["final_observations"][t] = info["final_obs"]
                # the episode's return sums the stored float32 rewards in float64, as the other backends do
                self._episode_return += batch["rewards"][t]
                self._episode_length += 1
                metrics = info.get("final_info", {}).get("episode_metrics", {})
                if ended is None:
                    ended = {k: torch.empty((self.num_steps, self.num_envs), dtype=torch.float64, device=self.device)
                             for k in ("return", "length", *metrics)}
                ended["return"][t] = self._episode_return
                ended["length"][t] = self._episode_length
                for k, v in metrics.items():
                    ended[k][t] = v
                self._episode_return.masked_fill_(done, 0.0)
                self._episode_length.masked_fill_(done, 0)
        self._obs = obs
        self._steps += self.num_steps
        return Rollout(batch, obs, self._episodes(batch["final_observation_mask"], ended), self.policy_version,
                       slice(0, self.num_envs))

    @staticmethod
    def _episodes(mask: torch.Tensor, ended: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
        """The finished episodes in the order the other backends list them (step by step, env by env).

        One synchronisation and one device-to-host copy per rollout: indices, lengths, returns and
        metrics of the ended episodes travel as one float64 tensor (indices and lengths are exact
        in float64).
        """
        where = mask.nonzero()
        rows = torch.stack([where[:, 1].to(torch.float64), *(v[where[:, 0], where[:, 1]] for v in ended.values())],
                           dim=1).cpu().numpy()
        names = list(ended)
        return [{"env": int(r[0]), "return": float(r[1]), "length": int(r[2]),
                 **{k: float(x) for k, x in zip(names[2:], r[3:])}} for r in rows]

    # ------------------------------------------------------------------ state for exact resume
    def get_state(self) -> dict[str, Any]:
        """As :meth:`collectors.RolloutCollector.get_state` (on the CPU, by env index), so a state restores into
        either collector; the envs' states in the batched form (``collectors.env_group.EnvStates``): a few
        array copies, whatever the number of envs (a trainer snapshots this every iteration)."""
        return {"observations": self._obs.cpu().numpy().copy(),
                "episode_return": self._episode_return.cpu().numpy().copy(),
                "episode_length": self._episode_length.cpu().numpy().copy(),
                "steps": self._steps.cpu().numpy().copy(),
                "env_states": checked_vector_state(self.env, self.env.unwrapped.get_state())}  # (a copy: the env's)

    def set_state(self, state: dict[str, Any], reseed: int | None = None) -> bool:
        """Continue from :meth:`get_state` (this collector's or a ``RolloutCollector``'s, envs' states in either
        form); always exact."""
        obs = np.asarray(state["observations"])
        want = (self.num_envs, *self.observation_space.shape)
        if obs.shape != want or obs.dtype != self.observation_space.dtype:
            raise ValueError(f"collector state has observations {obs.shape} {obs.dtype}; this collector has "
                             f"{want} {self.observation_space.dtype} (different envs or num_envs?)")
        held = env_state_count(state["env_states"])
        batched = batched_env_states(state["env_states"]) if held == self.num_envs else None
        if batched is None:
            raise ValueError(f"collector state has {held} env states for {self.num_envs} envs, or some are "
                             "missing: the device backend restores every env exactly")
        steps = np.asarray(state.get("steps", np.zeros(self.num_envs, dtype=np.int64)))
        if steps.shape != (self.num_envs,):
            raise ValueError(f"collector state has step counters of shape {steps.shape} for {self.num_envs} envs")
        # copies: on the CPU the env would otherwise step in the caller's arrays (a checkpoint's, kept to save)
        self.env.unwrapped.set_state({k: np.array(v, copy=True) for k, v in batched.items()})
        for name, value, dtype in (("_obs", obs, None), ("_episode_return", state["episode_return"], torch.float64),
                                   ("_episode_length", state["episode_length"], torch.int64),
                                   ("_steps", steps, torch.int64)):
            setattr(self, name, torch.tensor(np.asarray(value), dtype=dtype, device=self.device))  # a copy
        return True

    def _close(self) -> None:
        close_envs([self.env])
