"""Keeps ``make bench-scale`` (benchmarks/scale/cli.py) from rotting: a real pod at N = 1 and 2
(``simbridge serve --processes max:1`` / ``2``: the supervisor and its ingest processes), both
workloads, 2 s cells, run as the Makefile runs it (a subprocess). Speeds are not asserted (noise
here); what is: that the rows measured the pod's own processes (the supervisor we started, the
ingest pids it reported, its plan, its clean exit), the report's fields and accounting, the
supervisor apart and small, memory idle and after, the Hello->Welcome and claim figures, the
N = 2 vs N = 1 line, and the statements of its limits: that the generator shares the bridge's
cores (always, without --cores) and whether it lagged."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.scale.report import format_report, model_rows
from benchmarks.scale.run import CellResult, GroupInfo

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_run_reports_every_field_and_says_the_generator_shares_the_cores(
    tmp_path: Path,
) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.scale.cli", "--procs", "1,2"),
            *("--duration", "2", "--warmup", "0.3", "--cloud-conns", "4", "--small-conns", "16"),
            *("--connects", "10", "--claims", "100", "--json", str(out)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    text = proc.stdout
    doc = json.loads(out.read_text())

    # Without --cores the bridge and the generator run on the same CPUs: said, in both forms.
    host = doc["host"]
    assert host["generator_shares_cores"] is True
    assert host["shared_cpus"] == sorted(os.sched_getaffinity(0))
    assert "GENERATOR SHARES THE BRIDGE'S CORES" in text
    assert host["cpu"] in text

    cells = doc["cells"]
    assert {(c["workload"], c["procs"]) for c in cells} == {
        ("cloud", 1),
        ("cloud", 2),
        ("1KB", 1),
        ("1KB", 2),
    }
    for c in cells:
        assert c["errors"] == [], c
        assert c["frames"] > 0 and c["frames_per_s"] > 0, c
        assert c["sent"] == c["completed"] > 0, c
        assert math.isfinite(c["loop_us_per_frame"]) and c["loop_us_per_frame"] > 0, c
        assert c["other_us_per_frame"] >= 0 and c["gen_us_per_frame"] > 0, c
        assert len(c["loop_share"]) == c["procs"], c
        assert abs(sum(c["loop_share"]) - 1) < 0.01, c
        assert isinstance(c["gen_lagged"], bool), c
        # The supervisor is measured apart, and answers no frame: a sliver of a core.
        assert 0 <= c["supervisor_cores"] < 0.25, c
        assert c["supervisor_us_per_frame"] < c["loop_us_per_frame"], c
        assert c["wakeups_per_kframe"] >= 0 and c["preempted_per_kframe"] >= 0, c
        assert c["sink_acks_per_kframe"] > 0, c  # every process read the sink's acks
        assert c["frames_per_push"] >= 1, c  # a push message carries one frame or more
    # A decimated cloud costs the workers (other threads) far more than a 1 KB passthrough frame.
    cloud1 = next(c for c in cells if c["workload"] == "cloud" and c["procs"] == 1)
    small1 = next(c for c in cells if c["workload"] == "1KB" and c["procs"] == 1)
    assert cloud1["other_us_per_frame"] > 10 * small1["other_us_per_frame"]
    # ... and only clouds reach the decimation kernel (the processes' /metrics say how long).
    assert all((c["decimate_us_per_frame"] > 0) == (c["workload"] == "cloud") for c in cells), cells
    # 16 hashed connections over 2 processes: both served (all on one: p = 2^-15).
    small2 = next(c for c in cells if c["workload"] == "1KB" and c["procs"] == 2)
    assert all(share > 0 for share in small2["loop_share"]), small2

    # The generator's lag is stated either way, and agrees with the cells.
    if any(c["gen_lagged"] for c in cells):
        assert "GENERATOR LAGGED in" in text
    else:
        assert "generator: did not lag in any cell" in text

    # Each N was one pod: the supervisor (the process the bench started) and the N ingest
    # processes its /debug/resources reported, planned as asked, drained cleanly at the end.
    groups = doc["groups"]
    assert [g["procs"] for g in groups] == [1, 2]
    for g in groups:
        sup, pids = g["supervisor_pid"], g["pids"]
        assert isinstance(sup, int) and sup > 0, g
        assert len(pids) == g["procs"] == len(set(pids)) and sup not in pids, g
        assert f"supervisor (pid {sup})" in text and f"pids {pids}" in text
        assert g["exit_code"] == 0, g
        assert len(g["idle_rss"]) == g["procs"] and all(r > 10 << 20 for r in g["idle_rss"]), g
        assert len(g["end_rss"]) == g["procs"] and all(r > 10 << 20 for r in g["end_rss"]), g
        # No gRPC, no NumPy in the supervisor: smaller than any ingest process.
        assert 10 << 20 < g["supervisor_idle_rss"] < min(g["idle_rss"]), g
        assert g["supervisor_end_rss"] > 0, g
        assert len(g["idle_cores"]) == g["procs"] and all(c >= 0 for c in g["idle_cores"]), g
        assert 0 <= g["supervisor_idle_cores"] < 0.25, g
        assert g["workers"] >= 1
        # Session setup against the pod, new devices and one device reconnecting.
        connects = g["connects"]
        assert connects["label"] == "pod" and connects["errors"] == [], connects
        assert connects["hello_welcome"]["count"] == connects["resume_hello_welcome"]["count"] == 10
    assert "processes=max:1" in groups[0]["plan"], groups[0]
    assert "processes=2 (explicit)" in groups[1]["plan"]
    # The reference without a pod, and the claim's round trip alone.
    assert doc["connects_plain"]["label"] == "plain"
    assert doc["connects_plain"]["hello_welcome"]["count"] == 10
    claim = doc["claim_rtt"]
    assert claim["errors"] == [] and claim["rtt"]["count"] == 100, claim
    assert 0 < claim["rtt"]["p50_ms"] < 50, claim
    assert "single (no pod)" in text and "claim round trip alone" in text
    for workload in ("cloud", "1KB"):
        model = doc["model"][workload]
        assert model["basis_procs"] == 2
        assert "n2_vs_n1_cpu_per_frame_pct" in model
        assert model["rates"] and all(r["frames_per_s"] > 0 for r in model["rates"])
        assert f"# {workload}: with N = 2, bridge CPU per frame is" in text
    line = next(x for x in text.splitlines() if x.startswith("N = 2 vs N = 1: CPU per frame"))
    assert "% (clouds)" in line and "% (1 KB)" in line, line
    assert "# claims: one Unix-socket round trip to the supervisor per connection" in text
    assert "MODEL (not a measurement, not a curve)" in text
    assert "accounting: every frame sent reached the sink exactly once, in order" in text


def _cell(**kw: object) -> CellResult:
    base: dict[str, object] = dict(
        round=1, procs=1, workload="1KB", transport="ws", conns=4, window=8, wire_bytes=1100,
        seconds=2.0, frames=1000, frames_per_s=500.0, loop_us_per_frame=80.0,
        other_us_per_frame=5.0, decimate_us_per_frame=0.0, bridge_cores=0.5,
        supervisor_cores=0.01, supervisor_us_per_frame=0.1, wakeups_per_kframe=10.0,
        preempted_per_kframe=5.0, sink_acks_per_kframe=60.0, frames_per_push=4.0,
        loop_cores_max=0.4,
        loop_share=[1.0],
        gen_loop_cores=0.3, gen_cores=0.3, gen_us_per_frame=40.0, machine_cores=0.8,
        rest_cores=0.0, gen_lagged=False, sent=1000, completed=1000, pauses=0,
    )  # fmt: skip
    base.update(kw)
    return CellResult(**base)  # type: ignore[arg-type]


def test_report_says_when_the_generator_lagged_and_when_it_has_cores_of_its_own() -> None:
    host = {
        "cpu": "Test CPU",
        "nproc": 4,
        "allowed_cpus": [0, 1, 2, 3],
        "bridge_cpus": [0, 1],
        "generator_cpus": [2, 3],
        "generator_shares_cores": False,
        "shared_cpus": [],
    }
    config = {"transport": "ws", "duration": 2.0, "warmup": 0.3}
    groups = [
        GroupInfo(
            round=1, procs=1, workers=2, bridge_cpus=[0, 1], supervisor_pid=10, pids=[11],
            plan="processes=max:1", idle_rss=[70 << 20], idle_pss=[40 << 20],
            supervisor_idle_rss=36 << 20, idle_cores=[0.01], supervisor_idle_cores=0.002,
            end_rss=[80 << 20], supervisor_end_rss=37 << 20,
        )
    ]  # fmt: skip
    cells = [_cell(), _cell(procs=2, loop_share=[0.5, 0.5], gen_lagged=True, gen_loop_cores=0.9)]
    text = format_report(host, config, groups, cells, model_rows(cells))
    assert "GENERATOR SHARES" not in text
    assert "does not share the bridge's cores" in text
    assert "GENERATOR LAGGED in: 1KB N=2 (0.90 core)" in text
    assert "LAGGED" in next(line for line in text.splitlines() if line.split()[:2] == ["1KB", "2"])
