"""Measurement layer: real torch.distributed runs (DDP, FSDP, parameter server, collectives).

Imports torch; never imported on the `perfmodel predict` path.
"""
