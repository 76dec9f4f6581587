"""What an evaluation writes: the results table, the plot, and the check that its output directory is writable."""

from __future__ import annotations

import atexit
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

COLUMNS = (("mean_return", "return"), ("reward_per_step", "reward/step"), ("qoe_lin", "QoE_lin/user"),
           ("quality", "quality"), ("stall_s", "stall s/step"), ("switches", "switches/step"),
           ("fairness", "Jain fairness"))


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """One row per policy (``summarize``'s output): mean ± 95% CI of the columns any of them has, the names'
    column as wide as the longest name needs.

    >>> rows = format_table({"policy (greedy, volatility guard)": {"reward_per_step": 0.7, "reward_per_step_ci95":
    ...                      0.01}, "lowest": {"reward_per_step": 0.5, "reward_per_step_ci95": 0.02}}).splitlines()
    >>> len({row.index("±") for row in rows[2:]})  # every row's numbers under one another
    1
    """
    present = [(k, title) for k, title in COLUMNS if any(k in r for r in results.values())]
    width = max([22, *(len(name) + 2 for name in results)])
    head = f"{'policy':<{width}}" + "".join(f"{title:>22}" for _, title in present)
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        cells = "".join(f"{r[k]:>12.3f} {plus_minus(r[k + '_ci95']):<9}" if k in r else f"{'-':>22}"
                        for k, _ in present)
        lines.append(f"{name:<{width}}{cells}")
    return "\n".join(lines)


def plus_minus(ci95: float) -> str:
    """``± 0.012``; nothing where there is no interval (one episode has none)."""
    return f"± {ci95:.3f}" if math.isfinite(ci95) else ""


def json_ready(value: Any) -> Any:
    """``value`` with every non-finite float as ``None``: JSON has no NaN (``jq`` and browsers refuse it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def plot(results: dict[str, dict[str, Any]], run_dir: Path, out: Path) -> Path | None:
    """Reward per step of each policy, next to the run's training curve; ``None`` without matplotlib."""
    try:
        plt = pyplot()
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    names = list(results)
    ax1.bar(names, [results[n]["reward_per_step"] for n in names],
            yerr=[results[n]["reward_per_step_ci95"] for n in names], capsize=4)
    ax1.set_ylabel("mean reward per step (95% CI)")
    ax1.tick_params(axis="x", rotation=30)
    rows = [r for r in _training_rows(run_dir) if "env_steps" in r and "reward_per_step" in r]
    if rows:
        ax2.plot([r["env_steps"] for r in rows], [r["reward_per_step"] for r in rows])
        ax2.set_xlabel("env steps")
        ax2.set_ylabel("training reward per step")
    fig.tight_layout()
    write_figure(fig, out)
    plt.close(fig)
    return out


def _training_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of the run's ``metrics.jsonl`` (:func:`trainer.metrics.read_rows`); none where it cannot be read
    (the plot then shows the evaluation alone)."""
    from trainer.metrics import read_rows

    try:
        return read_rows(run_dir / "metrics.jsonl")[0]
    except ValueError:
        return []


def pyplot() -> Any:
    """``matplotlib.pyplot``, drawing to files (the Agg backend: no display needed; its cache kept out of ``$HOME``:
    :func:`private_matplotlib_cache`); ``ImportError`` without matplotlib."""
    private_matplotlib_cache()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def private_matplotlib_cache() -> None:
    """Before matplotlib is imported: its cache (the font list it makes on first use) in a temporary folder of this
    process's, removed as it exits, rather than under ``$HOME`` (``~/.cache/matplotlib``), so that a command writes
    nothing outside the folders it names; ``MPLCONFIGDIR``, where set, is kept (a cache that lasts: about 0.3 s
    less per command that plots, measured on AMD EPYC, 2 cores)."""
    if os.environ.get("MPLCONFIGDIR") or "matplotlib" in sys.modules:
        return
    folder = tempfile.mkdtemp(prefix="parallel-rollouts-matplotlib-")
    atexit.register(shutil.rmtree, folder, True)
    os.environ["MPLCONFIGDIR"] = folder


def write_figure(fig: Any, path: Path) -> Path:
    """Save the matplotlib figure ``fig`` as ``path``, in the format its suffix names (``.png``, ``.svg``), through a
    temporary file moved into place (as :func:`write_replacing`); returns ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # its own: several processes may write it at once
    fig.savefig(tmp, dpi=100, format=path.suffix.lstrip(".") or "png")
    os.replace(tmp, path)  # a link planted at ``path`` is replaced, not followed
    return path


