"""The run core: plan -> search -> program -> timing -> result."""
