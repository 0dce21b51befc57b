"""Chart resources as a new user sets them (issue 33): limits alone give a Guaranteed pod (requests
follow), and memory takes any Kubernetes quantity, decimals included (1.5Gi)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tests.unit.chart_support import (
    Renderer,
    bridge_container,
    compute_qos,
    helm,
    parse_quantity,
    pod_spec,
    renderer_fixture,  # noqa: F401 - the module-scoped fixture
)


def test_limits_alone_set_guaranteed_requests(renderer: Renderer) -> None:
    docs = renderer.render_values({"resources": {"limits": {"cpu": "2"}}})
    resources = bridge_container(docs)["resources"]
    assert resources["limits"]["cpu"] == "2"
    assert resources["requests"] == resources["limits"]
    assert compute_qos(pod_spec(docs)) == "Guaranteed"


@pytest.mark.parametrize("memory", ["1.5Gi", "2.25G", "1e9", "1536Mi", "0.5Ti"])
def test_decimal_memory_quantities_are_accepted(
    renderer: Renderer,
    memory: str,
) -> None:
    docs = renderer.render_values({"resources": {"limits": {"memory": memory}}})
    resources = bridge_container(docs)["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == memory
    assert parse_quantity(memory) > 0


@pytest.mark.parametrize("memory", ["0", "0.0Gi", "1.5GB", "-1Gi", "Gi", "1..5Gi"])
def test_malformed_memory_quantities_are_refused(
    renderer: Renderer,
    memory: str,
) -> None:
    with pytest.raises(helm.HelmValuesError):
        renderer.render_values({"resources": {"limits": {"memory": memory}}})


def test_quantity_parser_reads_decimal_binary_suffixes() -> None:
    assert parse_quantity("1.5Gi") == Fraction(3, 2) * 2**30
