import os

# deterministic cuBLAS for the CUDA resume tests (as benchmarks.device_check sets it); read when CUDA starts
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# Ray: keep every node on loopback (this machine's tests never use another address). Read when ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
