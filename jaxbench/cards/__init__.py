"""Which GPU: the card catalog, emulation, deviceless compiles, prediction and sweeps."""
