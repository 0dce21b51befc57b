"""``simbridge resources``: print what the bridge sees and where each value came from.

Reads once, with the bridge's own settings (``BRIDGE_*`` environment, ``BRIDGE_CONFIG``): the
cgroup (``cgroup_root`` or the process's own), the own Pod with its ResourceClaims and
ResourceSlices (when ``pod_name``/``pod_namespace`` and an API are configured), and NVML (when
``nvidia-ml-py`` is installed); then prints, under ``plan``, the plan ``simbridge serve`` applies
with the same settings, before any stream connects. The Kubernetes client (lightkube) is imported
only when an API is configured. Problems are printed, never fatal: exit status 0 unless the
arguments or settings are wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from bridge.config import settings as settings_mod
from bridge.config.settings import Settings
from bridge.protocol.errors import ConfigError
from bridge.resources.adapt import affinity_cpus
from bridge.resources.cgroup import open_cgroup
from bridge.resources.describe import describe_plan, describe_snapshot, render_text
from bridge.resources.from_settings import plan_settings
from bridge.resources.gpu import GpuProbe
from bridge.resources.kubeapi import KubeConfig, KubeError, own_pod
from bridge.resources.plan import make_plan
from bridge.resources.podsource import PodSource, PodUpdate
from bridge.resources.snapshot import Snapshot, Sourced


async def _fetch_pod(
    settings: Settings, wait_s: float
) -> tuple[PodUpdate | None, dict[str, Any] | None]:
    config = KubeConfig.resolve(settings.kube_api, settings.kube_token_file)
    ref = own_pod(settings.pod_name, settings.pod_namespace)
    if config is None or ref is None:
        why = "no API configured" if config is None else "pod_name/pod_namespace not set"
        return None, {"configured": False, "why": why}
    info: dict[str, Any] = {"configured": True, "api": config.base_url, "pod": "/".join(ref)}
    from bridge.resources.kubelight import connect  # lightkube only with a cluster

    api = connect(config, timeout=wait_s)
    source = PodSource(api, ref[0], ref[1], lambda u: None)
    try:
        async with asyncio.timeout(wait_s):
            update = await source.fetch_once()
    except (KubeError, TimeoutError, ValueError) as e:
        info["error"] = str(e) or repr(e)
        return None, info
    finally:
        await api.close()
    info["problems"] = list(update.problems)
    return update, info


def collect(settings: Settings, timeout: float = 5.0) -> dict[str, Any]:
    """Read every source once; the dict that ``--json`` prints."""
    reading = open_cgroup(settings.cgroup_root).read()
    update, pod_info = asyncio.run(_fetch_pod(settings, timeout))
    probe = GpuProbe.load()
    try:
        gpu = probe.read()
    finally:
        probe.close()
    snap = Snapshot(
        cgroup=reading,
        cpus_allowed=Sourced(affinity_cpus(), "os.sched_getaffinity(0)"),
        pod=update.pod if update else None,
        devices=update.devices if update else (),
        gpu=gpu,
    )
    out = describe_snapshot(snap)
    out["pod_source"] = pod_info
    out["plan"] = describe_plan(make_plan(snap, plan_settings(settings)))
    out["plan_inputs"] = {
        "ring_budget_bytes": settings.ring_budget_bytes,
        "note": "the plan simbridge serve applies with these settings, before any stream connects",
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="simbridge resources",
        description="Show the CPU/memory limits, own Pod resize state, DRA devices and GPUs the "
        "bridge sees, where each value came from, and the plan it would apply.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the Kubernetes API"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the bridge's YAML/TOML/JSON config file, as for serve (env BRIDGE_CONFIG)",
    )
    args = parser.parse_args(argv)
    try:  # the same BRIDGE_* environment (and BRIDGE_CONFIG file) as serve
        settings = settings_mod.load(config_file=args.config)
    except ConfigError as exc:
        print(f"simbridge resources: {exc}", file=sys.stderr)
        return 2
    data = collect(settings, timeout=args.timeout)
    if args.json:
        json.dump(data, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(data) + "\n")
    return 0
