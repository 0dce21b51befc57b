"""The podman actuator's pure parts: kubelet quantities → ``podman update`` flags, and reading a
container's cgroup from the host (located through ``/proc/PID/cgroup`` + mountinfo). The real
``podman update`` path runs in ``make e2e-container``."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.kubesim_podman import (
    ContainerCgroup,
    cpu_shares,
    cpu_update_args,
    memory_update_args,
)

CID = "libpod_parent/libpod-0123abcd"


def test_cpu_flags_follow_the_kubelet() -> None:
    assert cpu_update_args(1500, 1500) == [
        "--cpu-period", "100000", "--cpu-quota", "150000", "--cpu-shares", "1536",
    ]  # fmt: skip
    # unlimited cpu: no quota; a tiny request still gets the kernel's minimum of 2 shares
    assert cpu_update_args(None, 1) == [
        "--cpu-period", "100000", "--cpu-quota", "-1", "--cpu-shares", "2",
    ]  # fmt: skip
    # the kernel refuses a quota under 1 ms: 5m rounds up to it, like the kubelet's minimum
    assert cpu_update_args(5, 5)[3] == "1000"
    assert cpu_shares(None) == 2 and cpu_shares(250) == 256


def test_memory_flags_pin_swap_to_the_limit() -> None:
    assert memory_update_args(512 << 20) == [
        "--memory", "536870912b", "--memory-swap", "536870912b",
    ]  # fmt: skip
    assert memory_update_args(None) == ["--memory", "-1", "--memory-swap", "-1"]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _v1_host(tmp: Path) -> Path:
    """A host with the hybrid layout of the project's machines and a container's cgroup."""
    proc = tmp / "proc"
    _write(
        proc / "4242" / "cgroup",
        f"4:memory:/{CID}\n1:cpu:/{CID}\n2:cpuacct:/{CID}\n0::/{CID}\n",
    )
    fs = tmp / "sys"
    _write(
        proc / "self" / "mountinfo",
        f"30 25 0:26 / {fs}/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        f"31 25 0:27 / {fs}/memory rw,relatime - cgroup cgroup rw,memory\n"
        f"32 25 0:28 / {fs}/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n",
    )
    return proc


def test_locates_and_reads_a_v1_container_cgroup(tmp_path: Path) -> None:
    proc = _v1_host(tmp_path)
    cg = ContainerCgroup.of_pid(4242, proc_root=str(proc))
    assert cg.version == "v1"
    assert cg.cpu_dir == tmp_path / "sys" / "cpu" / CID
    assert cg.memory_dir == tmp_path / "sys" / "memory" / CID
    _write(cg.cpu_dir / "cpu.cfs_quota_us", "50000\n")
    _write(cg.cpu_dir / "cpu.cfs_period_us", "100000\n")
    _write(cg.memory_dir / "memory.limit_in_bytes", "268435456\n")
    _write(cg.memory_dir / "memory.usage_in_bytes", "104857600\n")
    _write(cg.memory_dir / "memory.failcnt", "3\n")
    _write(cg.memory_dir / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert cg.cpu_limit_cores() == 0.5
    assert cg.memory_limit() == 256 << 20
    assert cg.memory_usage() == 100 << 20
    assert cg.oom_counters() == {"oom_kill_disable": 0, "under_oom": 0, "oom_kill": 1, "failcnt": 3}
    # unlimited reads as None, not as a huge number
    _write(cg.cpu_dir / "cpu.cfs_quota_us", "-1\n")
    _write(cg.memory_dir / "memory.limit_in_bytes", "9223372036854771712\n")
    assert cg.cpu_limit_cores() is None and cg.memory_limit() is None


def test_reads_a_v2_container_cgroup(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fs = tmp_path / "unified"
    _write(proc / "7" / "cgroup", f"0::/{CID}\n")
    _write(proc / "self" / "mountinfo", f"30 25 0:26 / {fs} rw - cgroup2 cgroup2 rw\n")
    cg = ContainerCgroup.of_pid(7, proc_root=str(proc))
    assert cg.version == "v2" and cg.memory_dir == fs / CID
    _write(fs / CID / "cpu.max", "150000 100000\n")
    _write(fs / CID / "memory.max", "max\n")
    _write(fs / CID / "memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert cg.cpu_limit_cores() == 1.5
    assert cg.memory_limit() is None
    assert cg.oom_counters()["oom_kill"] == 1


def test_no_cpu_or_memory_controller_is_an_error(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _write(proc / "9" / "cgroup", "3:pids:/x\n")
    _write(proc / "self" / "mountinfo", "30 25 0:26 / /sys/pids rw - cgroup cgroup rw,pids\n")
    with pytest.raises(ValueError):
        ContainerCgroup.of_pid(9, proc_root=str(proc))
