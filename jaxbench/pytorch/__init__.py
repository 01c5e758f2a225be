"""The PyTorch side of the harness: a workload's PyTorch peer (models/pytorch) searched, timed and
recorded as jaxbench/core does the JAX workload.

This package's __init__ and `usage` import no torch, so that the command line can check a
PyTorch run without it; `policy`, `program`, `environment` and `bench` import it.
"""
