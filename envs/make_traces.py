"""Write small synthetic bandwidth traces in the Pensieve and Mahimahi formats (for tests and examples).

    python -m envs.make_traces --out traces/ [--files 4] [--seconds 120] [--mean-mbps 4] [--seed 0]
                               [--kind regimes|heavy]

``regimes`` (the default): each file follows a persistent good / fair / poor regime chain with
correlated log-normal noise (the shape of ``VREdge-v0``'s own cell, at the few Mbit/s of a
phone's link), so that ``VREdgeConfig(capacity_trace=...)`` (which by default scales each file
to the cell's nominal capacity) has something realistic-looking to replay. ``heavy``: a
heavy-tailed, outage-heavy network of another kind (:func:`heavy_rates`: bursts and outages of
a few seconds, coefficient of variation about 1, a sixth of the seconds below a tenth of the
mean), a stand-in for networks a policy trained on Pensieve's never saw. Half the files are Pensieve
text (``<time s> <Mbit/s>``, one sample every 0.5 to 1.5 s), half Mahimahi (one line per
1500-byte delivery opportunity, in ms). Same arguments, same bytes.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from envs.traces import MAHIMAHI_PACKET_BITS


def synthetic_rates(gen: np.random.Generator, seconds: int, mean_mbps: float) -> np.ndarray:
    """Throughput ``[seconds]`` (Mbit/s, one value per second): regime chain times AR(1) log-normal noise."""
    multipliers, regime, noise = np.array([1.35, 0.9, 0.45]), int(gen.integers(3)), 0.0
    rates = np.empty(seconds)
    for t in range(seconds):
        if gen.random() >= 0.95:
            regime = (regime + 1 + int(gen.integers(2))) % 3
        noise = 0.9 * noise + math.sqrt(1 - 0.81) * 0.2 * gen.standard_normal()
        rates[t] = mean_mbps * multipliers[regime] * math.exp(noise - 0.02)
    return rates


def heavy_rates(gen: np.random.Generator, seconds: int, mean_mbps: float) -> np.ndarray:
    """Throughput ``[seconds]`` (Mbit/s) with heavy tails both ways: a Gilbert-Elliott outage chain (an outage
    starts with probability 0.05 a second and ends with 0.25: 17% of the seconds, 4 s on average, at 0.5-8% of the
    typical rate) over an AR(1) log-normal rate with a wide spread (sigma 0.6) and bursts (5% of the seconds at
    2.5-4.5x), the whole scaled to ``mean_mbps``. Over 60 files of 320 s: coefficient of variation 1.04, 17% of
    the seconds below a tenth of the mean (the heavy-tailed 5G logs of issue 64 as described there: 1.0 and 17%;
    Pensieve's test set: 0.59 and 0%)."""
    outage, noise = False, 0.0
    rates = np.empty(seconds)
    for t in range(seconds):
        outage = gen.random() >= 0.25 if outage else gen.random() < 0.05
        noise = 0.8 * noise + math.sqrt(1 - 0.64) * 0.6 * gen.standard_normal()
        burst = float(gen.uniform(2.5, 4.5)) if gen.random() < 0.05 else 1.0
        rates[t] = float(gen.uniform(0.005, 0.08)) if outage else math.exp(noise) * burst
    return rates * (mean_mbps / rates.mean())


RATE_KINDS = {"regimes": synthetic_rates, "heavy": heavy_rates}


def pensieve_text(gen: np.random.Generator, rates: np.ndarray) -> str:
    """Samples at irregular times (0.5-1.5 s apart), each the rate of the second it falls in."""
    times, t = [], 0.0
    while t < len(rates):
        times.append(t)
        t += float(gen.uniform(0.5, 1.5))
    times.append(float(len(rates)))  # the last line ends the trace
    return "".join(f"{s:.3f} {rates[min(int(s), len(rates) - 1)]:.4f}\n" for s in times)


def mahimahi_text(rates: np.ndarray) -> str:
    """Delivery opportunities spread evenly through each second (fractional packets carried over)."""
    lines, carry = [], 0.0
    for second, mbps in enumerate(rates):
        packets = mbps * 1e6 / MAHIMAHI_PACKET_BITS + carry
        whole = int(packets)
        carry = packets - whole
        lines += [str(second * 1000 + 1 + (i * 1000) // max(whole, 1)) for i in range(whole)]
    lines.append(str(len(rates) * 1000))  # the trace lasts exactly len(rates) seconds
    return "\n".join(lines) + "\n"


def write_traces(out: str | Path, files: int = 4, seconds: int = 120, mean_mbps: float = 4.0,
                 seed: int = 0, kind: str = "regimes") -> list[Path]:
    """Write ``files`` traces of ``kind`` (:data:`RATE_KINDS`; alternately Pensieve ``*.log`` and Mahimahi
    ``*.mahi``) to ``out``; their paths."""
    if files < 1 or seconds < 2 or mean_mbps <= 0:
        raise ValueError(f"files={files}, seconds={seconds}, mean_mbps={mean_mbps}: need files >= 1, seconds >= 2 "
                         "and mean_mbps > 0")
    if kind not in RATE_KINDS:
        raise ValueError(f"kind={kind!r} is not one of {', '.join(RATE_KINDS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, child in enumerate(np.random.SeedSequence(seed).spawn(files)):
        gen = np.random.default_rng(child)
        rates = RATE_KINDS[kind](gen, seconds, mean_mbps)
        path = out / (f"trace_{i:02d}.log" if i % 2 == 0 else f"trace_{i:02d}.mahi")
        path.write_text(pensieve_text(gen, rates) if i % 2 == 0 else mahimahi_text(rates))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m envs.make_traces", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory to write the traces to")
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--seconds", type=int, default=120, help="length of each trace")
    p.add_argument("--mean-mbps", type=float, default=4.0, help="mean throughput before any scaling")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kind", choices=sorted(RATE_KINDS), default="regimes",
                   help="regimes: a persistent good/fair/poor chain; heavy: heavy-tailed, with outages")
    args = p.parse_args(argv)
    try:
        paths = write_traces(args.out, args.files, args.seconds, args.mean_mbps, args.seed, args.kind)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {len(paths)} traces to {args.out}: " + ", ".join(p.name for p in paths))


if __name__ == "__main__":
    main()
