"""Side-by-side throughput benchmarks; each reports ratios measured in one run."""

import trainer  # noqa: F401  (first: it sets OpenMP's spin before torch loads; see trainer/__init__.py)
