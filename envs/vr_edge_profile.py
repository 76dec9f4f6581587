"""VR-edge's profile (:class:`envs.profiles.EnvProfile`): what the trainer knows of ``VREdge-v0``.

Scored by reward per step; the streaming literature's heuristics as baselines (:data:`envs.baselines.BASELINES`),
the clairvoyant planner, the causal reference (``BeliefMPC``) and the certified upper bound (``envs.hindsight``) as
references, ``BeliefMPC`` (on ``fair_share``) as the distillation expert; held-out episodes on a trace set's test
split; cells of users. Loaded on first ask (:func:`envs.profiles.profile_of`).
"""

from __future__ import annotations

from typing import Any

from envs.profiles import Act, Conditions, EnvKwargs, EnvProfile, EnvSizes, Expert, Guard
from envs.traces import TRACE_ARGUMENTS, TraceNotFoundError, has_split_folders, trace_root
from envs.vr_edge_config import MEMORY_ARGUMENTS, VREdgeConfig, torch_env_refusal


def arguments() -> EnvKwargs:
    """Every argument of ``VREdge-v0`` and its default."""
    return VREdgeConfig().to_dict()


def check_arguments(env_kwargs: EnvKwargs, backend: str) -> None:
    """``ValueError`` with one line where ``env_kwargs`` are refused, with ``backend`` (``device``: the torch
    env's limits, before any trace is read), else every value (types, ranges, traces)."""
    if backend == "device" and (why := torch_env_refusal(**env_kwargs)):
        raise ValueError(f"--backend device: {why}")
    try:
        VREdgeConfig(**env_kwargs).read_traces()  # building a config reads no file: its traces, here
    except TraceNotFoundError as e:
        raise ValueError(f"--env-kwargs: {e} (traces that moved: --env-kwargs capacity_trace=NEW_DIR or "
                         "user_traces=NEW_DIR with --resume, --capacity-trace NEW_DIR with trainer.evaluate)") from None
    except ValueError as e:  # VR-edge names the argument and its rule
        raise ValueError(f"--env-kwargs: {e}") from None


def sizes(env_kwargs: EnvKwargs) -> EnvSizes:
    """What one env of ``env_kwargs`` holds, in bytes, from its arguments alone (nothing is built: its observation
    may be what does not fit)."""
    vr = VREdgeConfig(**env_kwargs)
    observation = 4 * vr.obs_dim  # float32
    return EnvSizes(observation, action=8 * vr.num_users, scores=vr.num_users * vr.num_levels,
                    own=vr.state_bytes + 2 * observation, scaled_by=MEMORY_ARGUMENTS)  # (+ its space's bounds)


def held_out_arguments(trained: EnvKwargs, given: str | EnvKwargs, split: str = "") -> EnvKwargs:
    """The env arguments to evaluate with: the run's own (``trained``) with ``given`` over them key by key
    (``trainer.evaluate --env-kwargs``; a text is ``--capacity-trace``'s set), the traces played on the files of
    ``split`` (``--trace-split``) or of a ``trace_split`` in ``given``, where either is given. Else a set that comes
    split (``train/``, ``test/``; a shipped set) is played on its test folder (and then a flat folder beside it, as
    ``user_traces``, on its hash-split test files: one split applies to both); a set given (``capacity_trace`` or
    ``user_traces`` in ``given``) on all its files; the run's own flat folders on their hash-split held-out
    (``test``) files, as every run trained on them was evaluated.

    >>> held_out_arguments({"num_users": 6, "capacity_trace": "trace.log"}, "")  # one file: all of it
    {'num_users': 6, 'capacity_trace': 'trace.log', 'trace_split': 'all'}
    >>> held_out_arguments({}, "pensieve")["trace_split"]  # a shipped set: its test folder
    'test'
    >>> held_out_arguments({"num_users": 6}, {"user_traces": "pensieve", "max_steps": 99})  # a synthetic run
    {'num_users': 6, 'user_traces': 'pensieve', 'max_steps': 99, 'trace_split': 'test'}
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as traces:  # the run's own folder: its held-out files
    ...     held_out_arguments({"capacity_trace": traces, "trace_split": "train"}, "")["trace_split"]
    'test'
    >>> with tempfile.TemporaryDirectory() as traces:  # a folder given: all of it
    ...     held_out_arguments({"capacity_trace": "t/", "trace_split": "train"}, traces)["trace_split"]
    'all'
    """
    given = ({"capacity_trace": given} if given else {}) if isinstance(given, str) else dict(given)
    kwargs = {**trained, **given}
    sets = [kwargs[k] for k in ("capacity_trace", "user_traces") if kwargs.get(k)]
    if sets and "trace_split" not in given:
        came_split = any(has_split_folders(s) for s in sets)  # its train files never played: test for all
        set_given = any(given.get(k) for k in ("capacity_trace", "user_traces"))
        own_folders = not set_given and all(trace_root(s).is_dir() for s in sets)
        kwargs["trace_split"] = split or ("test" if came_split or own_folders else "all")
    elif not sets and "trace_split" not in given and {"capacity_trace", "user_traces"} & given.keys():
        kwargs["trace_split"] = "auto"  # the run's traces given as none (capacity_trace=): the synthetic cell
    return kwargs


