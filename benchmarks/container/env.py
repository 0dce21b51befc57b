"""Can containers run here, and the image the rig runs (built from the Dockerfile with podman).

Two kinds of failure are kept apart on purpose: a machine that cannot run containers at all (no
podman/runc/mmdebstrap, not root, no cgroup memory controller, a probe container that does not
start, no Debian mirror for the base) is *unavailable*, and callers skip visibly with the reason;
a Dockerfile that does not build on a machine that can run containers is a *failure*.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.container.probe import ULIMITS
from benchmarks.container.rig import REPO

SCRIPTS = REPO / "scripts" / "container"
RUNTIME = "/usr/sbin/runc"
PODMAN = ["podman", "--runtime", RUNTIME, "--cgroup-manager", "cgroupfs"]
BASE_IMAGE = os.environ.get("SIMBRIDGE_BASE_IMAGE", "localhost/simbridge-base:bookworm")
IMAGE = os.environ.get("SIMBRIDGE_E2E_IMAGE", "localhost/simbridge-e2e-cpu:latest")


class Unavailable(Exception):
    """Containers cannot run on this machine; the message says why."""


def _tail(text: str, n: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def check_host() -> None:
    """Raise :class:`Unavailable` when this machine cannot run the rig's containers."""
    if os.geteuid() != 0:
        raise Unavailable("needs root (the rig uses rootful podman with runc and cgroupfs)")
    missing = [t for t in ("podman", "mmdebstrap") if shutil.which(t) is None]
    if not os.path.exists(RUNTIME):
        missing.append("runc")
    if missing:
        raise Unavailable(
            f"missing {' '.join(missing)} (as root: apt-get install podman runc mmdebstrap uidmap)"
        )
    v1 = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists()
    controllers = Path("/sys/fs/cgroup/cgroup.controllers")
    v2 = controllers.exists() and {"cpu", "memory"} <= set(controllers.read_text().split())
    if not (v1 or v2):
        raise Unavailable("no cgroup memory and cpu controllers to limit a container with")


def ensure_base() -> None:
    """The mmdebstrap base image (cached), then a probe container with the rig's flags."""
    proc = subprocess.run(
        ["bash", str(SCRIPTS / "base-image.sh")], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise Unavailable(f"cannot make the base image {BASE_IMAGE}:\n{_tail(proc.stderr)}")
    probe = subprocess.run(
        [*PODMAN, "run", "--rm", "--network", "host", *ULIMITS, "--memory", "64m", "--cpus",
         "0.5", "--name", f"simbridge-e2e-probe-{os.getpid()}", BASE_IMAGE, "true"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if probe.returncode != 0:
        raise Unavailable(f"a container does not start here:\n{_tail(probe.stderr)}")


def build_image() -> str:
    """The Dockerfile's cpu target (podman, offline); a build failure raises RuntimeError."""
    proc = subprocess.run(
        ["bash", str(SCRIPTS / "build-image.sh"), sys.executable, IMAGE],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"podman build failed:\n{_tail(proc.stderr, 40)}")
    sys.stderr.write(_tail(proc.stderr, 3) + "\n")  # the whole build log only on failure
    return IMAGE


def prepare() -> str:
    """check_host → ensure_base → build_image; returns the image name."""
    check_host()
    ensure_base()
    return build_image()
