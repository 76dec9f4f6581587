"""What every collector shares: argument checks, the one entry point for weights, lifecycle."""

from __future__ import annotations

import inspect
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import torch

from collectors.resources import torch_threads
from collectors.rollout import Rollout
from collectors.seeding import env_seeds

Policy = Callable[[torch.Tensor], Any]


def check_env_fns(env_fns: Any) -> list[Callable[[], Any]]:
    """The factories as a list, or a clear error for a single env, an empty list or a non-callable."""
    if isinstance(env_fns, (gym.Env, gym.vector.VectorEnv)) or callable(env_fns):
        raise TypeError("env_fns must be a list of zero-argument env factories, not a single env or factory")
    env_fns = list(env_fns)
    if not env_fns:
        raise ValueError("env_fns is empty: pass at least one zero-argument env factory")
    for i, fn in enumerate(env_fns):
        if not callable(fn):
            raise TypeError(f"env_fns[{i}] is {type(fn).__name__}, not callable; pass factories "
                            "(e.g. functools.partial(gymnasium.make, 'CartPole-v1')), not env instances")
    return env_fns


def _check_positive_int(name: str, value: Any, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid: must be an integer >= 1"
                         + (", or None to leave it" if allow_none else ""))


def takes_noise_keys(policy: Policy) -> bool:
    """Whether ``policy`` declares the keyword parameters ``noise_keys`` and ``steps`` (``forward``'s, for a module)."""
    fn = policy.forward if isinstance(policy, torch.nn.Module) else policy
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: called with observations only
        return False
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return all(name in params and params[name].kind in named for name in ("noise_keys", "steps"))


def check_compile(compile_policy: bool | str) -> bool | str:
    """``compile_policy`` as given, or a clear error: ``False``, ``True`` or a ``torch.compile`` mode."""
    modes = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    if not isinstance(compile_policy, bool) and compile_policy not in modes:
        raise ValueError(f"compile_policy={compile_policy!r} is invalid: use False, True or a torch.compile mode "
                         f"({', '.join(modes)})")
    return compile_policy


def one_line(error: Exception) -> str:
    """``error`` in one line: its type and its first line that says something, past a header that only
    announces the cause (torch's ``backend='inductor' raised:``).

    >>> one_line(RuntimeError("backend='inductor' raised:\\nInvalidCxxCompiler: No working C++ compiler found"))
    'RuntimeError: InvalidCxxCompiler: No working C++ compiler found'
    """
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    line = next((x for x in lines if not x.endswith(":")), lines[0] if lines else "")
    return f"{type(error).__name__}: {line[:160]}"


def _first_call_explained(compiled: Policy) -> Policy:
    """``compiled``, whose first call (where torch.compile builds it) says what failed and how to go on."""
    built = False

    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal built
        if built:
            return compiled(*args, **kwargs)
        try:
            out = compiled(*args, **kwargs)
        except Exception as e:
            raise RuntimeError(f"compile_policy: torch.compile could not build the policy ({one_line(e)}); it needs "
                               "a C++ compiler and Python's headers on the CPU (Triton on CUDA) and a policy it can "
                               "trace as one graph; pass compile_policy=False to call it as it is") from e
        built = True
        return out

    return call


def _outputs_copied(graphed: Policy) -> Policy:
    """``graphed`` (CUDA graphs: ``torch.compile``'s ``"reduce-overhead"``), its outputs copied out of the graphs'
    memory pool, on the device.

    Why: the next call of a graphed function (the env's compiled step, the next policy call) may
    free and overwrite the outputs of the previous one while they are still in use (the env step
    reads the action; pytorch#152887, #160281): "accessing tensor output of CUDAGraphs that has been
    overwritten by a subsequent run".
    """
    def call(*args: Any, **kwargs: Any) -> Any:
        out = graphed(*args, **kwargs)
        return out.clone() if hasattr(out, "clone") else {k: v.clone() for k, v in out.items()}

    return call


