"""The local resize driver compares a held memory decrease with the bridge's RSS as it is now,
like a node's live ``memory.current``: a dip right after a heap trim (frames in flight grow the
heap back within 250 ms) must not hide behind the mirror's 100 ms refresh."""

from __future__ import annotations

import asyncio
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

from loadgen.resize import LocalBackend, rss_bytes

MiB = 1 << 20

# Holds 64 MiB until it reads a line, then frees it and says so.
_CHILD = (
    "import sys; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); "
    "print('held', flush=True); sys.stdin.readline(); del b; print('freed', flush=True); "
    "sys.stdin.readline()"
)


async def test_usage_is_the_bridges_rss_now_not_the_last_mirrored_value(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "cgroup", real_cpu=False)
    await backend.start(2.0, 1 << 30)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, stdin=PIPE, stdout=PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert await child.stdout.readline() == b"held\n"
        backend.attach(child.pid)
        high = backend.usage()
        assert high >= 64 * MiB
        await asyncio.sleep(0.25)  # the mirror has refreshed the file with the high value
        child.stdin.write(b"\n")
        assert await child.stdout.readline() == b"freed\n"
        # As between two refreshes of the mirror (every 100 ms): the file still says "high".
        backend.dir.set_memory_usage(high)
        low = backend.usage()
        assert low < high - 48 * MiB, (low, high)
        assert abs(low - rss_bytes(child.pid)) < 4 * MiB
        assert backend.dir.memory_usage() == low  # and kubesim's kubelet reads the same value
    finally:
        child.kill()
        await child.wait()
        await backend.close()


class _DipsOnce(LocalBackend):
    """Usage above the limit, one poll below it, then above again: a trim's dip with frames in
    flight growing the heap back at once."""

    def __init__(self, cgroup_dir: Path, samples: list[int]) -> None:
        super().__init__(cgroup_dir, real_cpu=False)
        self.samples = samples

    def usage(self) -> int:
        return self.samples.pop(0) if len(self.samples) > 1 else self.samples[0]


async def test_a_held_decrease_is_enacted_on_the_sample_that_fell_below_the_limit(
    tmp_path: Path,
) -> None:
    """Like the kubelet: the driver acts on the reading that was under the new limit. Reading
    usage once more before writing memory.max (as it did) found the heap regrown 0.1 s later and
    reported a resolved hold as unresolved (CI, test_scenario_short, 1 December)."""
    limit = 99 * MiB
    above, below = limit + MiB, limit - MiB
    backend = _DipsOnce(tmp_path / "cgroup", [above, above, above, above, below, above])
    await backend.start(2.0, 1 << 30)
    try:
        res = await backend.apply(None, limit, hold_timeout=2.0)
    finally:
        await backend.close()
    assert res.held and res.resolved, res.notes
    assert res.hold_s is not None and res.hold_s < 1.0
    assert int((tmp_path / "cgroup" / "memory.max").read_text()) == limit
