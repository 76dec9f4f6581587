"""Top-level env factories, policies and process targets for the tests (picklable for worker processes)."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import checkpoints
import envs


def settings_file(name: str) -> str:
    """``tests/settings/<name>.toml``, for ``--config``: the settings a test sets that have no flag."""
    return str(Path(__file__).with_name("settings") / f"{name}.toml")


def replace_weights_in_place(path: Path) -> None:
    """Rewrite the checkpoint file ``path`` with other weights, under the same name (as a distillation round did
    before every change of weights was a new file)."""
    state = checkpoints.load(path)
    state["model"] = {k: v + 0.05 if v.is_floating_point() else v for k, v in state["model"].items()}
    checkpoints.save(path, state)


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def vr_edge(num_users: int = 3, max_steps: int = 40) -> gym.Env:
    return envs.SyntheticVREdgeEnv(num_users=num_users, max_steps=max_steps)


def vr_edge_batch(num_envs: int = 3, num_users: int = 3, max_steps: int = 40) -> gym.vector.VectorEnv:
    return envs.VREdgeVectorEnv(num_envs, num_users=num_users, max_steps=max_steps)


class FaultyCartPole(gym.Env):
    """CartPole with a fault after ``fail_at`` steps; subclasses say which fault in ``step``."""

    def __init__(self, fail_at: int = 5) -> None:
        self.inner = gym.make("CartPole-v1")
        self.observation_space, self.action_space = self.inner.observation_space, self.inner.action_space
        self.fail_at, self.steps = fail_at, 0

    def reset(self, *, seed=None, options=None):
        return self.inner.reset(seed=seed)


class ExplodingEnv(FaultyCartPole):
    """CartPole that raises on the ``fail_at``-th step."""

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("simulator exploded")
        return self.inner.step(action)


class SuicidalEnv(ExplodingEnv):
    """Kills its own process on the ``fail_at``-th step (a segfaulting simulator)."""

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at:
            os._exit(13)
        return self.inner.step(action)


class HangingEnv(FaultyCartPole):
    """CartPole whose ``fail_at``-th step never returns in a worker process (a hung simulator); in the
    process that started the others it steps normally (a hang there would hang the caller itself)."""

    def step(self, action):
        import multiprocessing
        import time
        self.steps += 1
        if self.steps >= self.fail_at and multiprocessing.parent_process() is not None:
            time.sleep(3600)
        return self.inner.step(action)


def hanging() -> gym.Env:
    return HangingEnv(fail_at=40)


def _stepping_a_collectors_own_share() -> bool:
    """Whether this process steps a collector's own envs (the trainer, or with --overlap its collecting process),
    not an async worker's."""
    import multiprocessing
    return not multiprocessing.current_process().name.startswith("env-worker-")


class StuckInPythonEnv(FaultyCartPole):
    """CartPole whose ``fail_at``-th step hangs for ``hang_s`` seconds in Python (``time.sleep``) in the process that
    steps a collector's own share of the envs (the async backend's ``main_share``); in an async worker it steps
    normally."""

    def __init__(self, fail_at: int = 5, hang_s: float = 3600.0) -> None:
        super().__init__(fail_at)
        self.hang_s = hang_s

    def step(self, action):
        import time
        self.steps += 1
        if self.steps == self.fail_at and _stepping_a_collectors_own_share():
            time.sleep(self.hang_s)
        return self.inner.step(action)


class StuckInCEnv(FaultyCartPole):
    """As :class:`StuckInPythonEnv`, but stuck inside C code that no interrupt ends, with the GIL released: a
    normal pthread mutex locked twice by one thread (Linux's glibc: a zeroed mutex is an unlocked one)."""

    def step(self, action):
        self.steps += 1
        if self.steps >= self.fail_at and _stepping_a_collectors_own_share():
            import ctypes
            libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)
            libc.pthread_mutex_lock(mutex)
            libc.pthread_mutex_lock(mutex)  # waits for itself, for ever; a signal's handler returns into the wait
        return self.inner.step(action)


class StuckInValidationEnv(FaultyCartPole):
    """CartPole whose steps hang for ``hang_s`` seconds (``time.sleep``) where the trainer's validation plays it
    (``--eval-every``), and step normally where the run collects with it."""

    def __init__(self, hang_s: float = 3600.0) -> None:
        super().__init__(fail_at=0)
        self.hang_s = hang_s

    def step(self, action):
        import sys
        import time
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name != "run_episodes":
            frame = frame.f_back
        if frame is not None:
            time.sleep(self.hang_s)
        return self.inner.step(action)


