"""The service benchmarks run against the service tests' tiny model repository."""

from tests.service.conftest import model_repository

__all__ = ["model_repository"]
