"""A PPO policy as one self-contained file (TorchScript and/or ONNX), verified against the trained model; its
command line is ``python -m trainer.export``.

Writes ``policy.pt`` (TorchScript, ``torch.jit.load``) and/or ``policy.onnx`` (ONNX opset
``OPSET``, dynamic batch axis; needs the ``export`` extra) and the card ``policy.json``. Each file
maps raw float32 observations ``obs [B, obs_dim]`` to ``action`` (greedy), ``probs [B, heads, max
actions]`` and ``value [B]``, with the frozen observation normaliser inside. Before anything is
written, each file is reloaded from disk and run next to the trained model on observations from
held-out seeds and at the bounds of the observation space; the export fails unless the greedy
actions are identical and the probabilities agree within ``atol``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import checkpoints
import envs.vr_edge  # noqa: F401  (registers VREdge-v0)
from trainer import __version__
from trainer.config import TrainConfig
from trainer.evaluation.episodes import run_episodes
from trainer.evaluation.policies import picked_checkpoint, policy_from_state
from trainer.evaluation.report import check_writable
from trainer.interrupts import StopSignals
from trainer.ppo.distillation import distilled_record
from trainer.ppo.model import ActorCritic
from trainer.ppo.set_model import SetActorCritic, split_observations
from trainer.registry import algorithm_spec

OPSET = 18  # supported by every ONNX Runtime since 1.14 and by torch's dynamo exporter
ATOL = 1e-5
FILES = {"torchscript": "policy.pt", "onnx": "policy.onnx"}
CARD = "policy.json"
OUTPUTS = ("action", "probs", "value")
ONNX_MODULES = ("onnx", "onnxruntime", "onnxscript")
EDGE_BOUND = 1e3  # where an infinite bound of the observation space is cut for the edge-case observations
MAX_OBSERVATIONS = 512


class ExportError(ValueError):
    """An exported policy disagrees with the trained model."""


class ExportedPolicy(nn.Module):
    """A categorical policy as one traceable function: raw observations in, greedy actions out.

    ``forward(obs [B, obs_dim] float32) -> (action, probs, value)``: ``action`` is ``[B]``
    (Discrete) or ``[B, heads]`` (MultiDiscrete) int64, ``probs`` is ``[B, heads, max actions]``
    (ragged heads padded with probability 0), ``value`` is ``[B]``. It runs the model's own
    normaliser (frozen statistics), actor and critic in one pass, so it computes what
    ``act_deterministic``, ``action_probs`` and ``value`` compute.

    Example:
        >>> import gymnasium as gym, torch
        >>> env = gym.make("CartPole-v1")
        >>> model = ActorCritic(env.observation_space, env.action_space, seed=0).eval()
        >>> action, probs, value = ExportedPolicy(model)(torch.zeros(3, 4))
        >>> torch.equal(action, model.act_deterministic(torch.zeros(3, 4))), probs.shape, value.shape
        (True, torch.Size([3, 1, 2]), torch.Size([3]))
    """

    def __init__(self, model: ActorCritic | SetActorCritic) -> None:
        super().__init__()
        if model.kind == "box":
            raise ValueError("export supports Discrete and MultiDiscrete action spaces; this policy has a Box one")
        self.model = model

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.model.exported(obs)


def export_file(policy: ExportedPolicy, fmt: str, path: Path, obs_dim: int) -> None:
    """Write ``policy`` to ``path`` as ``fmt`` ("torchscript" or "onnx"), for any batch size (and, for a set
    policy, any number of user slots: the ONNX input ``obs`` is ``[batch, F * users + C]``)."""
    example = torch.zeros(2, obs_dim)  # not 1: an exporter may take a batch of 1 for a constant
    shapes = {0: torch.export.Dim("batch")}
    layout = policy.model.layout
    if layout.kind == "set":  # any slot count: the width is a user count's, F per slot, then the cell's C
        shapes[1] = layout.features * torch.export.Dim("users", min=1) + layout.shared
    policy.eval()
    with torch.no_grad(), warnings.catch_warnings():
        # TorchScript is deprecated in favour of torch.export, but unlike a .pt2 file it loads in
        # any PyTorch 2.x and in libtorch (C++), which is where a shipped policy runs
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated")
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)  # torch's own pytree use
        warnings.simplefilter("error", torch.jit.TracerWarning)  # a trace that depends on the example batch
        if fmt == "torchscript":
            torch.jit.trace(policy, example).save(str(path))
            return
        with _quiet("torch.onnx"):
            torch.onnx.export(policy, (example,), str(path), dynamo=True, opset_version=OPSET,
                              input_names=["obs"], output_names=list(OUTPUTS),
                              dynamic_shapes={"obs": shapes}, verbose=False,
                              external_data=False)  # one self-contained file


@contextlib.contextmanager
def _quiet(logger: str):
    """Silence a library's warnings that concern nothing we export (e.g. 'torchvision is not installed')."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def run_exported(path: Path, obs: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(action, probs, value)`` of an exported file, loaded from disk as a user would load it."""
    if path.suffix == ".onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return tuple(session.run(list(OUTPUTS), {"obs": obs}))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.load` is deprecated")  # see export_file
        module = torch.jit.load(str(path))
    with torch.no_grad():
        return tuple(t.numpy() for t in module(torch.from_numpy(obs)))


