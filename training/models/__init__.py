"""Model zoo: GPT-2 family and a Llama-style decoder. Torch-free here; ``training.models.build`` builds."""

from contract.model_args import PRESETS, ModelArgs

__all__ = ["PRESETS", "ModelArgs"]