def stuck_in_python() -> gym.Env:
    """Hangs for 30 s at its 40th step: a collector that does not bound the hang fails a test, not hang it."""
    return StuckInPythonEnv(fail_at=40, hang_s=30.0)


class EnvironmentLogger(FaultyCartPole):
    """CartPole whose construction appends ``pid value`` of the environment variable ``name`` to ``log``."""

    def __init__(self, log: str, name: str) -> None:
        super().__init__()
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()} {os.environ.get(name)}\n")


def print_blocked_signals() -> None:
    """A process target: print the signals blocked as it starts."""
    import signal
    print("blocked", sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])), flush=True)


def exploding() -> gym.Env:
    return ExplodingEnv()


def suicidal() -> gym.Env:
    return SuicidalEnv()


def killed_while_built() -> gym.Env:
    """A factory whose process is killed (as by the out-of-memory killer) while it builds its env."""
    os.kill(os.getpid(), 9)
    raise AssertionError("unreachable")


def pendulum() -> gym.Env:
    return gym.make("Pendulum-v1")


class RandomPolicy:
    """Seeded stochastic policy returning action, log-prob and value for discrete or multi-discrete spaces."""

    def __init__(self, nvec, seed: int = 0) -> None:
        self.nvec = np.atleast_1d(nvec)
        self.multi = np.ndim(nvec) > 0
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        n = len(obs)
        u = torch.rand((n, len(self.nvec)), generator=self.gen)
        action = (u * torch.as_tensor(self.nvec)).long()
        if not self.multi:
            action = action[:, 0]
        return {"action": action, "log_prob": -u.sum(1), "value": obs.float().flatten(1).sum(1)}


class NaNRewardEnv(FaultyCartPole):
    """CartPole whose rewards turn NaN after ``fail_at`` steps (a broken simulator)."""

    def step(self, action):
        self.steps += 1
        obs, reward, term, trunc, info = self.inner.step(action)
        return obs, float("nan") if self.steps > self.fail_at else reward, term, trunc, info


if "NaNReward-v0" not in gym.registry:
    gym.register(id="NaNReward-v0", entry_point="tests.factories:NaNRewardEnv", kwargs={"fail_at": 150})
if "Exploding-v0" not in gym.registry:  # --env tests.factories:Exploding-v0: each env raises on its 40th step
    gym.register(id="Exploding-v0", entry_point="tests.factories:ExplodingEnv", kwargs={"fail_at": 40})
if "Hanging-v0" not in gym.registry:  # --env tests.factories:Hanging-v0 on the command line
    gym.register(id="Hanging-v0", entry_point="tests.factories:HangingEnv", kwargs={"fail_at": 40})
# each env's 40th step hangs in the trainer (or its collecting process); ids that sort after the others, which
# a test of the layout's error lists
if "StuckInPython-v0" not in gym.registry:
    gym.register(id="StuckInPython-v0", entry_point="tests.factories:StuckInPythonEnv", kwargs={"fail_at": 40})
if "StuckInC-v0" not in gym.registry:  # ... stuck inside C code, where no interrupt reaches it
    gym.register(id="StuckInC-v0", entry_point="tests.factories:StuckInCEnv", kwargs={"fail_at": 40})
if "StuckInValidation-v0" not in gym.registry:  # ... where validation plays it (an hour a step)
    gym.register(id="StuckInValidation-v0", entry_point="tests.factories:StuckInValidationEnv")



def env_whose_simulator_is_missing(**_kwargs) -> gym.Env:
    """What gymnasium's LunarLander does without Box2D: its import raises ``DependencyNotInstalled``."""
    raise gym.error.DependencyNotInstalled('Sim3D is not installed, you can install it by run `pip install '
                                           '"gymnasium[sim3d]"`')


if "NeedsSim3D-v0" not in gym.registry:  # --env tests.factories:NeedsSim3D-v0
    gym.register(id="NeedsSim3D-v0", entry_point="tests.factories:env_whose_simulator_is_missing")

