"""Learning: PPO on rollouts from ``collectors`` (config, actor-critic, GAE, update, planner, CLIs)."""
