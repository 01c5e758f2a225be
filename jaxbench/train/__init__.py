"""Training a workload for a number of steps, resumable from Orbax checkpoints."""