_TRACE_SETS = ("capacity_trace", "user_traces")
_SPLIT_PLAYED = {"test": "their test split, held out from training", "all": "all their files",
                 "train": "their train split (the files training plays)"}


def played_on(env_kwargs: EnvKwargs, given: EnvKwargs) -> tuple[EnvKwargs, str]:
    """An evaluation's arguments in words: those to list, and the trace sets it plays (``, capacity traces pensieve
    (the run's own), user traces ...: their test split, held out from training``; ``""`` on the synthetic cell).

    >>> played_on({"num_users": 4, "capacity_trace": "pensieve", "trace_split": "test"}, {})
    ({'num_users': 4}, ", capacity traces pensieve (the run's own): their test split, held out from training")
    """
    others = {k: v for k, v in env_kwargs.items() if k not in _TRACE_SETS + ("trace_split",)}
    played = {k: (env_kwargs[k], "" if k in given else " (the run's own)") for k in _TRACE_SETS if env_kwargs.get(k)}
    if not played:
        return others, ""
    if len(set(played.values())) == 1 and len(played) == 2:  # one set for both
        sets = ["capacity and user traces {}{}".format(*played["capacity_trace"])]
    else:
        sets = [f"{'capacity' if k == 'capacity_trace' else 'user'} traces {v}{whose}"
                for k, (v, whose) in played.items()]
    split = _SPLIT_PLAYED.get(env_kwargs.get("trace_split", ""), "")
    return others, f", {' and '.join(sets)}" + (f": {split}" if split else "")


def _baseline(name: str):
    def make(env_kwargs: EnvKwargs) -> Act:
        from envs.baselines import make_baseline
        return make_baseline(name, VREdgeConfig(**env_kwargs))
    return make


def _expert(env_kwargs: EnvKwargs, seed: int, device: str) -> Act:
    from envs.belief_mpc_torch import TorchBeliefMPC  # BeliefMPC's levels (bit for bit), its rollout on torch
    return TorchBeliefMPC(VREdgeConfig(**env_kwargs), seed=seed, device=device)


def _improving(env_kwargs: EnvKwargs, seed: int, act: Act, value: Act, gamma: float) -> Act:
    from envs.belief_mpc import ON_CRITIC, BeliefMPC, TerminalValue
    return BeliefMPC(VREdgeConfig(**env_kwargs), base=act, terminal_value=TerminalValue(value, gamma), seed=seed,
                     **ON_CRITIC)


def _expert_refusal(env_kwargs: EnvKwargs) -> str:
    from envs.belief import filter_refusal
    return filter_refusal(VREdgeConfig(**env_kwargs))


def _bound_refusal(env_kwargs: EnvKwargs) -> str:
    from envs.hindsight import bound_refusal
    return bound_refusal(VREdgeConfig(**env_kwargs))


