"""Distilling an expert into a trained policy: rounds of DAgger with ``BeliefMPC`` as the expert, each a new
checkpoint of the run (``python -m trainer.distill`` is its command line; a finished run asks for rounds through
:meth:`trainer.ppo.algorithm.PPO.after_training`).

The trained policy plays ``episodes`` episodes of its own cell (seeds of their own branch, disjoint from training,
validation and test: :func:`trainer.evaluation.episodes.distillation_seeds`); at every state it visits, the expert
(:func:`teacher`) says which levels it would play: the env's (:class:`envs.belief_mpc.BeliefMPC` on ``fair_share``,
its defaults; observations only), or with ``expert="rollout"`` the env's improving expert built on the policy as
the round finds it (``BeliefMPC``'s rollout on the policy, ending on its critic), which makes rounds approximate
policy iteration. The policy's actor is then fine-tuned toward those levels by cross-entropy (``epochs`` passes,
Adam at ``lr``: by default the expert's, :data:`FINE_TUNING`; the critic and the observation statistics untouched),
and the result is kept only where it scores no lower than before on the run's validation episodes (paired;
selection, never the test episodes).

A round kept is written as the run's next checkpoint (``ckpt_<iteration>_<round>.pt``: the same iteration and
counters, the distilled weights, the record of rounds ``distilled`` with this one last) through the run's one save
path, with its pointers: ``latest``, and ``best`` where the run validated (``--eval-every``) and the distilled policy
scores no lower than the best on its validation episodes. The checkpoint distilled stays as it was, the one before.

Why it pays: PPO's policy reaches 0.75-0.88 of the reference's lead over ``fair_share`` and the seeds differ
(``docs/ceiling.md``); the rollout's levels are a better target than the noisy policy gradient for the same states,
and the policy averages the rollout's scenario noise over many states.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import checkpoints
from collectors.resources import torch_threads
from collectors.stop_signals import stop_signals_held
from envs.profiles import Act, profile_of
from envs.settings import ConfigError, check_limits, setting
from trainer.arguments import counted
from trainer.evaluation.episodes import (
    distillation_seeds,
    episodes_counted,
    filter_episodes,
    policy_actions,
    run_episodes,
    validation_seeds,
)
from trainer.evaluation.statistics import paired_difference, summarize
from trainer.ppo.settings import PPOSettings

_BATCH = 64  # episodes labelled side by side: one batched env, one filter row each
REFERENCE_EXPERT = "reference"  # DistillSettings.expert: the env's expert (EnvProfile.expert.make)
ROLLOUT_EXPERT = "rollout"  # ... or its improving expert, on the policy distilled and its critic (Expert.improving)
EXPERTS = (REFERENCE_EXPERT, ROLLOUT_EXPERT)
# Each expert's fine-tuning, where DistillSettings leaves epochs and lr at 0, measured on validation episodes
# (docs/ceiling.md): the reference's levels are learnt in a few passes; the rollout's differ from the policy's own on
# about 11% of slots, in states the policy tells apart only after long training (3 epochs at 1e-4 lose 0.009 a step)
FINE_TUNING = {REFERENCE_EXPERT: {"epochs": 3, "lr": 1e-4}, ROLLOUT_EXPERT: {"epochs": 100, "lr": 3e-4}}
MOST_ROUNDS = 100  # distill_rounds: each a new checkpoint of the run (retention keeps the newest and the trained)


@dataclass(frozen=True)
class DistillSettings:
    """How a run's policy is distilled (``python -m trainer.distill``); defaults measured on validation episodes
    (``docs/ceiling.md``).

    >>> DistillSettings().episodes, DistillSettings().epochs, DistillSettings(expert="rollout").epochs
    (64, 3, 100)
    >>> DistillSettings(lr=-1)
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: --lr must be >= 0 and <= 1, got -1
    """

    episodes: int = setting(PPOSettings.distill_episodes, "episodes the policy plays and the expert labels (300 "
                            "states each on the default cell; on a 2-core CPU, labels and fine-tuning, about 0.5 s "
                            "each with the reference, 10 s with the rollout)", at_least=1, at_most=100_000)
    epochs: int = setting(0, "passes of the cross-entropy over the labelled states", at_least=0, at_most=100,
                          zero="the expert's: 3 for reference, 100 for rollout")
    lr: float = setting(0.0, "Adam learning rate of the fine-tuning", at_least=0, at_most=1,
                        zero="the expert's: 1e-4 for reference, 3e-4 for rollout")
    minibatch_size: int = setting(256, "labelled states per step", at_least=1)
    validation_episodes: int = setting(64, "validation episodes the policy is scored on before and after (the run's "
                                       "own validation seeds)", at_least=2, at_most=10_000)
    seed: int = setting(0, "seed of the labelled episodes, the shuffles and the expert's scenarios", at_least=0,
                        at_most=2**64 - 1)  # torch seeds the shuffles' generator with an unsigned 64-bit integer
    expert: str = setting(REFERENCE_EXPERT, "who labels: reference, the env's distillation expert (VR-edge: "
                          "BeliefMPC on fair_share, seconds); or rollout, the env's improving expert built on the "
                          "policy being distilled and its critic (VR-edge: BeliefMPC's rollout on the policy, "
                          "minutes): approximate policy iteration, each round improving on the round before",
                          choices=EXPERTS)

    def __post_init__(self) -> None:
        for f in fields(self):
            value, kind = getattr(self, f.name), f.type
            if kind == "str":
                if not isinstance(value, str):
                    raise ConfigError(f.name, value, "must be a word")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float) if kind == "float" else int):
                raise ConfigError(f.name, value, "must be a number" if kind == "float" else "must be an integer")
        check_limits(self)  # named as python -m trainer.distill's flags
        for name, value in FINE_TUNING[self.expert].items():  # 0: the expert's (a frozen dataclass: set once)
            if not getattr(self, name):
                object.__setattr__(self, name, value)


class RoundProgress:
    """A round's bar on standard error (:func:`trainer.common.progress.progress_bar`: in a pipe or a log, a line
    now and then; ``shown=False``: none): the expert's labels, a unit per state (most of a round's time), then each
    validation episode and each step of the fine-tuning (counted once the states are: :meth:`fine_tuning`), the
    phase named in front.

    Example:
        >>> progress = RoundProgress(DistillSettings(episodes=2, validation_episodes=4, epochs=3), 300, shown=False)
        >>> progress.bar.total  # 2 x 300 states, 2 x 4 validation episodes, 3 epochs (a step each, until counted)
        611
        >>> progress.fine_tuning(30); progress.bar.total  # 30 steps of fine-tuning
        638
    """

    def __init__(self, settings: DistillSettings, max_steps: int, shown: bool | None = None) -> None:
        from trainer.common.progress import progress_bar

        self.labels, self.steps = settings.episodes * max_steps, settings.epochs
        total = self.labels + 2 * settings.validation_episodes + self.steps
        self.bar = progress_bar(total, "distilling", shown,
                                bar_format="{desc}{percentage:3.0f}%|{bar}| {elapsed}<{remaining}")

    def phase(self, what: str) -> None:
        """The phase now under way, in a few words."""
        self.bar.set_description(f"distilling: {what}")

    def advance(self, units: int = 1) -> None:
        self.bar.update(units)

    def labelled(self) -> None:
        """The labels are done (episodes that ended early leave fewer states than the bar's share)."""
        self.bar.update(max(self.labels - self.bar.n, 0))

    def fine_tuning(self, steps: int) -> None:
        """The fine-tuning will take ``steps`` steps (:func:`fine_tuning_steps`): a unit each on the bar, which
        stood still for a minute at 99% when an epoch was a unit."""
        self.bar.total += steps - self.steps
        self.steps = steps
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _minibatch_starts(states: int, size: int) -> range:
    """Where each of an epoch's minibatches starts: whole minibatches of ``size`` (one, of all, where fewer)."""
    return range(0, max(states - size, 0) + 1, size)


def fine_tuning_steps(states: int, settings: DistillSettings) -> int:
    """The optimizer steps :func:`fine_tuned` takes on ``states`` labelled states.

    >>> fine_tuning_steps(1000, DistillSettings(epochs=3, minibatch_size=256))  # 3 minibatches of 256 an epoch
    9
    """
    return settings.epochs * len(_minibatch_starts(states, settings.minibatch_size))


class Labels(NamedTuple):
    """States the policy visited and the expert's levels there: ``observations [S, obs]``, ``levels [S, U]``."""

    observations: torch.Tensor
    levels: torch.Tensor


class Teacher(NamedTuple):
    """The expert a round labels with (:func:`teacher`): its ``name``, ``make(seed)`` a fresh one (each batch's),
    whether it is ``stateful`` (:class:`envs.profiles.Expert`) and its ``pace`` in words (``""``: not said)."""

    name: str
    make: Callable[[int], Act]
    stateful: bool
    pace: str


def teacher(model: nn.Module, env: str, env_kwargs: dict[str, Any], kind: str = REFERENCE_EXPERT,
            device: str | torch.device = "cpu", gamma: float = 1.0) -> Teacher:
    """Who labels a round of ``model`` (:attr:`DistillSettings.expert`): the env's expert
    (:data:`REFERENCE_EXPERT`: VR-edge's ``BeliefMPC`` on ``fair_share``, its rollout on torch tensors of
    ``device``), or its improving expert built on ``model`` as it is now (:data:`ROLLOUT_EXPERT`: VR-edge's
    ``BeliefMPC`` rollout on the greedy policy ending on its critic, of discount ``gamma``, the run's), so that each
    round's expert improves on the policy the round starts from: approximate policy iteration. Check
    :func:`distillation_refusal` first."""
    from trainer.evaluation.policies import critic_values

    expert = profile_of(env).expert
    if kind == REFERENCE_EXPERT:
        return Teacher(expert.name, lambda seed: expert.make(env_kwargs, seed, str(device)), expert.stateful,
                       expert.pace)
    base = copy.deepcopy(model).eval()  # the policy the round starts from: the fine-tuning moves the model only
    act, value = policy_actions(base, deterministic=True), critic_values(base)
    return Teacher(expert.improving_name, lambda seed: expert.improving(env_kwargs, seed, act, value, gamma),
                   expert.stateful, expert.improving_pace)


def expert_labels(model: nn.Module, env: str, env_kwargs: dict[str, Any], episodes: int, seed: int,
                  advance: Callable[[int], None] = lambda states: None, device: str | torch.device = "cpu",
                  expert: Teacher | None = None) -> Labels:
    """Every state of ``episodes`` episodes the greedy ``model`` plays in ``env`` (:func:`distillation_seeds`), each
    with the action ``expert`` (:func:`teacher`; by default the env's, VR-edge's ``BeliefMPC`` on ``fair_share``,
    which follows the same observations, its rollout on torch tensors of ``device``) would play there.

    Played ``_BATCH`` episodes at a time, each batch with a fresh expert; a stateful one (a filter, one row per
    env) sees one natively batched env's every row. ``advance(n)`` after each step's ``n`` states are labelled (a
    bar)."""
    expert = expert or teacher(model, env, env_kwargs, device=device)
    make = functools.partial(gym.make, env, **env_kwargs)
    act, seeds = policy_actions(model.eval(), deterministic=True), distillation_seeds(seed, episodes)
    observations: list[np.ndarray] = []
    actions: list[np.ndarray] = []
    for start in range(0, episodes, _BATCH):
        labeller, chunk = expert.make(seed), seeds[start:start + _BATCH]
        seen: list[np.ndarray] = []
        said: list[np.ndarray] = []

        def labelled(obs: np.ndarray, labeller: Act = labeller, seen: list = seen, said: list = said) -> np.ndarray:
            seen.append(obs.copy())
            said.append(np.asarray(labeller(obs)))
            advance(len(obs))
            return act(obs)

        if not expert.stateful:  # it sees the rows playing, each one a state of an episode
            run_episodes(labelled, make, len(chunk), 0, num_envs=len(chunk), seeds=chunk)
            observations.append(np.concatenate(seen))
            actions.append(np.concatenate(said))
            continue
        records = filter_episodes(labelled, make, len(chunk), 0, num_envs=len(chunk), seeds=chunk)
        # row i plays episode i alone (as many envs as episodes): its states are the first `length` (one that ended
        # early, all its users gone, plays on idle, unrecorded)
        live = np.arange(len(seen))[:, None] < np.array([int(r["length"]) for r in records])[None, :]  # [T, n]
        observations.append(np.stack(seen)[live])
        actions.append(np.stack(said)[live])
    return Labels(torch.as_tensor(np.concatenate(observations), dtype=torch.float32),
                  torch.as_tensor(np.concatenate(actions), dtype=torch.int64))


def fine_tuned(model: nn.Module, labels: Labels, settings: DistillSettings, max_grad_norm: float,
               step_done: Callable[[], None] = lambda: None, threads: int = 1) -> list[float]:
    """Fine-tune ``model``'s actor in place toward ``labels`` by cross-entropy (minus the log-probability of the
    expert's levels, :meth:`evaluate`'s, over the active users); returns each epoch's mean cross-entropy.

    Only the actor's parameters move: the loss does not reach the critic, and the observation statistics are
    buffers, not parameters. Deterministic: the shuffles come from ``settings.seed``. ``step_done()`` after each
    minibatch's step (a bar: :func:`fine_tuning_steps` of them). On ``threads`` torch threads: one by default, as
    its minibatches are small and a second thread that waits on another process costs far more than it gains
    (``benchmarks.fine_tuning``: 1.4x faster quiet, 3.8x slower beside one busy process, on a 2-core AMD EPYC)."""
    with torch_threads(threads):
        return _fine_tuned(model, labels, settings, max_grad_norm, step_done)


def _fine_tuned(model: nn.Module, labels: Labels, settings: DistillSettings, max_grad_norm: float,
                step_done: Callable[[], None]) -> list[float]:
    for p in model.parameters():
        p.requires_grad_(True)
    model.train()
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=settings.lr)
    generator = torch.Generator().manual_seed(settings.seed)
    n, size = len(labels.observations), settings.minibatch_size
    losses = []
    for _ in range(settings.epochs):
        order, total, steps = torch.randperm(n, generator=generator), 0.0, 0
        for first in _minibatch_starts(n, size):
            rows = order[first:first + size]
            log_prob = model.evaluate(labels.observations[rows], labels.levels[rows])[0]
            loss = -log_prob.mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
            step_done()
        losses.append(total / steps)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return losses


