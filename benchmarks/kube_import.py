"""Import cost of the Kubernetes client, side by side in fresh processes (``python -m
benchmarks.kube_import``). The bridge pays it once, at the first connection inside a cluster;
without a cluster lightkube is never imported. Timings on shared VMs are noisy: compare the ratio.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

CASES = {
    "bridge.resources.kubeapi only (config, no client library)": "import bridge.resources.kubeapi",
    "+ lightkube client (Pod, Event, ResourceClaim, ResourceSlice)": (
        "import bridge.resources.kubeapi, bridge.resources.kubelight, lightkube; "
        "from lightkube.resources.core_v1 import Pod, Event; "
        "from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice"
    ),
}


def main(repeats: int = 7) -> None:
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(repeats):
        for name, stmt in CASES.items():
            code = f"import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
            out = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
            times[name].append(float(out))
    base = statistics.median(next(iter(times.values())))
    print(f"import time, median of {repeats} fresh processes")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<64} {median * 1e3:8.1f} ms  {median / base:4.1f}x")


if __name__ == "__main__":
    main()