def condition_bins(env_kwargs: EnvKwargs) -> list[tuple[str, EnvKwargs]]:
    """The bins of a ``condition_grid``, in the order of its weights (bin ``i * grid + j``: the ``i``-th log-uniform
    slice of ``capacity_scale``'s range, the ``j``-th slice of ``outage_prob``'s), each as the env arguments that
    draw its episodes alone (the grid off, both ranges narrowed to the bin); ``[]`` without a grid.

    >>> [name for name, _ in condition_bins({"capacity_scale": "0.25-4", "outage_prob": "0-0.1",
    ...                                      "condition_grid": 2})]
    ['scale 0.25-1, outage 0-0.05', 'scale 0.25-1, outage 0.05-0.1', 'scale 1-4, outage 0-0.05', 'scale 1-4, outage 0.05-0.1']
    """  # noqa: E501
    import math

    cfg = VREdgeConfig(**env_kwargs)
    k = cfg.condition_grid
    (low_s, high_s), (low_p, high_p) = cfg.scale_range, cfg.outage_range
    scales = [low_s * math.exp(i / k * math.log(high_s / low_s)) for i in range(k + 1)] if k else []
    outages = [low_p + j / k * (high_p - low_p) for j in range(k + 1)] if k else []
    return [(f"scale {scales[i]:.3g}-{scales[i + 1]:.3g}, outage {outages[j]:.3g}-{outages[j + 1]:.3g}",
             {**env_kwargs, "condition_grid": 0, "capacity_scale": f"{scales[i]!r}-{scales[i + 1]!r}",
              "outage_prob": f"{outages[j]!r}-{outages[j + 1]!r}"}) for i in range(k) for j in range(k)]


def _reweighed(state: dict[str, Any], weights: Any) -> dict[str, Any]:
    import numpy as np

    kept = np.asarray(state["condition_weights"])
    return {**state, "condition_weights": np.broadcast_to(np.asarray(weights, dtype=kept.dtype), kept.shape).copy()}


def _volatility_guard(act: Act, kwargs: EnvKwargs, threshold: float) -> Act:
    from envs.guard import VolatilityGuard
    return VolatilityGuard(act, VREdgeConfig(**kwargs), threshold)


def _baseline_names() -> tuple[str, ...]:
    from envs.baselines import BASELINES
    return tuple(BASELINES)


PROFILE = EnvProfile(
    score="reward_per_step", score_label="reward/step", curve="reward_per_step",
    baselines={name: _baseline(name) for name in _baseline_names()},
    # the first is played by default; BeliefMPC's filter refuses what the distillation expert refuses
    references={"clairvoyant": lambda kwargs: "", "belief": _expert_refusal, "bound": _bound_refusal},
    conditions=Conditions(condition_bins, _reweighed, baselines=("fair_share", "robust_mpc")),
    guards={"volatility": Guard(_volatility_guard, statistic="the share of rounds whose cell capacity jumped by more "
                                                              "than x1.42",
                                hedge="lowest in each episode's first 8 rounds and from the round the share passed "
                                      "the threshold")},
    expert=Expert("BeliefMPC", _expert, stateful=True, refusal=_expert_refusal,
                  pace="the default 8-user cell's 64 episodes of 300 steps: about 15 s on a quiet 2-core "
                       "AMD EPYC, and about 30 s more the first time (the labeller compiles, then is cached); "
                       "more users and a busy machine take longer",
                  improving=_improving, improving_name="BeliefMPC on the policy",  # (a bar's words: short)
                  improving_pace="its rollout ending on the policy's critic; the default 8-user cell's 64 episodes "
                                 "of 300 steps: about 10 min of one core of a 2-core AMD EPYC (the policy's forward "
                                 "passes in every rollout); more users take longer"),
    arguments=arguments, check_arguments=check_arguments,
    file_arguments=frozenset({"capacity_trace", "user_traces"}), trace_arguments=TRACE_ARGUMENTS,
    held_out=held_out_arguments, played_on=played_on, sizes=sizes,
    episode_steps=lambda kwargs: VREdgeConfig(**kwargs).max_steps,
    vector_env="envs.vector:VREdgeVectorEnv", torch_env="envs.vr_edge_torch:VREdgeTorchEnv", cells=True,
    abandonment="abandoned")
