"""``python -m loadgen.kubesim``: serve one Pod until interrupted (prints the URL first)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json

from bridge.resources.quantity import to_bytes, to_millicores
from loadgen.kubesim.model import JSON, NodeModel
from loadgen.kubesim.sim import KubeSim


def _load(path: str) -> JSON:
    with open(path, encoding="utf-8") as f:
        data: JSON = json.load(f)
    return data


async def _main(args: argparse.Namespace) -> None:
    sim = KubeSim(
        _load(args.pod),
        claims=[_load(p) for p in args.claim],
        slices=[_load(p) for p in args.slice],
        cgroup_dir=args.cgroup_dir,
        node=NodeModel(
            allocatable_cpu_m=to_millicores(args.node_cpu),
            allocatable_memory=to_bytes(args.node_memory),
            others_cpu_m=to_millicores(args.others_cpu),
            others_memory=to_bytes(args.others_memory),
        ),
        sync_interval=args.sync_interval,
        actuation_delay=args.actuation_delay,
        claims_block_resize=args.claims_block_resize,
    )
    await sim.start(args.host, args.port)
    print(f"kubesim serving {sim.url} (BRIDGE_KUBE_API={sim.url})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await sim.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadgen.kubesim",
        description="Local Kubernetes API + kubelet stand-in for in-place pod resize (one Pod).",
    )
    p.add_argument(
        "--pod", required=True, help="Pod JSON (e.g. tests/fixtures/k8s/pod-running-initial.json)"
    )
    p.add_argument("--claim", action="append", default=[], help="ResourceClaim JSON (repeatable)")
    p.add_argument("--slice", action="append", default=[], help="ResourceSlice JSON (repeatable)")
    p.add_argument("--cgroup-dir", help="directory the kubelet simulator writes cgroup files into")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--node-cpu", default="15800m", help="node allocatable cpu")
    p.add_argument("--node-memory", default="60Gi", help="node allocatable memory")
    p.add_argument("--others-cpu", default="0", help="cpu requested by the other pods")
    p.add_argument("--others-memory", default="0", help="memory requested by the other pods")
    p.add_argument("--sync-interval", type=float, default=1.0, help="kubelet sync period, s")
    p.add_argument("--actuation-delay", type=float, default=1.0, help="allocate→cgroup write, s")
    p.add_argument(
        "--claims-block-resize",
        action="store_true",
        help="reject resizes of pods whose containers have resources.claims (≤1.35)",
    )
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