@torch.no_grad()
def reference_outputs(model: ActorCritic | SetActorCritic, obs: np.ndarray) -> tuple[np.ndarray, ...]:
    """What the trained model itself says: greedy actions, probabilities and values."""
    x = torch.from_numpy(obs)
    return model.act_deterministic(x).numpy(), model.action_probs(x).numpy(), model.value(x).numpy()


def verification_observations(model: ActorCritic | SetActorCritic, env_id: str, seed: int, episodes: int = 4,
                              env_kwargs: dict[str, Any] | None = None) -> np.ndarray:
    """Observations ``[N, obs_dim]`` float32 to compare a policy on.

    Those the greedy policy meets in ``episodes`` episodes of ``gym.make(env_id, **env_kwargs)`` (the env the
    run trained on) on held-out seeds (the evaluation
    branch, which training never uses), evenly thinned to ``MAX_OBSERVATIONS``, then the
    bounds of the observation space (infinite ones cut at ``EDGE_BOUND``): low, high, zeros,
    their midpoint, and 16 uniform draws between them.
    """
    seen: list[np.ndarray] = []

    def greedy(obs: np.ndarray) -> np.ndarray:
        seen.append(obs)
        return model.act_deterministic(torch.from_numpy(obs).float()).numpy()

    make = functools.partial(gym.make, env_id, **(env_kwargs or {}))
    run_episodes(greedy, make, episodes, seed)
    probe = make()
    space = probe.observation_space
    probe.close()
    played = np.concatenate(seen).astype(np.float32)
    played = played[np.linspace(0, len(played) - 1, min(len(played), MAX_OBSERVATIONS)).astype(int)]
    low, high = (np.clip(b.astype(np.float64), -EDGE_BOUND, EDGE_BOUND) for b in (space.low, space.high))
    uniform = np.random.default_rng(seed).uniform(low, high, size=(16, len(low)))
    edges = np.stack([low, high, np.zeros_like(low), (low + high) / 2, *uniform]).astype(np.float32)
    return np.concatenate([played, edges])


