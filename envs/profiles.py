"""What a trainer needs to know of an env beyond its spaces, declared by the env and looked up by its id.

The trainer asks an env's :class:`EnvProfile` (its headline score, its baselines and expert, how its held-out
episodes are chosen, what one env holds in memory, whether it plays natively batched, whether it has cells of
users) and never branches on an env's id. An env registered without a profile gets :data:`GENERIC`: scored by
its return, no baselines, no expert, evaluated on its own arguments.

VR-edge's profile is :data:`envs.vr_edge_profile.PROFILE`, registered here by name so that it loads (with NumPy)
only when asked. An env of your own registers its profile beside its ``gymnasium.register``:

    >>> import gymnasium as gym
    >>> from envs.profiles import EnvProfile, profile_of, register_profile
    >>> gym.register(id="Steady-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    >>> register_profile("Steady-v0", EnvProfile(baselines={"left": lambda kwargs: lambda obs: obs[:, 0] * 0}))
    >>> list(profile_of("Steady-v0").baselines), profile_of("CartPole-v1").score
    (['left'], 'return')
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Act = Callable[[Any], Any]  # a batch of observations [n, *obs] -> a batch of actions [n, *action]
EnvKwargs = dict[str, Any]


@dataclass(frozen=True)
class Expert:
    """An env's distillation expert: ``make(env_kwargs, seed, device)`` builds one that acts on a batch of observations
