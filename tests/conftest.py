import os

# Ray: keep every node on loopback (this machine's tests never use another address). Read when ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
