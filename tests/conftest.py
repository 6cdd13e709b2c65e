"""Shared fixtures: the tiny checkpoint and in-process vLLM engines (one start each)."""

from __future__ import annotations

import os

import pytest

# Engines run in this process so tests can read the scheduler; positions are tracked so
# tests can compare the engine's slot maps with the spec.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("RANDKV_TRACK_POSITIONS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@pytest.fixture(scope="session")
def tiny_model_path():
    from randkv.models import build_tiny_checkpoint

    return str(build_tiny_checkpoint())
