"""How envs are stepped: every backend fills the same :class:`~collectors.env_group.StepViews`.

A backend has ``num_envs``, ``observation_space``, ``action_space`` and
``reset(seeds, obs_out)``, ``step(actions, out) -> episode infos``,
``get_env_states()``, ``set_env_states(states)``, ``close()``.
"""