def validation_score(model: nn.Module, env: str, env_kwargs: dict[str, Any], run_seed: int, episodes: int
                     ) -> list[dict[str, float]]:
    """The greedy ``model``'s records on the run's first ``episodes`` validation episodes (the quality line's)."""
    make = functools.partial(gym.make, env, **env_kwargs)
    seeds = validation_seeds(run_seed, episodes)
    return run_episodes(policy_actions(model.eval(), deterministic=True), make, episodes, 0, seeds=seeds)


def distillation_refusal(env: str, env_kwargs: dict[str, Any]) -> str:
    """Why a run of ``env`` with ``env_kwargs`` cannot be distilled; ``""`` when it can."""
    if (expert := profile_of(env).expert) is None:
        return (f"trained on {env}, which has no expert to distil (VR-edge's synthetic cell has one; an env of your "
                "own declares its own in its profile: envs.profiles.EnvProfile.expert)")
    return expert.refusal(env_kwargs)


def distilled(model: nn.Module, env: str, env_kwargs: dict[str, Any], run_seed: int, settings: DistillSettings,
              max_grad_norm: float, progress: RoundProgress | None = None, device: str | torch.device = "cpu",
              gamma: float = 1.0, expert: Teacher | None = None) -> dict[str, Any]:
    """Distil into ``model`` in place (module docstring); returns what happened: ``states`` labelled, the
    ``agreement`` with the expert's levels before and after, each epoch's ``cross_entropy``, the validation
    ``difference`` (after - before, paired) and whether the distilled weights were ``kept`` (else ``model`` is as
    it was). ``progress``: a bar it moves (:class:`RoundProgress`; by default one on a terminal). ``device``: where
    the expert computes (the learner's: the same labels on any); ``gamma``: the run's discount (the rollout expert's
    critic's: :func:`teacher`); ``expert``: the one built already (by default :func:`teacher`'s for
    ``settings.expert``)."""
    profile = profile_of(env)
    expert = expert or teacher(model, env, env_kwargs, settings.expert, device, gamma)
    steps = profile.episode_steps(env_kwargs) or gym.spec(env).max_episode_steps or 1  # (a bar's total: a guess)
    progress = progress or RoundProgress(settings, steps)
    try:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        progress.phase(f"{expert.name} labels the states of {counted(settings.episodes, 'episode')}")
        labels = expert_labels(model, env, env_kwargs, settings.episodes, settings.seed, progress.advance, device,
                               expert)
        progress.labelled()
        progress.phase("validation before")
        with episodes_counted(progress.advance):
            scored = validation_score(model, env, env_kwargs, run_seed, settings.validation_episodes)
        agreed = [agreement(model, labels)]
        progress.phase(f"fine-tuning on {len(labels.observations):,} states")
        progress.fine_tuning(fine_tuning_steps(len(labels.observations), settings))
        losses = fine_tuned(model, labels, settings, max_grad_norm, progress.advance)
        agreed.append(agreement(model, labels))
        progress.phase("validation after")
        with episodes_counted(progress.advance):
            after = validation_score(model, env, env_kwargs, run_seed, settings.validation_episodes)
    finally:
        progress.close()
    difference = paired_difference(after, scored, profile.score)
    kept = difference["mean"] >= 0
    if not kept:
        model.load_state_dict(before)
    return {"expert": expert.name, "score_label": profile.score_label,
            "states": len(labels.observations), "episodes": settings.episodes, "agreement": agreed,
            "cross_entropy": losses, "difference": difference, "kept": kept,
            "validation_reward_per_step": summarize(after)["reward_per_step"],
            "settings": {f.name: getattr(settings, f.name) for f in fields(settings)}}


