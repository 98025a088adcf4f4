"""Image stack (stateful, retained): the ECR repository and the training image built into it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_kms as kms
from constructs import Construct

from stacks.constructs.training_image import TrainingImage
from stacks.settings import PlatformSettings

REPO_ROOT = Path(__file__).resolve().parents[1]


class ImageStack(Stack):
    def __init__(self, scope: Construct, id_: str, *, settings: PlatformSettings, key: kms.IKey, **kwargs: Any) -> None:
        super().__init__(scope, id_, termination_protection=True, **kwargs)
        self.training_image = TrainingImage(
            self,
            "TrainingImage",
            source_dir=REPO_ROOT,
            base_image=settings.base_image(),
            key=key,
            keep_images=settings.image.keep_images,
        )