class MaskedCellEnv(gym.Env):
    """A cell of ``num_users`` slots whose active users change (the observation contract of a variable cell): per
    slot 3 features and an active flag (index 3; an inactive slot's features all 0), then 2 cell features (the
    active share, a constant). A user earns 1 for the level its first feature points to. ``masked=False``: every
    slot always active and no ``active_user_feature`` declared (the flag is still there, always 1)."""

    F, C, LEVELS = 4, 2, 3

    def __init__(self, num_users: int = 5, masked: bool = True, max_steps: int = 20) -> None:
        self.num_users, self.masked, self.max_steps = num_users, masked, max_steps
        self.observation_space = gym.spaces.Box(0.0, 1.0, (num_users * self.F + self.C,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete([self.LEVELS] * num_users)
        self.head_observation_layout = (self.F, self.C)
        self.active_user_feature = 3 if masked else None

    def _observe(self) -> np.ndarray:
        users = np.zeros((self.num_users, self.F), np.float32)
        users[:, :3] = self.np_random.random((self.num_users, 3))
        users[:, 3] = 1.0
        users *= self.active[:, None]
        return np.concatenate([users.reshape(-1), [self.active.mean(), 0.5]]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.steps, self.active = 0, np.ones(self.num_users, np.float32)
        if self.masked:  # 1 to all users, in random slots
            count = self.np_random.integers(1, self.num_users + 1)
            self.active = (self.np_random.permutation(self.num_users) < count).astype(np.float32)
        self.obs = self._observe()
        return self.obs, {}

    def step(self, action):
        best = np.minimum((self.obs[:-self.C].reshape(self.num_users, self.F)[:, 0] * self.LEVELS).astype(int),
                          self.LEVELS - 1)
        reward = float(((np.asarray(action) == best) * self.active).sum() / self.active.sum())
        if self.masked:  # churn: a slot flips, at least one user stays
            flip = self.np_random.integers(self.num_users)
            if self.active[flip] == 0 or self.active.sum() > 1:
                self.active[flip] = 1.0 - self.active[flip]
        self.steps += 1
        self.obs = self._observe()
        return self.obs, reward, False, self.steps >= self.max_steps, {}


if "MaskedCell-v0" not in gym.registry:  # --env tests.factories:MaskedCell-v0
    gym.register(id="MaskedCell-v0", entry_point="tests.factories:MaskedCellEnv")


def greedy_policy(obs_space, act_space, seed: int = 0):
    """A picklable deterministic policy (argmax of a random-init actor-critic) with log-probs and values."""
    from trainer.ppo.model import ActorCritic

    class Greedy(ActorCritic):
        def forward(self, obs):
            action = self.act_deterministic(obs)
            log_prob, _, value = self.evaluate(obs, action)
            return {"action": action, "log_prob": log_prob, "value": value}

    return Greedy(obs_space, act_space, normalize_obs=False, seed=seed)


class TimedEnv(FaultyCartPole):
    """CartPole whose steps take ``step_s`` seconds of sleep; each step appends ``pid start end`` to ``log``."""

    def __init__(self, log: str, step_s: float) -> None:
        super().__init__()
        self.log, self.step_s = log, step_s

    def step(self, action):
        import time
        start = time.monotonic()
        time.sleep(self.step_s)
        with open(self.log, "a") as fh:
            fh.write(f"{os.getpid()} {start} {time.monotonic()}\n")
        return self.inner.step(action)


def keyed_policy(obs_space, act_space, seed: int = 0):
    """The trainer's actor-critic, which samples with keyed noise when the collector passes keys."""
    from trainer.ppo.model import ActorCritic
    return ActorCritic(obs_space, act_space, seed=seed)


def contend_for_lock(run_dir: str, trials: int, barrier, results) -> None:
    """Each trial: once the test has written a stale lock, try to take it at the same moment as the other
    contenders; report ``(trial, won)``; hold it until every contender has tried, then release it."""
    from checkpoints import RunDirLock, RunDirLockedError

    for trial in range(trials):
        barrier.wait()  # the stale lock is written
        lock = RunDirLock(run_dir)
        try:
            lock.acquire()
            won = True
        except RunDirLockedError:
            won = False
        results.put((trial, won))
        barrier.wait()  # every contender has tried while the winner holds the lock
        lock.release()
        barrier.wait()  # released: the test writes the next stale lock


class HostSyncs(TorchDispatchMode):
    """Counts, by op, what makes the host wait for a device while it is active: a tensor read as a Python number
    (``_local_scalar_dense``: ``.item()``, ``float()``), a shape that depends on values (``nonzero``), a truth
    value (``is_nonzero``), and copies between devices. On the CPU these cost nothing, but each would be a wait
    on a GPU: counting them here keeps a later change from adding one unseen."""

    SYNCS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero"}

    def __init__(self) -> None:
        super().__init__()
        self.count: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if name in self.SYNCS:
            self.count[name] += 1
        elif name == "aten::_to_copy" and isinstance(out, torch.Tensor) and args[0].device != out.device:
            self.count["copy across devices"] += 1
        elif name == "aten::copy_" and args[0].device != args[1].device:
            self.count["copy across devices"] += 1
        return out
