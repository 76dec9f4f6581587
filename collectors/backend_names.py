"""The backend names, importable without torch: a command line is checked before torch loads."""

LOCAL_BACKENDS = ("serial", "sync", "async")  # RolloutCollector's: envs stepped in this process or its workers
BACKENDS = (*LOCAL_BACKENDS, "device", "ray")