class Collector(ABC):
    """The interface of every collector: ``collect() -> Rollout``, ``update_policy``, state, ``close``.

    Pick a class with :func:`collectors.make_collector`. ``policy_version`` counts the
    ``update_policy`` calls; each :class:`~collectors.rollout.Rollout` says which version
    collected it.

    With ``compile_policy`` (``True`` or a ``torch.compile`` mode), ``collect()`` calls the policy
    through ``torch.compile(policy, fullgraph=True, dynamic=False)``, compiled at its first call:
    weights loaded with ``update_policy(state_dict)`` are the compiled code's too (no recompile);
    a new policy callable is compiled anew.
    """

    num_envs: int
    observation_space: gym.Space
    action_space: gym.Space

    def __init__(self, policy: Policy, num_steps: int, device: str | torch.device, num_threads: int | None,
                 compile_policy: bool | str = False) -> None:
        _check_positive_int("num_steps", num_steps)
        _check_positive_int("num_threads", num_threads, allow_none=True)
        if not callable(policy):
            raise TypeError(f"policy must be callable (obs -> actions), got {type(policy).__name__}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available; use device='cpu'")
        self.compile_policy = check_compile(compile_policy)
        self._set_policy(policy)
        self.num_steps = num_steps
        self.num_threads = num_threads
        self.policy_version = 0
        self.seconds_collecting = 0.0  # wall clock inside collect(), summed: the trainer times its phases with it
        self._closed = True  # until a subclass has something to close

    def collect(self) -> Rollout:
        """Run the policy for ``num_steps`` steps; return the rollout on ``device``.

        A failed rollout closes the collector: no worker process or actor is left behind.
        """
        self._check_open()
        start = time.perf_counter()
        try:
            with torch_threads(self.num_threads):
                return self._collect()
        except BaseException:
            self.close()
            raise
        finally:
            self.seconds_collecting += time.perf_counter() - start

    @abstractmethod
    def _collect(self) -> Rollout:
        """One rollout (``collect()`` wraps it with the thread count and the clean-up on failure)."""

    @abstractmethod
    def get_state(self) -> dict[str, Any]:
        """What the next ``collect()`` continues from, one entry per env (see ``set_state``)."""

    @abstractmethod
    def set_state(self, state: dict[str, Any], reseed: int | None = None) -> bool:
        """Continue from :meth:`get_state`; ``True`` when every env was restored exactly."""

    @abstractmethod
    def _close(self) -> None:
        """Close the envs and stop the workers."""

    # ------------------------------------------------------------------ weights: the one way in
    def update_policy(self, policy_or_state_dict: Policy | Mapping[str, torch.Tensor]) -> None:
        """Swap the acting policy, or load a ``state_dict`` into it (between rollouts); bumps ``policy_version``.

        A ``state_dict`` may live on any device: it is copied into the collector's policy.
        """
        if isinstance(policy_or_state_dict, Mapping):
            if not isinstance(self.policy, torch.nn.Module):
                raise TypeError("update_policy got a state_dict, but the policy is not a torch.nn.Module; "
                                "pass a new policy callable instead")
            self.policy.load_state_dict(policy_or_state_dict)  # in place: a compiled policy reads the new weights
        elif callable(policy_or_state_dict):
            self._set_policy(policy_or_state_dict)
        else:
            raise TypeError(f"update_policy expects a policy callable or a state_dict, "
                            f"got {type(policy_or_state_dict).__name__}")
        self.policy_version += 1

    def _set_policy(self, policy: Policy) -> None:
        self.policy = policy
        self._keyed = takes_noise_keys(policy)  # a new callable may or may not take keys
        self._compiled: Policy | None = None

    def _acting_policy(self) -> Policy:
        """What ``collect()`` calls: the policy, or its compiled form (compiled once per policy)."""
        if not self.compile_policy:
            return self.policy
        if self._compiled is None:
            mode = None if self.compile_policy is True else self.compile_policy
            compiled = _first_call_explained(torch.compile(self.policy, fullgraph=True, dynamic=False, mode=mode))
            self._compiled = _outputs_copied(compiled) if mode == "reduce-overhead" else compiled
        return self._compiled

    # ------------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"collect() on a closed {type(self).__name__}")

    def close(self) -> None:
        """Close the envs and stop any worker processes (idempotent)."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_closed", True) is False:
            self.close()


def explicit_seeds(seed: int | Sequence[int]) -> list[int] | None:
    """The per-env seeds given explicitly, or ``None`` for one run seed (refused here if it is not one, before
    any env or worker starts)."""
    if isinstance(seed, int) or hasattr(seed, "__index__"):
        env_seeds(seed, 0)
        return None
    return [int(s) for s in seed]
