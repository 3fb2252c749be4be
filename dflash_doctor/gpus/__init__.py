"""Reading GPUs of a sick run: NVML samples or nvidia-smi CSV snapshots, roles, and the DFD4xx analysis."""
