"""The training package baked into the platform's image: launcher, trainer, data, checkpoints, metrics.

Importing ``training`` (and ``training.config``, ``training.metrics``, ``training.sagemaker_contract``) must not
import torch: the launcher and the platform's Lambdas use them on machines without it.
"""