@torch.no_grad()
def agreement(model: nn.Module, labels: Labels) -> float:
    """The share of the slots' levels where the greedy ``model`` plays the expert's (an inactive slot: both 0)."""
    return float((model.act_deterministic(labels.observations) == labels.levels).double().mean())


# ---------------------------------------------------------------------------------------------- rounds on a run

# distillation takes about 2 minutes on 2 cores (docs/ceiling.md): a run shorter than this (a minute or so of
# training) is a test or a smoke run, not a policy to ship; it was measured on 3M-step runs
DISTILL_AFTER_STEPS = 1_000_000


def distilled_record(state: dict[str, Any], source: str | Path) -> list[dict[str, Any]]:
    """The rounds kept on a checkpoint's weights (its ``distilled``, oldest first; ``[]`` where none); a
    ``checkpoints.CheckpointError`` in one line, naming ``source``, where it is anything but a list of records (a
    file edited by hand)."""
    record = state.get("distilled", [])
    if not isinstance(record, list) or not all(isinstance(r, dict) for r in record):
        raise checkpoints.CheckpointError(f"{source}: its record of distillation rounds ('distilled') is a "
                                          f"{type(record).__name__}, not a list of rounds: the file was edited?")
    return record


def _set_aside_after(run_dir: str | Path, source: Path, iteration: int, revision: int) -> list[str]:
    """As a resume does: sets aside files newer than ``source`` (they do not load) and the remains of a save that
    never finished; returns the note saying what was set aside (none where nothing was)."""
    moved = checkpoints.set_aside_newer(run_dir, iteration, revision)
    checkpoints.remove_partial_saves(run_dir)
    aside = ", ".join(p.name for p in moved)
    return [f"newer than {source.name}, none loading, set aside as {aside}"] if moved else []


