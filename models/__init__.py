"""The twelve workloads of the 2020 GPU benchmark: one module or subpackage per model family."""
