"""Layers shared by several model families."""