def distill_run(run_dir: str | Path, seed: int | None = None, saved: list[Path] | None = None,
                started: Callable[[str], None] = lambda line: None, **settings: Any) -> dict[str, Any]:
    """One round on the newest checkpoint of ``run_dir`` (module docstring) with :class:`DistillSettings`
    ``settings``; returns :func:`distilled`'s summary with the ``checkpoint`` the run now ends with (the round's, where
    kept) and ``notes`` (files set aside). ``seed`` (of the labelled episodes): by default the rounds the checkpoint
    has kept, so that each round labels episodes of its own. ``saved``: the round's checkpoint is appended to it the
    moment it is on disk with its pointers (a stop signal is held back until then, and may come at once after).
    ``started(line)``: what the round will do, once the run is known to be one it can distil.

    Holds the run directory's lock throughout (a training run there must not be writing). As a resume does, it sets
    aside files newer than the checkpoint it distils (they do not load) and the remains of a save that never
    finished. ``ValueError`` (``ConfigError``) where the run cannot be distilled, in one line."""
    from trainer.evaluation.policies import policy_from_state

    chosen = DistillSettings(**settings)  # bad settings: one line before the checkpoint is read
    with checkpoints.RunDirLock(run_dir):
        source, state, _ = checkpoints.latest_loadable(run_dir)
        record = distilled_record(state, source)
        chosen = dataclasses.replace(chosen, seed=len(record) if seed is None else seed)
        model, cfg = policy_from_state(state, source)
        _check_distillable(run_dir, cfg, model, source, chosen.expert)
        iteration, revision = int(state["iteration"]), checkpoints.revision_of(source)
        notes = _set_aside_after(run_dir, source, iteration, revision)
        validation = counted(chosen.validation_episodes, "validation episode")
        device = expert_device(cfg.device)
        expert = teacher(model, cfg.env, cfg.env_options, chosen.expert, device, cfg.gamma)
        pace = f" ({expert.pace})" if expert.pace else ""
        started(f"{expert.name} labels the states of {counted(chosen.episodes, 'episode')} that {source.name}'s "
                f"policy plays{pace}, the actor is fine-tuned toward its actions, and kept where it scores no lower "
                f"on {validation}")
        summary = distilled(model, cfg.env, cfg.env_options, cfg.seed, chosen, cfg.max_grad_norm, device=device,
                            expert=expert)
        if summary["kept"]:
            weights = {k: v.clone() for k, v in model.state_dict().items()}
            state = {**state, "model": weights, "distilled": [*record, _stored(summary, source)]}
            if "acting_model" in state:  # --overlap: the policy that acts next is the distilled one
                state["acting_model"] = weights
            best = _validated_against_best(cfg, run_dir, iteration, model)
            with stop_signals_held():  # the file and its pointers are one step: a stop waits for the whole
                # however many rounds, retention keeps the weights training left, which the first round came from
                trained = record[0].get("from", source.name) if record else source.name  # (no "from": in place)
                source = checkpoints.save_in_run_dir(run_dir, state, iteration, cfg.keep_checkpoints, revision + 1,
                                                     spared=(str(trained),))
                if best is not None:
                    best.saved(source)
                if saved is not None:
                    saved.append(source)
    return {**summary, "checkpoint": source, "notes": notes}