def verify(model: ActorCritic | SetActorCritic, path: Path, obs: np.ndarray, atol: float = ATOL,
           case: str = "") -> dict[str, Any]:
    """Compare an exported file with ``model`` on ``obs`` (as one batch, and one row alone); ``case`` names the
    observations in what is said (a set policy's slot count: :func:`slot_cases`).

    Returns the numbers; raises :class:`ExportError` unless every greedy action is identical
    and every probability (and value, relative to its size) agrees within ``atol``.
    """
    ref = reference_outputs(model, obs)
    got = run_exported(path, obs)
    single = run_exported(path, obs[:1])  # the batch axis is dynamic
    got = tuple(np.concatenate([g, s]) for g, s in zip(got, single))
    ref = tuple(np.concatenate([r, r[:1]]) for r in ref)
    rows = (got[0] == ref[0]).reshape(len(obs) + 1, -1).all(1)
    prob_diff = float(np.abs(got[1] - ref[1]).max())
    value_diff = float(np.abs(got[2] - ref[2]).max())
    value_tol = atol * max(1.0, float(np.abs(ref[2]).max()))
    numbers = {"observations": len(obs), "actions_identical": int(rows[:-1].sum()),
               "max_abs_prob_diff": prob_diff, "max_abs_value_diff": value_diff, "atol": atol}
    said = (f"{case}{': ' if case else ''}{len(obs)} observations, greedy actions identical on "
            f"{numbers['actions_identical']}/{len(obs)}"
            f"{'' if rows[-1] else ', not on the first run alone'}, max |prob diff| {prob_diff:.2e}, "
            f"max |value diff| {value_diff:.2e} (atol {atol:g})")
    if not rows.all() or prob_diff > atol or value_diff > value_tol:  # said once, as the error
        raise ExportError(f"{path.name} disagrees with the trained model: {said}")
    print(f"{path.name}: {said}")
    return numbers


