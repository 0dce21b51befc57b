"""Hostile load on the bridge in its real container (issue 29, build step 6).

``make e2e-container`` runs the short set: every case of
:data:`benchmarks.container_hostile.CASES` once, at ``SHORT_LIMIT`` (400m).
``make e2e-container-full`` (``SIMBRIDGE_E2E_FULL=1``) runs every case at 256m, 400m, 768m and
1g. Each case prints its checks; the session ends with one table of all of them (also written to
``reports/e2e-container/hostile-table.txt``). Every check of
:func:`benchmarks.container_hostile.checks` must pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.container_hostile import (
    CASES,
    LIMITS_FULL,
    SHORT_LIMIT,
    run_case,
)
from benchmarks.container_rig import MiB

OUT = Path(__file__).resolve().parents[2] / "reports" / "e2e-container"
FULL = os.environ.get("SIMBRIDGE_E2E_FULL") == "1"

#: Short-set cases that fail on today's code in every run or in some runs, with why (measured):
#: TEMPORARY marks, each to be removed by the fix that makes its case pass. Not strict: these
#: cases sit near their bounds (an OOM at 0.94-0.99 of the limit, a stall near 2 s, /healthz near
#: 100 ms), so a quiet run may pass and shows as XPASS. Never in the full set: there every case
#: must pass.
FAILING_TODAY: dict[str, str] = {
    "ignore-pause": "/healthz answered in 138-399 ms (target 100; no CFS throttling) under four "
    "15 MiB-frame edges ignoring PAUSE at 400m, 5 of 5 runs (56c8a56, 013e137); anon peaks at "
    "0.96-0.97 of the limit, and 013e137 is OOM-killed at 256m, 768m and 1g",
    "bomb-offloop": "the good edge stalls 2.7 s with the sink up (2.7-3.5 s at every limit on "
    "013e137, bound 2 s) while >= 64 KiB bombs are decoded off the loop; OOM-killed on 56c8a56",
    "shrink": "live shrinks under the ignore-pause edges: /healthz 131-612 ms at 400m in every "
    "run, OOM-killed after 400m -> 316m once (56c8a56) and at 256m, 768m and 1g (013e137)",
    "bomb-zstd": "OOM-killed at 400m in 3 of 3 runs on 2 December after 069d16d (anon 0.94-0.99 "
    "of the limit: the bombs are valid 16 MiB clouds that fill the ring like the ignore-pause "
    "edges); passed at 0.81 on 013e137",
    "bomb-inline": "the good edge's longest stall is 1.31-2.13 s against the 2 s bound (failed 1 "
    "of 5 runs on 2 December): each valid 16 MiB bomb's decode is granted 48+ MiB first",
}


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