def distill_rounds(run_dir: str | Path, rounds: int = 1, seed: int | None = None, saved: list[Path] | None = None,
                   started: Callable[[str], None] = lambda line: None,
                   ended: Callable[[dict[str, Any]], None] = lambda summary: None, **settings: Any
                   ) -> list[dict[str, Any]]:
    """Up to ``rounds`` rounds (:func:`distill_run`) on ``run_dir``, one after another, each on the policy the one
    before kept; the first not kept is the last. With ``expert="rollout"`` this is approximate policy iteration
    (each round's expert the rollout on the policy it starts from). ``seed``: the first round's (later rounds: the
    rounds kept, as by default); ``started(line)`` as each starts (``"round r of n: "`` in front where ``rounds >
    1``), ``ended(summary)`` as each ends; returns their summaries.

    >>> distill_rounds("run", rounds=0)
    Traceback (most recent call last):
    ...
    envs.settings.ConfigError: --rounds must be >= 1 and <= 100, got 0
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MOST_ROUNDS:
        raise ConfigError("rounds", rounds, f"must be >= 1 and <= {MOST_ROUNDS}")
    summaries: list[dict[str, Any]] = []
    for r in range(rounds):
        which = f"round {r + 1} of {rounds}: " if rounds > 1 else ""
        summary = distill_run(run_dir, seed=seed if r == 0 else None, saved=saved, **settings,
                              started=lambda line, which=which: started(which + line))
        summaries.append(summary)
        ended(summary)
        if not summary["kept"]:
            break
    return summaries


def _check_distillable(run_dir: str | Path, cfg: Any, model: nn.Module, source: Path, kind: str) -> None:
    """``ConfigError`` in one line where the run of config ``cfg`` cannot be distilled with the expert ``kind``: not
    PPO, or its env refuses; for the rollout expert, an env that declares none or a critic that cannot value its
    lookahead (:func:`trainer.evaluation.policies.critic_refusal`)."""
    from trainer.evaluation.policies import critic_refusal

    if cfg.algo != "ppo":
        raise ConfigError("run", str(run_dir), message=f"{run_dir}: an --algo {cfg.algo} run; distillation "
                          "fine-tunes a PPO policy's actor")
    if why := distillation_refusal(cfg.env, cfg.env_options):
        raise ConfigError("run", str(run_dir), message=f"{run_dir}: {why}")
    if kind != ROLLOUT_EXPERT:
        return
    if profile_of(cfg.env).expert.improving is None:
        raise ConfigError("expert", kind, message=f"--expert {kind}: {cfg.env} declares no improving expert "
                          "(envs.profiles.Expert.improving); use --expert reference")
    if why := critic_refusal(model, cfg, source):
        raise ConfigError("expert", kind, message=f"--expert {kind} ends the rollout on the policy's critic, but "
                          f"{why}; use --expert reference")


def expert_device(name: str) -> torch.device:
    """Where the expert labels for a run of ``--device name``: the learner's device on this machine (a run trained
    on a GPU and distilled where there is none: the CPU, the same labels).

    >>> expert_device("cpu")
    device(type='cpu')
    """
    from trainer.common.devices import resolve_device

    try:
        return resolve_device(name)
    except ConfigError:
        return torch.device("cpu")


def _validated_against_best(cfg: Any, run_dir: str | Path, iteration: int, model: nn.Module) -> Any:
    """Where the run has a ``best`` checkpoint (it validated, ``--eval-every``): a ``Validator`` that has played
    ``model`` on the run's validation episodes (the best's own) and knows whether it scores no lower than the best
    (its ``saved`` then moves the pointer); ``None`` otherwise."""
    if checkpoints.best_info(run_dir) is None:
        return None
    from trainer.evaluation.validation import Validator

    validator = Validator(dataclasses.replace(cfg, eval_every=1), run_dir, iteration)
    validator.evaluate(iteration, model)
    return validator


def _stored(summary: dict[str, Any], source: Path) -> dict[str, Any]:
    """What a checkpoint keeps of a distillation round: plain numbers and lists, and the file it started from."""
    d = summary["difference"]
    return {"from": source.name, "states": summary["states"], "agreement": summary["agreement"],
            "cross_entropy": summary["cross_entropy"], "validation_difference": float(d["mean"]),
            "validation_ci95": float(d["ci95"]),
            "validation_reward_per_step": float(summary["validation_reward_per_step"]),
            "settings": summary["settings"]}


def summary_line(summary: dict[str, Any]) -> str:
    """A round's outcome in words, one line: what was labelled, and whether it was kept and why."""
    d, (agree_before, agree_after) = summary["difference"], summary["agreement"]
    on = counted(d["episodes"], "validation episode")
    change = f"{d['mean']:+.4f} ± {d['ci95']:.4f} {summary['score_label']} (95% CI) on {on}, after minus before"
    episodes = counted(summary["episodes"], "episode")
    what = (f"{summary['expert']}'s actions on {summary['states']:,} states of {episodes}; "
            f"agreement {agree_before:.2f} -> {agree_after:.2f}")
    if summary["kept"]:
        return f"{what}; kept as {Path(summary['checkpoint']).name}: it scores no lower, {change}"
    return (f"{what}; not kept, it scores lower ({change}): nothing written, the run ends with "
            f"{Path(summary['checkpoint']).name}")


