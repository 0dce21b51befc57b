"""Hostile load on the bridge in its real container (issue 29, build step 6).

``make e2e-container`` runs the short set: every case of
:data:`benchmarks.container.hostile.CASES` once, at ``SHORT_LIMIT`` (400m).
``make e2e-container-full`` (``SIMBRIDGE_E2E_FULL=1``) runs every case at 256m, 400m, 768m and
1g. Each case prints its checks; the session ends with one table of all of them (also written to
``reports/e2e-container/hostile-table.txt``). Every check of
:func:`benchmarks.container.hostile.checks` must pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.container.hostile import (
    CASES,
    LIMITS_FULL,
    SHORT_LIMIT,
    run_case,
)
from benchmarks.container.rig import MiB

OUT = Path(__file__).resolve().parents[2] / "reports" / "e2e-container"
FULL = os.environ.get("SIMBRIDGE_E2E_FULL") == "1"

#: Short-set cases that fail on today's code in every run or in some runs, with why (measured):
#: TEMPORARY marks, each to be removed by the fix that makes its case pass. Not strict: these
#: cases sit near their bounds (an OOM at 0.94-0.99 of the limit, a stall near 2 s, /healthz near
#: 100 ms), so a quiet run may pass and shows as XPASS. Never in the full set: there every case
#: must pass.
FAILING_TODAY: dict[str, str] = {}


def _params() -> list[object]:
    if FULL:
        return [
            pytest.param(name, limit, id=f"{name}-{limit // MiB}m")
            for limit in LIMITS_FULL
            for name in CASES
        ]
    return [
        pytest.param(
            name,
            SHORT_LIMIT,
            id=f"{name}-{SHORT_LIMIT // MiB}m",
            marks=(
                [pytest.mark.xfail(strict=False, reason=FAILING_TODAY[name])]
                if name in FAILING_TODAY
                else []
            ),
        )
        for name in CASES
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "limit"), _params())
async def test_hostile_case(
    container_image: str, name: str, limit: int, hostile_rows: list[tuple[str, ...]]
) -> None:
    """One case: 0 OOM kills, anon RSS ≤ limit at every sample, the good edge exactly once and
    never stalled past the bound, ``/healthz`` within its bound, the attack really applied."""
    out = await run_case(CASES[name], limit, container_image, OUT)
    hostile_rows.append(out.row)
    print("\n" + out.text)
    failed = [c.name for c in out.checks if not c.ok]
    assert out.ok, f"{name} at {limit // MiB}m failed: {'; '.join(failed)}"
