"""What ``make bench-capacity`` says held each row: a row capped by the offered load must not
read as the bridge's capacity (on a faster VM 300 clouds/s offered were delivered whole at one
core, and the curve looked flat from there)."""

from __future__ import annotations

from typing import Any

from benchmarks.capacity import bound


def row(cores: float, clouds: float, bridge_cores: float) -> dict[str, Any]:
    return {"cores": cores, "clouds_per_s": clouds, "bridge_cores": bridge_cores}


def test_everything_offered_was_delivered() -> None:
    assert bound(row(1.0, 290.7, 0.96), offered=300) == "offered"


def test_the_quota_was_used_up() -> None:
    assert bound(row(0.5, 145.4, 0.50), offered=300) == "quota"
    assert bound(row(1.0, 89.1, 1.00), offered=300) == "quota"


def test_neither_means_the_rest_of_the_machine() -> None:
    assert bound(row(2.0, 266.4, 1.08), offered=300) == "machine"
    assert bound(row(1.5, 96.3, 1.12), offered=300) == "machine"
