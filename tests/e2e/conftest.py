"""The container end-to-end tests run only from ``make e2e-container`` (minutes, root, podman),
never in ``make test``: collected only when ``SIMBRIDGE_E2E_CONTAINER=1``."""

from __future__ import annotations

import os

import pytest

collect_ignore_glob = [] if os.environ.get("SIMBRIDGE_E2E_CONTAINER") == "1" else ["test_*.py"]


@pytest.fixture(scope="session")
def container_image() -> str:
    """The Dockerfile's cpu image, built with podman; skips visibly where containers cannot run."""
    from benchmarks import container_env

    try:
        return container_env.prepare()
    except container_env.Unavailable as e:
        pytest.skip(f"containers cannot run here: {e}")