def slot_cases(model: ActorCritic | SetActorCritic, obs: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """The observations an exported policy is verified on, by name: ``obs`` itself (named ``""``), or, for a set
    policy, ``obs`` cut to its first 1, 2, half and all user slots, and with all its slots permuted (the files
    take any slot count, and must act for the users, whatever their order, as the model does).

    >>> import gymnasium as gym
    >>> from trainer.common.policy_layout import PolicyLayout
    >>> model = SetActorCritic(gym.spaces.Box(0, 1, (4 * 2 + 1,)), gym.spaces.MultiDiscrete([3] * 4),
    ...                        PolicyLayout("set", 2, 1))
    >>> {k: v.shape for k, v in slot_cases(model, np.zeros((5, 9), np.float32), seed=0).items()}
    {'1 of 4 slots': (5, 3), '2 of 4 slots': (5, 5), '4 of 4 slots': (5, 9), '4 slots permuted': (5, 9)}
    """
    if model.layout.kind != "set":  # its parameters fix the width: the observations as they are
        return {"": obs}
    users, cell = (t.numpy() for t in split_observations(torch.from_numpy(obs), model.layout))
    slots = users.shape[1]

    def flat(u: np.ndarray) -> np.ndarray:
        return np.concatenate([u.reshape(len(obs), -1), cell], axis=1)
    cases = {f"{k} of {slots} slots": flat(users[:, :k]) for k in sorted({1, min(2, slots), max(slots // 2, 1), slots})}
    cases[f"{slots} slots permuted"] = flat(users[:, np.random.default_rng(seed).permutation(slots)])
    return cases


def _verified(model: ActorCritic | SetActorCritic, path: Path, obs: np.ndarray, seed: int,
              atol: float) -> dict[str, Any]:
    """:func:`verify` on every case of :func:`slot_cases`: its numbers, or (a set policy) each case's, by name."""
    cases = {case: verify(model, path, o, atol, case) for case, o in slot_cases(model, obs, seed).items()}
    return cases.pop("") if "" in cases else {"slots": cases}


def _space(space: gym.Space) -> dict[str, Any]:
    if isinstance(space, gym.spaces.Box):
        def bound(b: np.ndarray) -> list:
            return [float(v) if np.isfinite(v) else str(float(v)) for v in b.reshape(-1)]  # JSON has no inf
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": bound(space.low), "high": bound(space.high)}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist()}
    return {"type": type(space).__name__, "repr": str(space)}


def _env_card(env_id: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    env = gym.make(env_id, **env_kwargs)
    try:
        config = getattr(env.unwrapped, "config", None)
        params = ({f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
                  if dataclasses.is_dataclass(config) else None)
        return {"id": env_id, "observation_space": _space(env.observation_space),
                "action_space": _space(env.action_space), "config": params}
    finally:
        env.close()


def _need_onnx() -> None:
    missing = []
    for name in ONNX_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ValueError(f"--format onnx needs {', '.join(missing)} (the export extra): pip install -e '.[export]', "
                         "or pass --format torchscript")


def export(checkpoint: str | Path, formats: list[str], out: str | Path | None = None, seed: int = 0,
           atol: float = ATOL, pick: str = "best", signals: StopSignals | None = None) -> dict[str, Any]:
    """Export, verify and describe the policy of ``checkpoint`` (a file, or a run directory: its ``pick``,
    as ``trainer.evaluate`` picks); returns the card. Nothing lands in ``out`` unless every file passes.
    ``signals`` (a command line's): a stop signal waits for the files to be moved into ``out``, all of them,
    and then has nothing left to stop."""
    signals = signals or StopSignals()  # (not entered: its sections hold nothing back, for a library caller)
    if "onnx" in formats:
        _need_onnx()
    source, state, which = picked_checkpoint(checkpoint, pick)
    sha256 = checkpoints.content_hash(source)  # right after the load: the weights exported (the path may change)
    model, cfg = policy_from_state(state, source)
    if not algorithm_spec(cfg.algo).exportable:
        raise ValueError(f"{source} is {algorithm_spec(cfg.algo).model_name} (--algo {cfg.algo}); trainer.export "
                         "ships PPO policies (probabilities and values); evaluate it with trainer.evaluate")
    policy = ExportedPolicy(model)  # before any file is written: a Box policy fails here
    print(f"exporting {which}: {source}", file=sys.stderr)
    run_dir = checkpoints.run_dir_of(checkpoint)  # the run given: never one a pointer would lead to
    given_out = out is not None and str(out) != ""
    out = Path(out) if out else run_dir / "export"
    evaluation = _evaluation(run_dir, sha256)  # a malformed file fails here, before the work
    made = next((d for d in reversed((out, *out.parents)) if not d.exists()), None)  # the first it will make
    check_writable(out, "the exported policy", run_dir=None if given_out else run_dir)
    _say_evaluation_differs(evaluation, source, sha256)
    for stale in out.glob(".export-*"):  # stage folders of an export that was killed
        shutil.rmtree(stale, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        card = _staged_card(stage, model, policy, formats, cfg, state, source, sha256, evaluation, seed, atol)
        with signals.critical():
            for fmt in FILES:
                if fmt not in formats:  # the card describes every policy file next to it
                    (out / FILES[fmt]).unlink(missing_ok=True)
            for name in [FILES[f] for f in formats] + [CARD]:  # the card last: it exists only for verified files
                os.replace(stage / name, out / name)
            signals.finish()
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        _remove_if_empty(out, made)
    print(f"wrote {', '.join(str(out / FILES[f]) for f in formats)} and {out / CARD}")
    return card


def _say_evaluation_differs(evaluation: dict[str, Any] | None, source: Path, sha256: str) -> None:
    """A note on stderr where the run's ``evaluation.json`` (which the card keeps) is not of what is exported:
    of another checkpoint's weights (``sha256``: those exported), or of sampled actions."""
    differs = []
    if evaluation and not evaluation["same_checkpoint"]:
        differs.append(_other_checkpoint(evaluation, sha256))
    if evaluation and evaluation.get("actions") == "sampled":  # (files of older versions do not say)
        differs.append("of sampled actions, where the export acts greedily")
    if differs:
        print(f"note: {evaluation['file']} is {' and '.join(differs)}; the card keeps it, with same_checkpoint and "
              f"actions saying so; python -m trainer.evaluate --checkpoint {source} (greedy, without --stochastic) "
              "describes what is exported", file=sys.stderr)


def _other_checkpoint(evaluation: dict[str, Any], sha256: str) -> str:
    """Which checkpoint an evaluation of other weights than those exported (content hash ``sha256``) is of, in
    words: named by its content hash, or, written before evaluations had one, said to name none."""
    name = Path(evaluation["checkpoint"]).name
    if not isinstance(evaluation.get("checkpoint_sha256"), str):
        return (f"of {name} without its content hash (an older version wrote it), so not known to be of the "
                "weights exported")
    return f"of other weights ({name} of sha256 {evaluation['checkpoint_sha256'][:12]}; exported: {sha256[:12]})"


def _staged_card(stage: Path, model: ActorCritic | SetActorCritic, policy: ExportedPolicy, formats: list[str],
                 cfg: TrainConfig, state: dict[str, Any], source: Path, sha256: str,
                 evaluation: dict[str, Any] | None, seed: int, atol: float) -> dict[str, Any]:
    """The card of the policy files written in ``stage``, each verified against ``model`` (of the checkpoint
    ``source``, of content hash ``sha256``); the card is written there too, last."""
    env_card = _env_card(cfg.env, cfg.env_options)
    obs_dim = env_card["observation_space"]["shape"][0]
    obs = verification_observations(model, cfg.env, seed, env_kwargs=cfg.env_options)
    files = {}
    for fmt in formats:
        path = stage / FILES[fmt]
        export_file(policy, fmt, path, obs_dim)
        files[fmt] = {"file": FILES[fmt], "sha256": checkpoints.content_hash(path),
                      "verification": _verified(model, path, obs, seed, atol),
                      **({"opset": OPSET, "load": "onnxruntime.InferenceSession"} if fmt == "onnx"
                         else {"load": "torch.jit.load"})}
    card = {
        "files": files,
        **_signature(model, obs_dim),
        "env": env_card,
        "training": cfg.to_dict(),
        "checkpoint": {"path": str(source.resolve()), "sha256": sha256, "iteration": state["iteration"],
                       "env_steps": state["env_steps"], "version": state.get("version"),
                       "distilled": distilled_record(state, source)},  # the distillation rounds, on these weights
        "evaluation": evaluation,
        "verification": {"seed": seed, "atol": atol, "observations": len(obs),
                         "edge_bound": EDGE_BOUND},
        "versions": {"parallel-rollouts": __version__, "torch": torch.__version__},
    }
    (stage / CARD).write_text(json.dumps(card, indent=2, default=list))
    return card


def _signature(model: ActorCritic | SetActorCritic, obs_dim: int) -> dict[str, Any]:
    """The card's ``inputs`` and ``outputs``: what the files take and give."""
    value = "float32 [batch]: the critic's value"
    layout = model.layout
    if layout.kind == "set":
        f, c, active = layout.features, layout.shared, layout.active
        flag = f", user feature {active} its active flag (1.0 / 0.0)" if active is not None else ""
        return {"inputs": {"obs": f"float32 [batch, {f} * users + {c}]: raw observations, any number of user slots "
                                  f"({layout.slots(obs_dim)} in training): {f} features per user{flag}, then {c} of "
                                  "the cell (the normaliser is inside)"},
                "outputs": {"action": "int64 greedy action, [batch, users] (an inactive user's: 0)",
                            "probs": "float32 [batch, users, actions]: action probabilities per user",
                            "value": value}}
    return {"inputs": {"obs": f"float32 [batch, {obs_dim}]: raw observations (the normaliser is inside)"},
            "outputs": {"action": "int64 greedy action, [batch] (Discrete) or [batch, heads] (MultiDiscrete)",
                        "probs": "float32 [batch, heads, max actions]: action probabilities per head",
                        "value": value}}


def _remove_if_empty(out: Path, made: Path | None) -> None:
    """Remove the directories the export made (``out`` up to ``made``, the first of them), where a failure left
    them empty."""
    for made_here in (out, *out.parents) if made else ():
        with contextlib.suppress(OSError):
            made_here.rmdir()
        if made_here == made:
            break


def _evaluation(run_dir: Path, sha256: str) -> dict[str, Any] | None:
    """The run's ``evaluation.json``, where there is one, and whether it evaluated this checkpoint: the weights of
    content hash ``sha256``, whatever their path (one without a hash, of an older version, is not known to)."""
    path = run_dir / "evaluation.json"
    if not path.exists():
        return None
    try:
        payload = json.loads(checkpoints.read_small_file(path))
    except (OSError, ValueError):  # (ValueError: not JSON, or not UTF-8): named below, like any other bad content
        payload = None
    if not isinstance(payload, dict) or not isinstance(payload.get("checkpoint"), str):
        raise ValueError(f"{path} is not an evaluation trainer.evaluate wrote (a JSON object with a 'checkpoint' "
                         "path); the card would describe it: run trainer.evaluate again, or move the file away")
    same = payload.get("checkpoint_sha256") == sha256
    return {"file": str(path.resolve()), "same_checkpoint": same,
            **payload}
