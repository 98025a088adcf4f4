"""The AWS services' botocore models, which hold their APIs' limits: read from there, not typed again."""

from __future__ import annotations

from functools import cache

import botocore.session
from botocore.model import ServiceModel


@cache
def service_model(service: str) -> ServiceModel:
    return botocore.session.get_session().get_service_model(service)


def model_limit(service: str, shape: str, bound: str = "max") -> int:
    """A bound the service's model sets on one of its shapes (e.g. HyperParameterTuningJobName's "max")."""
    return int(service_model(service).shape_for(shape).metadata[bound])
