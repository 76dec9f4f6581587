"""Learning: PPO on rollouts from ``collectors`` (config, actor-critic, GAE, update, planner, CLIs)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("parallel-rollouts")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"
