"""Offline DLC resolution agrees with the SageMaker SDK's own `image_uris.retrieve`."""

from __future__ import annotations

import pytest

from stacks.images import ImageTableError, resolve_base_image

CASES = [
    ("2.10.0", None, "us-east-1"),
    ("2.8", "py312", "eu-west-1"),
    ("2.5.1", "py311", "af-south-1"),
    ("2.6.0", None, "cn-north-1"),
    ("2.7.1", None, "us-gov-west-1"),
]


@pytest.mark.parametrize(("version", "py", "region"), CASES)
def test_matches_the_sdk(version: str, py: str | None, region: str) -> None:
    from sagemaker.core import image_uris

    ours = resolve_base_image(version, py, region)
    sdk = image_uris.retrieve(
        "pytorch",
        region=region,
        version=version,
        py_version=py or ours.tag.rsplit("-", 1)[1],
        instance_type="ml.p5.48xlarge",
        image_scope="training",
    )
    assert ours.uri == sdk


def test_unknown_version_python_and_region_are_clear_errors() -> None:
    with pytest.raises(ImageTableError, match=r"known versions: .*2\.10\.0"):
        resolve_base_image("9.9", None, "us-east-1")
    with pytest.raises(ImageTableError, match=r"PyTorch 2.10.0 DLCs exist for py313, not 'py39'"):
        resolve_base_image("2.10.0", "py39", "us-east-1")
    with pytest.raises(ImageTableError, match=r"no PyTorch 2\.10\.0 training DLC registry in region .mars-east-1."):
        resolve_base_image("2.10.0", None, "mars-east-1")
