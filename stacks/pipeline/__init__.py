"""The training pipeline's parts: intake, approvals, the training step and its backends, the outcome."""
