"""A trained policy from a checkpoint: the run's best or latest, built by the algorithm that trained it; and
:func:`load_policy` (``trainer.load_policy``), that policy ready to act on NumPy observations."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import nn

import checkpoints
from envs.settings import ConfigError
from trainer.common.spaces import check_env_id, model_spaces
from trainer.config import TrainConfig, format_env_kwargs, with_current_names
from trainer.evaluation.episodes import policy_actions
from trainer.registry import ALGORITHMS, algorithm_class, algorithm_spec

if TYPE_CHECKING:
    from envs.belief_mpc import TerminalValue


def make_model(cfg: TrainConfig) -> nn.Module:
    """The network ``cfg``'s algorithm learns (what a checkpoint's ``model`` holds), freshly built on the CPU."""
    return algorithm_class(cfg.algo).make_model(cfg)


def check_weights_fit(cfg: TrainConfig, weights: dict[str, torch.Tensor], source: Path) -> None:
    """Raise ``ValueError`` unless the network ``cfg`` describes has exactly the tensors of ``weights`` (a
    checkpoint's ``model``: names and shapes).

    The network is built on the ``meta`` device, which allocates no memory: a stored config that asks for
    ``hidden="60000,60000"`` next to 64-wide weights is refused before gigabytes are asked for.
    """
    algorithm_class(cfg.algo)  # imported out here: a module that makes tensors on import fails on meta
    with torch.device("meta"):
        wanted = {k: tuple(v.shape) for k, v in make_model(cfg).state_dict().items()}
    held = {k: tuple(v.shape) for k, v in weights.items()}
    if wanted == held:
        return
    differ = [k for k in wanted if k in held and wanted[k] != held[k]]
    detail = (f"{differ[0]} is {list(held[differ[0]])} in the file but {list(wanted[differ[0]])} here "
              f"({len(differ)} tensors differ)" if differ else
              f"missing {', '.join(sorted(wanted.keys() - held.keys())) or 'nothing'}, unexpected "
              f"{', '.join(sorted(held.keys() - wanted.keys())) or 'nothing'}")
    raise ValueError(f"{source}: its network does not fit {cfg.env} as this process builds it from the stored "
                     f"config (hidden={cfg.hidden!r}, policy_arch={cfg.policy_arch!r}): {detail}; different spaces "
                     "or env parameters, or a config edited or mixed from two runs?")


def check_same_spaces(trained: TrainConfig, played: TrainConfig, source: Path) -> None:
    """Raise ``ValueError`` where ``played``'s env arguments (a run's own, some replaced: ``trainer.evaluate
    --env-kwargs``) give observations of another shape, or other actions, than ``trained``'s, those of the run of
    ``source``: its policy acts on the spaces it was trained on. The trace arguments never change them (and a run's
    own traces may be gone): the spaces are compared without them."""
    from envs.traces import TRACE_ARGUMENTS

    def untraced(cfg: TrainConfig) -> dict[str, Any]:
        return {k: v for k, v in cfg.env_options.items() if k not in TRACE_ARGUMENTS}

    old, new = untraced(trained), untraced(played)
    changed = {k: v for k, v in new.items() if k not in old or old[k] != v}
    if not changed:
        return
    (obs, act, _), (obs2, act2, _) = (model_spaces(dataclasses.replace(c, env_kwargs=format_env_kwargs(options)))
                                      for c, options in ((trained, old), (played, new)))
    if obs.shape == obs2.shape and act == act2:
        return
    what = (f"observations of shape {list(obs2.shape)} where the policy takes {list(obs.shape)}"
            if obs.shape != obs2.shape else f"actions {act2} where the policy picks {act}")
    raise ValueError(f"{source}: {format_env_kwargs(changed)} in place of its own env arguments gives {what}: only "
                     "env arguments that keep the observation and action shapes may change (traces, capacities, "
                     "episode length, ...; other user counts for a set policy: trainer.evaluate --users)")


def sampling_refused(cfg: TrainConfig, source: Path) -> str | None:
    """Why the policy of ``source`` (trained as ``cfg`` says) cannot sample actions, or ``None`` where it can."""
    algorithm = algorithm_spec(cfg.algo)
    if algorithm.stochastic:
        return None
    return f"{source} holds {algorithm.model_name}, whose policy is greedy (it explored only while collecting)"


def critic_refusal(model: nn.Module, cfg: TrainConfig, source: Path) -> str | None:
    """Why the critic of ``source``'s ``model`` (trained as ``cfg`` says) cannot be a rollout's terminal value
    (:func:`critic_value`), or ``None`` where it can: a model without one (its algorithm declares none:
    Ape-X's Q-network), or one trained on scaled rewards (its values are in other units than the env's rewards)."""
    if not algorithm_spec(cfg.algo).critic:
        return f"{source} holds {algorithm_spec(cfg.algo).model_name}, which has no critic"
    if getattr(cfg.algo_settings, "scale_rewards", False):
        return f"{source} was trained with scale_rewards: its critic's values are of scaled rewards, not the env's"
    return None


def critic_value(model: nn.Module, cfg: TrainConfig) -> TerminalValue:
    """The critic of a trained ``model`` as :class:`envs.belief_mpc.BeliefMPC`'s terminal value: its estimate of the
    discounted return (``cfg.gamma``, the run's discount) of NumPy observations (:func:`critic_values`). Check
    :func:`critic_refusal` first."""
    from envs.belief_mpc import TerminalValue

    return TerminalValue(critic_values(model), gamma=cfg.gamma)


def critic_values(model: nn.Module) -> Callable[[np.ndarray], np.ndarray]:
    """``value(obs [N, obs]) -> [N]``: a trained ``model``'s critic on NumPy observations, float64, on one torch
    thread (as :func:`trainer.evaluation.episodes.policy_actions`, which it runs beside)."""
    from collectors.resources import torch_threads

    def value(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad(), torch_threads(1):
            return model.value(torch.from_numpy(np.asarray(obs, dtype=np.float32))).double().numpy()
    return value


class PickedCheckpoint(NamedTuple):
    """A checkpoint picked for a policy (:func:`picked_checkpoint`)."""

    source: Path  # its file
    state: dict[str, Any]  # what it holds, loaded
    label: str  # which it is, in words: "the best checkpoint (validation)", "the checkpoint file", ...


def trained_model(path: str | Path, pick: str = "latest", env_kwargs: dict[str, Any] | None = None,
                  ) -> tuple[nn.Module, TrainConfig, Path]:
    """The model, training config and checkpoint file of a checkpoint file, or of a run directory's ``pick``
    (:func:`picked_checkpoint`), on the CPU, frozen; ``env_kwargs`` replace the run's own env arguments (e.g. a
    trace directory that is elsewhere now). :func:`load_policy` wraps it, ready to act."""
    picked = picked_checkpoint(path, pick)
    model, cfg = policy_from_state(picked.state, picked.source, env_kwargs)
    return model, cfg, picked.source


class TrainedPolicy:
    """A trained policy, ready to act (:func:`load_policy`): ``policy(observation)`` returns its action.

    It takes NumPy observations as the env gives them, one (``[*obs]``) or a batch (``[n, *obs]``, as a
    Gymnasium ``SyncVectorEnv`` gives them), and returns NumPy actions as the env takes them: for one
    observation, one action (a scalar for ``Discrete``, ``[heads]`` for ``MultiDiscrete``, ``[dims]`` for
    ``Box``); for a batch, ``[n]``, ``[n, heads]`` or ``[n, dims]``. The run's observation normaliser is applied
    (it is part of the model); acting is on the CPU, without gradients: greedy, or sampled where
    ``stochastic``.

    Example: a CartPole run trained in a few seconds, then loaded and played (``run`` may be any run directory or
    checkpoint file)::

        >>> import tempfile, gymnasium as gym, numpy as np, trainer
        >>> from trainer.flags import parse_args
        >>> from trainer.loop import train
        >>> run = tempfile.mkdtemp()
        >>> _ = train(parse_args(["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--total-steps",
        ...                       "16", "--threads", "1", "--run-dir", run]).config, progress=False)
        >>> policy = trainer.load_policy(run)
        >>> observation, _ = gym.make(policy.config.env).reset(seed=0)
        >>> policy(observation).shape, policy(np.stack([observation] * 3)).shape  # one action; three
        ((), (3,))
        >>> import shutil; shutil.rmtree(run)  # (the example's run)

    Attributes: ``config`` (the run's ``TrainConfig``), ``source`` (the checkpoint file), ``observation_space``
    and ``action_space`` (the env's), ``model`` (the network, a ``torch.nn.Module``), ``stochastic``.
    """

    def __init__(self, model: nn.Module, config: TrainConfig, source: Path, stochastic: bool = False) -> None:
        self.model, self.config, self.source, self.stochastic = model, config, source, stochastic
        self.observation_space, self.action_space, _ = model_spaces(config)
        self._set = model.layout if model.layout.kind == "set" else None  # a set policy acts at any slot count
        self._act = policy_actions(model, deterministic=not stochastic)  # what trainer.evaluate plays

    def __call__(self, observation: np.ndarray) -> np.ndarray:
        """The action for one observation ``[*obs]``, or the actions ``[n, ...]`` for a batch ``[n, *obs]``; a set
        policy's observations may have any number of user slots (``[F * users + C]``), its actions ``[users]``."""
        observations = np.asarray(observation, dtype=self.observation_space.dtype)  # (the model's float32)
        shape = self.observation_space.shape
        if self._set is not None and observations.ndim in (1, 2) and observations.shape[-1] != shape[0] and \
                self._set.fits(observations.shape[-1]):
            shape = observations.shape[-1:]  # another slot count than training's
        if observations.shape == shape:
            return self._act(observations[None])[0]
        if observations.shape[1:] == shape:
            return self._act(observations)
        slots = (f" (a set policy: F * users + C = {self._set.features} * users + {self._set.shared} wide, for any "
                 "number of users >= 1)") if self._set is not None else ""
        raise ValueError(f"an observation of shape {list(observations.shape)}: {self.config.env}'s are "
                         f"{list(shape)}, one, or [n, {', '.join(map(str, shape))}] for a batch{slots}")


PICKS = ("best", "latest")  # which checkpoint of a run directory: load_policy(pick=), as trainer.evaluate --pick


def load_policy(path: str | Path, *, pick: str = "best", stochastic: bool = False) -> TrainedPolicy:
    """The policy of a checkpoint file or of a run directory, ready to act (:class:`TrainedPolicy`), as
    ``trainer.evaluate`` plays it: from a run directory, its ``best`` checkpoint (validation, ``--eval-every``), or
    its newest loadable one where it has none (or with ``pick="latest"``); what was skipped on the way is said on
    stderr. ``stochastic``: sample actions rather than act greedily (a ``ValueError`` for a policy that is greedy
    only, as Ape-X's is). A path with no checkpoint to load is a ``checkpoints.CheckpointError`` (a
    ``ValueError``) naming it."""
    if pick not in PICKS:
        raise ValueError(f"pick={pick!r}: use {' or '.join(map(repr, PICKS))}")
    picked = picked_checkpoint(path, pick, say_refused=True)
    model, cfg = policy_from_state(picked.state, picked.source)
    source = picked.source
    if stochastic and (refused := sampling_refused(cfg, source)):
        raise ValueError(f"stochastic=True: {refused}; pass stochastic=False")
    return TrainedPolicy(model, cfg, source, stochastic)


def picked_checkpoint(path: str | Path, pick: str = "latest", say_refused: bool = False) -> PickedCheckpoint:
    """A checkpoint file, or a run directory's ``pick``: ``best``, the checkpoint the ``best`` pointer names, else
    (no pointer, an unreadable one, one that leads out of the run, a file gone or that does not load: said in the
    label, and a pointer refused said on stderr too with ``say_refused``, where no label is shown; a best that does
    not load always) the newest loadable, as ``latest`` picks; ``CheckpointError`` when none loads."""
    if Path(path).is_file():  # that file, or what a run's pointer passed as the file stands for
        return _newest(path, "the checkpoint file")
    best, instead = checkpoints.best_or_why_not(path) if pick == "best" else (None, "")
    if best is not None:
        try:
            return PickedCheckpoint(best, checkpoints.load(best), "the best checkpoint (validation)")
        except checkpoints.CheckpointError as e:  # the newest that loads instead, as a resume takes
            print(f"skipped the best checkpoint: {e}", file=sys.stderr)
            instead = f"the best checkpoint, {best.name}, does not load"
    picked = _newest(path, "the latest checkpoint", said=best)
    # a pointer there, not followed ("": pick="latest", which asks for none; nothing was skipped)
    if say_refused and best is None and instead not in ("", checkpoints.NO_BEST):
        print(f"skipped {instead}", file=sys.stderr)
    return picked._replace(label=picked.label + (f" ({instead})" if pick == "best" else ""))


def _newest(path: str | Path, label: str, said: Path | None = None) -> PickedCheckpoint:
    """What ``checkpoints.latest_loadable`` takes from ``path``, labelled ``label`` unless it skipped something; what
    it skipped is said on stderr (but for ``said``'s problem, said already)."""
    source, state, problems = checkpoints.latest_loadable(path)
    for p in problems:
        if said is None or not p.startswith(str(said)):
            print(f"skipped {p}", file=sys.stderr)
    return PickedCheckpoint(source, state, "the newest checkpoint that loads" if problems else label)


def stored_config(state: dict[str, Any]) -> TrainConfig:
    """The training config a loaded checkpoint ``state`` holds, as the run trained (an older version's names read
    as today's), unvalidated."""
    return TrainConfig.from_dict(with_current_names(state["config"]), stored=True)


def policy_from_state(state: dict[str, Any], source: Path, env_kwargs: dict[str, Any] | None = None,
                      ) -> tuple[nn.Module, TrainConfig]:
    """The frozen CPU policy and training config of a loaded checkpoint ``state`` (read from ``source``), with
    ``env_kwargs`` over the run's env arguments."""
    cfg = stored = stored_config(state)
    if env_kwargs:
        cfg = dataclasses.replace(cfg, env_kwargs=format_env_kwargs({**cfg.env_options, **env_kwargs}))
    try:
        cfg.validate()
    except ValueError as e:
        whose = (f"with {format_env_kwargs(env_kwargs)} in place of its own env arguments" if env_kwargs and
                 getattr(e, "key", None) == "env_kwargs" else "its stored config is invalid")
        raise ValueError(f"{source}: {whose}: {e}") from None
    try:
        check_env_id(cfg.env)  # (imports the module of a module:id, as training did)
    except ConfigError as e:
        raise ValueError(f"{source} was trained on {cfg.env}, which this process cannot make: {e}") from None
    if cfg.algo not in ALGORITHMS:
        raise ValueError(f"{source} was trained with --algo {cfg.algo}, which is not registered in this process "
                         f"(trainer.registry has {', '.join(ALGORITHMS)})")
    if env_kwargs:
        check_same_spaces(stored, cfg, source)
    check_weights_fit(cfg, state["model"], source)
    model = make_model(cfg)
    model.load_state_dict(state["model"])
    return model.eval(), cfg
