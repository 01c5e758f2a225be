"""jaxbench: which GPU can train which model, at what batch size, how fast."""

__version__ = '0.1.0'
