"""Side-by-side throughput benchmarks; each reports ratios measured in one run."""