def write_figures(fig: Any, out: Path, formats: tuple[str, ...] = ("png", "svg")) -> list[Path]:
    """Save the figure ``fig`` as ``out`` with each suffix of ``formats`` (:func:`write_figure`: each file whole or
    not at all), then close it; returns the files."""
    written = [write_figure(fig, out.with_suffix(f".{f}")) for f in formats]
    pyplot().close(fig)
    return written


def write_replacing(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file moved into place: whole or not at all, and a link
    planted at ``path`` is replaced, not followed out of the folder (:func:`checkpoints.files.write_whole`)."""
    from checkpoints.files import write_whole

    write_whole(path, text)


def check_writable(directory: Path, what: str = "the evaluation outputs", run_dir: Path | None = None,
                   make: bool = True) -> None:
    """Raise ``ValueError`` naming ``directory`` when files cannot be created in it, or, for a run's own outputs
    (``run_dir`` given), when a link leads it out of the run: nothing is written outside the run it names.
    ``make=False``: a missing ``directory`` is not made; the nearest of its parents that exists is tried instead
    (the caller makes it when it writes, so a command stopped before its results leaves no empty folder)."""
    if run_dir is not None and not directory.resolve().is_relative_to(run_dir.resolve()):
        raise ValueError(f"cannot write {what} to {directory}: it leads to {directory.resolve()}, outside the run "
                         f"{run_dir}; remove the link, or pass --out DIR")
    tried = directory if make else next(p for p in (directory, *directory.parents) if p.exists())
    if tried.exists() and not tried.is_dir():  # mkdir's "File exists" would not say which is wrong
        raise ValueError(f"cannot write {what} to {directory}: {tried} is a file, not a directory; pass --out DIR "
                         "with DIR a directory (made if missing)")
    try:
        tried.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=tried, prefix=".check-", suffix=".tmp"):
            pass
    except OSError as e:
        raise ValueError(f"cannot write {what} to {directory}: {e.strerror or e}; pass --out DIR") from None


def format_capture(capture: dict[str, Any], causal_share: dict[str, Any] | None, base: str = "fair_share") -> str:
    """The causal reference's lines of the table (``trainer.evaluation.contenders.capture_figures``): its causal share of
    the clairvoyant's lead over fair_share, where the clairvoyant was played, and the policy's capture of its own
    lead; a reference the policy beats is said to be not tight, and a capture above 1 no gain beyond what is reachable. ``base``: what the reference's
    rollout improves on (``fair_share``, ``policy`` or ``policy_critic``).

    >>> print(format_capture({"fraction": 0.5, "ci95": 0.1, "gap": 0.02, "ceiling_tight": True}, None))
    capture: the policy reaches 0.500 ± 0.100 (95% CI, delta method over episodes) of the causal reference's lead over fair_share (+0.020 reward/step)
    """  # noqa: E501
    lines = []
    if causal_share is not None:
        lines.append(f"causal share: the causal reference (belief on {base}, from observations only) reaches "
                     f"{_ratio(causal_share)} of the clairvoyant's lead over fair_share ({causal_share['gap']:+.3f} "
                     "reward/step); the rest is foresight of the draws, or what a better causal controller finds"
                     if math.isfinite(causal_share["fraction"]) else
                     f"causal share: none, the clairvoyant does not beat fair_share here ({causal_share['gap']:+.3f} "
                     "reward/step)")
    if not math.isfinite(capture["fraction"]):
        lines.append(f"capture: none, the causal reference does not beat fair_share here ({capture['gap']:+.3f} "
                     "reward/step): it bounds nothing")
    elif capture["ceiling_tight"]:
        lines.append(f"capture: the policy reaches {_ratio(capture)} of the causal reference's lead over fair_share "
                     f"({capture['gap']:+.3f} reward/step)")
    else:
        lines.append(f"capture: {_ratio(capture)}, above 1: the policy plays at least as well as the causal reference "
                     "here; the reference is not tight (BeliefMPC bounds the best causal play from below), so this is "
                     "no gain beyond what is reachable")
    return "\n".join(lines)


def _ratio(figure: dict[str, Any]) -> str:
    """``0.500 ± 0.100 (95% CI, delta method over episodes)``; the interval left out where there is none."""
    interval = plus_minus(figure["ci95"])
    return f"{figure['fraction']:.3f}" + (f" {interval} (95% CI, delta method over episodes)" if interval else "")
