"""How each backend steps its envs: every stepper (``SerialStepper``, ``SyncStepper``, ``AsyncStepper``) fills
the same :class:`~collectors.env_group.StepViews`; ``ray_`` has Ray actors collect whole rollouts (``RayWorkers``).

A stepper has ``num_envs``, ``observation_space``, ``action_space`` and
``reset(seeds, obs_out)``, ``step(actions, out) -> episode infos``,
``get_env_states()``, ``set_env_states(states)``, ``close()``.
"""
