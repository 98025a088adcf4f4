"""The training package baked into the platform's image: launcher, trainer, data, checkpoints, metrics.

The launcher, the pre-flight check and the container contracts do not import torch, so that a job that cannot
start fails before torch loads; what the image shares with the handlers and the stacks lives in `contract/`.
"""
