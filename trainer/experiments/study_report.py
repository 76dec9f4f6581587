"""What a sweep found (``trainer.sweep``: at its end, and with ``--report``), read from its study alone (so any
machine of a shared study can write it):

    trials table              on stdout: each trial's state, best validation return, env steps, values, run dir
    env steps                 spent by all trials, against running every trial to its end: what pruning saved
    SWEEP_DIR/best.toml       the best trial's settings: python -m trainer.train --config SWEEP_DIR/best.toml
    SWEEP_DIR/history.png     Optuna's optimization history (and .svg), once a trial has completed
    SWEEP_DIR/importances.png Optuna's parameter importances (and .svg), from 2 completed trials on
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from trainer.arguments import command, counted
from trainer.evaluation.report import private_matplotlib_cache, write_figures, write_replacing

BEST = "best.toml"
PLOTS = {"history": "optimization history", "importances": "parameter importances"}
FEW_TRIALS = 20  # completed trials below which the importances carry a caveat (a forest fit to fewer ranks noise)


def trials_of(study: optuna.Study) -> list[FrozenTrial]:
    """The study's trials in number order, less those asked past ``--trials`` and never run."""
    return sorted((t for t in study.get_trials(deepcopy=False) if "surplus" not in t.user_attrs),
                  key=lambda t: t.number)


def best_return(trial: FrozenTrial) -> float | None:
    """A trial's best validation return: its value when complete; the best it reported otherwise."""
    if trial.state == TrialState.COMPLETE:
        return trial.value
    return max(trial.intermediate_values.values(), default=None)


def trials_table(study: optuna.Study) -> str:
    """One row per trial: number, state, best validation return, env steps spent, sampled values, run directory.

    Example (a study of two trials)::

        trial  state     best return  env steps  values                    run dir
            0  COMPLETE        187.2     20,480  lr=0.00031 ent_coef=0.012  runs/sweep-space/trial-0000
            1  PRUNED           21.0      4,096  lr=0.0021 ent_coef=0.0003  runs/sweep-space/trial-0001
    """
    rows = [(str(t.number), t.state.name, _number(best_return(t)), f"{t.user_attrs.get('env_steps', 0):,}",
             " ".join(f"{k}={_number(v)}" for k, v in t.params.items()), _shown_path(t.user_attrs.get("run_dir", "")))
            for t in trials_of(study)]
    head = ("trial", "state", "best return", "env steps", "values", "run dir")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    right = (True, False, True, True, False, False)
    return "\n".join("  ".join(cell.rjust(w) if r else cell.ljust(w) for cell, w, r in zip(row, widths, right)).rstrip()
                     for row in [head, *rows])


def env_steps_line(study: optuna.Study) -> str:
    """The env steps every trial spent, against what the same trials would have spent each run to its end."""
    trials = [t for t in trials_of(study) if "budget" in t.user_attrs]
    spent = sum(t.user_attrs.get("env_steps", 0) for t in trials)
    budget = sum(t.user_attrs["budget"] for t in trials)
    if not budget:
        return "env steps: none spent yet"
    pruned = sum(t.state == TrialState.PRUNED for t in trials)
    return (f"env steps: {spent:,} spent by {counted(len(trials), 'trial')} ({pruned} pruned), {spent / budget:.0%} of "
            f"the {budget:,} they would spend each run to its end")


def write_best(study: optuna.Study, sweep_dir: Path) -> Path | None:
    """``best.toml`` in ``sweep_dir``: the sweep's train settings with the best completed trial's values, for
    ``trainer.train --config``; ``None`` before any trial completed."""
    try:
        best = study.best_trial
    except ValueError:  # no trial completed
        return None
    settings = {**study.user_attrs["setup"]["settings"], **best.params}
    lines = [f"# the best trial of study {study.study_name}: trial {best.number}, best validation return "
             f"{best.value:.6g} ({best.user_attrs.get('run_dir', '')})",
             f"# python -m trainer.train --config {sweep_dir / BEST}",
             *(f"{key} = {_toml_value(value)}" for key, value in settings.items())]
    path = sweep_dir / BEST
    write_replacing(path, "\n".join(lines) + "\n")
    return path


def write_plots(study: optuna.Study, sweep_dir: Path) -> list[str]:
    """Optuna's optimization history and parameter importances as PNG and SVG in ``sweep_dir``; a line for each
    plot: where it is, or why there is none."""
    try:
        private_matplotlib_cache()
        import matplotlib
        matplotlib.use("Agg")
        from optuna.visualization import matplotlib as plots
    except ImportError:
        return ["plots: none (pip install -e '.[experiments]' for matplotlib)"]
    complete = [t for t in trials_of(study) if t.state == TrialState.COMPLETE]
    said = []
    for name, what in PLOTS.items():
        needs = 2 if name == "importances" else 1
        if len(complete) < needs:
            said.append(f"{what}: none yet (it needs {counted(needs, 'completed trial')}; the study has "
                        f"{len(complete)})")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's: its matplotlib plots are "experimental"
            if name == "history":
                axes = plots.plot_optimization_history(study, target_name="best validation return")
            else:
                axes = plots.plot_param_importances(study, evaluator=_importance_evaluator(),
                                                    target_name="best validation return")
        caveat = few_trials_caveat(len(complete)) if name == "importances" else ""
        if caveat:
            axes.set_title(f"{axes.get_title()}\n{caveat}")
        figure = axes.figure
        figure.set_size_inches(8, 5)
        figure.tight_layout()
        write_figures(figure, sweep_dir / name)  # (and closed)
        said.append(f"{what}: {sweep_dir / name}.png (and .svg)" + (f"; {caveat}" if caveat else ""))
    return said


def few_trials_caveat(completed: int) -> str:
    """What parameter importances from ``completed`` trials are worth, where they are too few to rank anything
    (below :data:`FEW_TRIALS`); else ``""``. Why: a forest fit to 3 points ranks parameters as confidently as one
    fit to 100, and a user reads the bars as a finding."""
    if completed >= FEW_TRIALS:
        return ""
    return (f"from {counted(completed, 'completed trial')} only: too few to rank parameters by (a rough guide below "
            f"{FEW_TRIALS})")


def _importance_evaluator() -> optuna.importance.BaseImportanceEvaluator:
    """fANOVA (Optuna's default) where scikit-learn is installed; PED-ANOVA, which needs nothing more, elsewhere."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return optuna.importance.PedAnovaImportanceEvaluator()
    return optuna.importance.FanovaImportanceEvaluator(seed=0)


def report(study: optuna.Study, sweep_dir: Path, out: TextIO = sys.stdout) -> None:
    """The trials table, the env steps line, ``best.toml`` and the plots, said on ``out``."""
    print(trials_table(study), file=out)
    print(env_steps_line(study), file=out)
    best = write_best(study, sweep_dir)
    if best is None:
        print("best: none yet (no trial has completed)", file=out)
    else:
        trial = study.best_trial
        print(f"best: trial {trial.number}, validation return {trial.value:.6g}: "
              + " ".join(f"{k}={_number(v)}" for k, v in trial.params.items()), file=out)
        print(f"best settings: {best} ({command('-m', 'trainer.train', '--config', str(best.resolve()))})", file=out)
    for line in write_plots(study, sweep_dir):
        print(line, file=out)


def _toml_value(value: Any) -> str:
    """A setting's value as TOML writes it (JSON spells strings, numbers and booleans the same way)."""
    return json.dumps(value)


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _shown_path(path: str) -> str:
    """``path`` relative to the working directory where it is inside it."""
    with contextlib.suppress(ValueError):
        return str(Path(path).relative_to(Path.cwd()))
    return path
