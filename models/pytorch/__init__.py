"""PyTorch peers of the JAX workloads (models/pytorch/peer.py is the contract).

Importing this package imports torch: the harness imports it only for --framework=pytorch.
"""