(NumPy arrays in and out), computing on the torch ``device`` (the learner's) where it computes on torch at all.

    A ``stateful`` expert (a filter that follows each env's observations) sees every row of one natively batched
    env at every step, those whose episodes are over included; a stateless one sees only the rows playing. To label
    while a run trains (``dagger_labels``), a stateful one also offers ``observe(obs)`` (a step it need not label),
    ``state()`` and ``load_state(state)`` (what a checkpoint keeps of it).
    ``refusal(env_kwargs)`` says why it cannot serve those arguments (``""``: it can); ``pace``: how long it takes,
    measured, for the line a distillation starts with (``""``: not said).

    ``improving(env_kwargs, seed, act, value, gamma)``, where the env has one: an expert that improves on a trained
    policy ``act`` (batches of observations to actions), its critic ``value`` (observations to the discounted
    return, discount ``gamma``) valuing what its lookahead reaches (VR-edge: ``BeliefMPC``'s rollout on the policy
    ending on the critic), stateful as ``make``'s; approximate policy iteration's expert (``trainer.distill
    --expert rollout``), named ``improving_name``, its pace ``improving_pace``."""

    name: str
    make: Callable[[EnvKwargs, int, str], Act]
    stateful: bool = False
    pace: str = ""
    refusal: Callable[[EnvKwargs], str] = lambda kwargs: ""
    improving: Callable[[EnvKwargs, int, Act, Act, float], Act] | None = None
    improving_name: str = ""
    improving_pace: str = ""


@dataclass(frozen=True)
class Guard:
    """A guard ``trainer.evaluate --guard`` may play a policy through: ``make(act, env_kwargs, threshold)`` is a
    stateful act over every row of one natively batched env, with ``guarded`` (the rows it played, ``[B]`` bool)
    after each call and ``peak`` (the highest value its statistic took); with ``threshold=math.inf`` it never acts
    on its statistic, and its ``peak`` on a run's own training episodes is the threshold
    (:mod:`trainer.evaluation.guards`). ``statistic``: what the threshold is a threshold of; ``hedge``: what the
    guard plays and when (both in words, for the evaluation's line)."""

    make: Callable[[Act, EnvKwargs, float], Act]
    statistic: str = "its statistic"
    hedge: str = "where it acts"


@dataclass(frozen=True)
class Conditions:
    """The conditions an env draws its episodes under that a curriculum may reweigh (``trainer.curriculum``: more
    of the conditions where the best baseline beats the policy, as Genet does).

    ``bins(env_kwargs)``: each condition as ``(name, env_kwargs that play it alone)``, in the order of the weights
    (``[]``: these arguments have none to reweigh). ``reweighed(state, weights)``: one env's state (as its
    ``get_state()`` gives it, split per env) drawing its next episodes by ``weights`` (one per bin, >= 0, summing
    to 1). ``baselines``: the baselines (names in the profile's) the policy is measured against in each bin."""

    bins: Callable[[EnvKwargs], list[tuple[str, EnvKwargs]]]
    reweighed: Callable[[Any, Any], Any]
    baselines: tuple[str, ...]


@dataclass(frozen=True)
class EnvSizes:
    """What one env holds, in bytes, for the memory a run needs (``trainer.memory``).

    >>> EnvSizes(observation=244, action=64, scores=48, own=1033).per_env
    1225
    """

    observation: int  # one observation
    action: int  # one action, as the policy returns it
    scores: int  # the numbers a policy scores one env's actions with (float32 each): the actions of all its heads
    own: int = 0  # what the env holds itself (its state, its spaces' bounds), where it says
    scaled_by: tuple[str, ...] = ()  # the env's arguments that scale these: what to lower when it does not fit

    @property
    def per_env(self) -> int:
        """Bytes per env besides the rollout: the env's own and the policy's scores."""
        return self.own + 4 * self.scores


def _own_arguments(trained: EnvKwargs, given: EnvKwargs | str, split: str = "") -> EnvKwargs:
    return {**trained, **(given or {})}


@dataclass(frozen=True)
class EnvProfile:
    """What the trainer knows of an env (module docstring). Every field has the generic env's value by default.

    ``score``: the key of an episode's record (:func:`trainer.evaluation.episodes.run_episodes`) a policy is judged
    by (validation's best, the quality line, the paired comparisons), shown as ``score_label``; ``curve``: the
    training log's column learning curves show by default. ``baselines``: name -> ``make(env_kwargs)``, a
    heuristic that acts on a batch of observations. ``references``: the references
    ``trainer.evaluate --reference`` may play, name -> ``refusal(env_kwargs)``: why it cannot play that env's
    cells in one line (``""``: it can). ``expert``: what distillation labels with (:class:`Expert`).
    ``arguments()``: the env's constructor arguments and their defaults (``{}``: not known, not checked);
    ``check_arguments(env_kwargs, backend)`` raises ``ValueError`` with one line where they are refused.
    ``file_arguments``: the arguments that name files (made absolute, may move); ``trace_arguments``: those
    ``trainer.evaluate``'s trace flags set. ``held_out(trained, given, split)``: the arguments held-out episodes
    are played with (a trace set's test split); ``played_on(env_kwargs, given)``: the arguments an evaluation's
    header lists, and the files it replays in words (``""``: none). ``episode_steps(env_kwargs)``: the steps of a
    whole episode, where known (a bar's total). ``sizes(env_kwargs)``: :class:`EnvSizes` without building an env
    (``None``: measured from one built). ``vector_env`` and ``torch_env``: ``"module:Class"`` of its natively
    batched env (``Class(num_envs, **env_kwargs)``) and of its torch env (``--backend device``). ``cells``: whether
    it has cells of users (``trainer.evaluate --users``). ``abandonment``: the key of an episode's record that is 1
    where the episode lost its users (VR-edge: ``abandoned``), by which an evaluation says that a cell cannot be
    served (:mod:`trainer.evaluation.servable`; ``""``: the env has no such notion, and nothing is said).
    ``conditions``: what a curriculum may reweigh (:class:`Conditions`; ``None``: nothing). ``guards``: what
    ``trainer.evaluate --guard`` may play the policy through, name -> :class:`Guard`.
    """

    score: str = "return"
    score_label: str = "return"
    curve: str = "episode_return"
    baselines: Mapping[str, Callable[[EnvKwargs], Act]] = field(default_factory=dict)
    references: Mapping[str, Callable[[EnvKwargs], str]] = field(default_factory=dict)
    expert: Expert | None = None
    arguments: Callable[[], EnvKwargs] = dict
    check_arguments: Callable[[EnvKwargs, str], None] = lambda kwargs, backend: None
    file_arguments: frozenset[str] = frozenset()
    trace_arguments: frozenset[str] = frozenset()
    held_out: Callable[[EnvKwargs, Any, str], EnvKwargs] = _own_arguments
    played_on: Callable[[EnvKwargs, EnvKwargs], tuple[EnvKwargs, str]] = lambda kwargs, given: (kwargs, "")
    sizes: Callable[[EnvKwargs], EnvSizes] | None = None
    episode_steps: Callable[[EnvKwargs], int | None] = lambda kwargs: None
    vector_env: str = ""
    torch_env: str = ""
    cells: bool = False
    abandonment: str = ""
    conditions: Conditions | None = None
    guards: Mapping[str, Guard] = field(default_factory=dict)

    def vector_env_class(self) -> Callable[..., Any] | None:
        """The natively batched env's class (imported now), or ``None`` where the env has none."""
        return _loaded(self.vector_env)

    def torch_env_class(self) -> Callable[..., Any] | None:
        """The torch env's class (imported now: it loads torch), or ``None`` where the env has none."""
        return _loaded(self.torch_env)


GENERIC = EnvProfile()
_PROFILES: dict[str, EnvProfile | str] = {"VREdge-v0": "envs.vr_edge_profile"}  # a module's PROFILE, on first ask


def register_profile(env_id: str, profile: EnvProfile) -> None:
    """Declare ``env_id``'s profile (beside its ``gymnasium.register``); a second call replaces the first."""
    _PROFILES[env_id] = profile


def profile_of(env_id: str) -> EnvProfile:
    """``env_id``'s profile (``"module:Id"`` as ``gymnasium.make`` takes it), :data:`GENERIC` where it declared
    none."""
    module, _, name = env_id.rpartition(":")
    if module and name not in _PROFILES:  # the module registers the env, and its profile beside it
        try:
            importlib.import_module(module)
        except ImportError:  # (the env's own check says so, in one line: trainer.common.spaces.check_env_id)
            return GENERIC
    found = _PROFILES.get(name, GENERIC)
    if isinstance(found, str):
        found = _PROFILES[name] = importlib.import_module(found).PROFILE
    return found


def profiled_envs(declaring: str) -> list[str]:
    """The ids of the envs whose profile declares ``declaring`` (a field of :class:`EnvProfile`, e.g.
    ``"torch_env"``), for a message naming the alternatives.

    >>> profiled_envs("torch_env")
    ['VREdge-v0']
    """
    return [env for env in list(_PROFILES) if getattr(profile_of(env), declaring)]


def names_declared(field: str) -> list[str]:
    """Every name of ``field`` (``"baselines"`` or ``"references"``) some env's profile declares (a name no env has
    is a typo: a usage error before a checkpoint is read).

    >>> "fair_share" in names_declared("baselines"), names_declared("references")
    (True, ['clairvoyant', 'belief', 'bound'])
    """
    return list(dict.fromkeys(name for env in list(_PROFILES) for name in getattr(profile_of(env), field)))


def _loaded(entry_point: str) -> Callable[..., Any] | None:
    if not entry_point:
        return None
    module, _, name = entry_point.partition(":")
    return getattr(importlib.import_module(module), name)
