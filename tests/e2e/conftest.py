"""The container end-to-end tests run only from ``make e2e-container`` (minutes, root, podman),
never in ``make test``: collected only when ``SIMBRIDGE_E2E_CONTAINER=1``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

collect_ignore_glob = [] if os.environ.get("SIMBRIDGE_E2E_CONTAINER") == "1" else ["test_*.py"]


@pytest.fixture(scope="session")
def container_image() -> str:
    """The Dockerfile's cpu image, built with podman; skips visibly where containers cannot run."""
    from benchmarks.container import env as container_env

    try:
        return container_env.prepare()
    except container_env.Unavailable as e:
        pytest.skip(f"containers cannot run here: {e}")


@pytest.fixture(scope="session")
def hostile_rows() -> Iterator[list[tuple[str, ...]]]:
    """The hostile cases' table rows; printed as one table when the session ends and written to
    ``reports/e2e-container/hostile-table.txt``."""
    rows: list[tuple[str, ...]] = []
    yield rows
    if rows:
        from benchmarks.container.hostile import table

        text = table(rows)
        print("\n\nhostile cases in the container:\n" + text)
        out = Path(__file__).resolve().parents[2] / "reports" / "e2e-container"
        out.mkdir(parents=True, exist_ok=True)
        (out / "hostile-table.txt").write_text(text + "\n")
