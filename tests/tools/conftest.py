"""The local platform's fixtures (tests/pipeline/conftest.py), for the command line's tests."""

from tests.pipeline.conftest import pipeline, pipeline_factory

__all__ = ["pipeline", "pipeline_factory"]
