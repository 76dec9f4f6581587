"""Export a trained policy as one self-contained file, verified against the trained model.

    python -m trainer.export --checkpoint RUN_DIR_OR_FILE [--pick best|latest] [--format torchscript|onnx|both]
                             [--out DIR] [--seed S] [--atol 1e-5]

Writes ``policy.pt`` (TorchScript, ``torch.jit.load``) and/or ``policy.onnx`` (ONNX opset 18,
dynamic batch axis; needs the ``export`` extra) and the card ``policy.json`` to
``--out`` (default ``RUN/export``). Each file maps raw float32 observations ``obs [B, obs_dim]``
to ``action`` (greedy), ``probs [B, heads, max actions]`` and ``value [B]``, with the frozen
observation normaliser inside. Before anything is written, each file is reloaded from disk and
run next to the trained model on observations from held-out seeds and at the bounds of the
observation space; the command fails unless the greedy actions are identical and the
probabilities agree within ``--atol``. PPO policies only (``trainer.ppo.export``).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from pathlib import Path

from collectors.stop_signals import exiting_at_once_on_stop_signals
from trainer.arguments import OneLineParser, not_a_directory
from trainer.interrupts import StopSignals, ignore_late_signals


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m trainer.export", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint file, or run directory (see --pick)")
    p.add_argument("--pick", choices=("best", "latest"), default="best",
                   help="from a run directory: its best checkpoint (validation, --eval-every) when it has one, "
                        "or the newest, as trainer.evaluate picks (default: %(default)s)")
    p.add_argument("--format", default="both", choices=["torchscript", "onnx", "both"],
                   help="policy.pt (TorchScript), policy.onnx (needs the export extra), or both (default: "
                        "%(default)s)")
    p.add_argument("--out", default="", help="output directory (default: RUN/export)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the held-out episodes the export is verified on (default: %(default)s)")
    p.add_argument("--atol", type=float, default=None,
                   help="largest allowed probability difference (default: trainer.ppo.export.ATOL, 1e-5)")
    args = p.parse_args(argv)
    if args.atol is not None and not (args.atol > 0 and math.isfinite(args.atol)):
        p.error(f"--atol={args.atol} is invalid: must be a finite number > 0")
    if args.seed < 0:
        p.error(f"--seed={args.seed} is invalid: must be >= 0")
    if not Path(args.checkpoint).exists():
        p.error(f"--checkpoint {args.checkpoint}: no such checkpoint file or run directory")
    if args.out and (problem := not_a_directory("--out", args.out)):
        p.error(problem)
    # imported once the command line is checked: --help and a mistake answer before torch loads
    with exiting_at_once_on_stop_signals("nothing was written (the previous export, if any, is unchanged)"):
        import checkpoints
        from trainer.ppo.export import ATOL, FILES, export

    formats = list(FILES) if args.format == "both" else [args.format]
    try:
        with StopSignals() as signals:  # Ctrl-C or SIGTERM: one line, exit status 128 + the signal
            export(args.checkpoint, formats, args.out or None, args.seed, ATOL if args.atol is None else args.atol,
                   args.pick, signals)
            ignore_late_signals()  # the files are written: what arrives now has nothing to stop
    except (ValueError, checkpoints.CheckpointError) as e:
        first, *listed = [line.strip() for line in str(e).splitlines()]  # "no loadable checkpoint:" and its list
        raise SystemExit(f"error: {' '.join([first, '; '.join(listed)]).strip()}") from None
    except KeyboardInterrupt as e:
        print(f"\n{str(e) or 'interrupted'}: nothing was written (the previous export, if any, is unchanged)",
              file=sys.stderr)
        raise SystemExit(getattr(e, "exit_status", 128 + signal.SIGINT)) from None


if __name__ == "__main__":
    main()
