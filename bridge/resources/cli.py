"""``simbridge resources``: print what the bridge sees and where each value came from.

Reads once: the cgroup (``BRIDGE_CGROUP_ROOT`` or the process's own), the own Pod with its
ResourceClaims and ResourceSlices (when ``BRIDGE_POD_NAME``/``BRIDGE_POD_NAMESPACE`` and an API are
configured), and NVML (when ``nvidia-ml-py`` is installed); then prints, under ``plan``, the plan
``simbridge serve`` would apply with the same settings (env ``BRIDGE_*`` and ``--config``, through
the same :func:`~bridge.resources.from_settings.plan_settings`), before any stream connects.
Problems with the sources are printed, never fatal: exit status 0, or 2 for bad arguments or
settings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bridge import settings as settings_mod
from bridge.errors import ConfigError
from bridge.resources.adapt import affinity_cpus
from bridge.resources.cgroup import open_cgroup
from bridge.resources.describe import describe_plan, describe_snapshot, render_text
from bridge.resources.from_settings import plan_settings
from bridge.resources.gpu import GpuProbe
from bridge.resources.kubeapi import KubeConfig, KubeError, own_pod_from_env
from bridge.resources.plan import make_plan
from bridge.resources.podsource import PodSource, PodUpdate
from bridge.resources.snapshot import Snapshot, Sourced


async def _fetch_pod(
    env: Mapping[str, str], wait_s: float
) -> tuple[PodUpdate | None, dict[str, Any] | None]:
    config, ref = KubeConfig.from_env(env), own_pod_from_env(env)
    if config is None or ref is None:
        why = "no API configured" if config is None else "BRIDGE_POD_NAME/NAMESPACE not set"
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


def collect(
    env: Mapping[str, str] | None = None,
    timeout: float = 5.0,
    settings: settings_mod.Settings | None = None,
) -> dict[str, Any]:
    """Read every source once; the dict that ``--json`` prints. ``settings`` default to the ones
    ``simbridge serve`` would load from the same environment."""
    env = os.environ if env is None else env
    settings = settings_mod.load(flags={}, env=env) if settings is None else settings
    reading = open_cgroup(env).read()
    update, pod_info = asyncio.run(_fetch_pod(env, timeout))
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
    out["plan"] = describe_plan(make_plan(snap, plan_settings(settings, env)))
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
    try:
        settings = settings_mod.load(flags={}, env=os.environ, config_file=args.config)
    except ConfigError as exc:
        print(f"simbridge resources: {exc}", file=sys.stderr)
        return 2
    data = collect(timeout=args.timeout, settings=settings)
    if args.json:
        json.dump(data, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(data) + "\n")
    return 0