def rounds_asked(config: dict[str, Any]) -> tuple[int, int]:
    """``(episodes, rounds)`` to distil a finished run with, from its stored ``config``: its ``distill_episodes``
    and ``distill_rounds`` where it is a PPO run of at least :data:`DISTILL_AFTER_STEPS` env steps on a VR-edge cell
    the expert can play; else ``(0, 0)``."""
    if config.get("algo") != "ppo" or int(config.get("total_steps", 0)) < DISTILL_AFTER_STEPS:
        return 0, 0
    from trainer.config import TrainConfig, with_current_names

    env_options = TrainConfig.from_dict(with_current_names(config), stored=True).env_options
    episodes = int(config.get("distill_episodes", 0))
    if not episodes or distillation_refusal(str(config.get("env")), env_options):
        return 0, 0
    return episodes, int(config.get("distill_rounds", 1))


def rounds_after_training(run_dir: Path, config: dict[str, Any], say: Callable[[str, str], None]) -> None:
    """The rounds a finished run asks for (:func:`rounds_asked`, from its ``config``), round ``r`` labelling the
    episodes of seed ``r``; ``say("distilled", line)`` for each as it ends. From the first moment a stop signal skips
    what is left, and an error is said in a line: the run is saved either way, with the rounds written, and the line
    names what is on disk."""
    from trainer.arguments import command
    from trainer.interrupts import Skipped, skippable
    from trainer.loop import error_text

    episodes, rounds = rounds_asked(config)
    if not episodes:  # (a run it does not distil says nothing but why a run that asked was not, whatever signal)
        if short := _too_short(config, run_dir):
            say("distilled", short)
        return
    saved: list[Path] = []
    try:
        with skippable():
            for r in range(rounds):
                which = f"round {r + 1} of {rounds}: " if rounds > 1 else ""
                said = summary_line(distill_run(run_dir, seed=r, saved=saved, episodes=episodes,
                                                started=lambda line, which=which: say("distilling", which + line)))
                say("distilled", which + said)
        return
    except Skipped as e:
        ended = f"stopped ({e})"
    except Exception as e:  # an env that fails, a cell the expert cannot play: the run is saved all the same
        ended = f"failed: {error_text(e)}"
    on_disk = f"{saved[-1].name} holds the rounds done" if saved else "nothing was written"
    say("distilled", f"{ended}; {on_disk}; {command('-m', 'trainer.distill', str(run_dir))} does a round")


def _too_short(config: dict[str, Any], run_dir: Path) -> str:
    """Why a run whose ``config`` asks for distillation rounds was not distilled, where only its length kept it from
    them (a shortened recipe: its policy is then PPO's alone); else ``""``."""
    total = int(config.get("total_steps", 0))
    if total >= DISTILL_AFTER_STEPS or not rounds_asked({**config, "total_steps": DISTILL_AFTER_STEPS})[0]:
        return ""
    from trainer.arguments import command

    rounds = counted(int(config.get("distill_rounds", 1)), "round")
    # the rule reads --total-steps as asked (the run rounds it down to whole iterations): the line quotes it so
    return (f"not done: --total-steps {total:,}, and the {rounds} asked follow runs of {DISTILL_AFTER_STEPS:,}+ "
            f"(shorter ones are tests); {command('-m', 'trainer.distill', str(run_dir))} does one now")
