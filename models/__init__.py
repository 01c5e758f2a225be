"""The twelve workloads of the 2020 GPU benchmark, one file per model family."""
