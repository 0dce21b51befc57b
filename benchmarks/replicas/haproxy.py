"""HAProxy for the replicas run (``make e2e-replicas``): render ``examples/haproxy/haproxy.cfg``,
run it, and change its servers at run time through the stats socket (no reload).

Why the runtime API: scaling a replica in or out must not cut the other replicas' connections,
and ``set server <backend>/<server> addr|check-port|state`` changes one server in place.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from pathlib import Path
from string import Template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "examples" / "haproxy" / "haproxy.cfg"
BACKENDS = ("bridges_ws", "bridges_grpc")
SLOTS = ("r1", "r2", "r3")


class Unavailable(RuntimeError):
    """HAProxy is not installed (or cannot run) here."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def render(
    workdir: Path, replicas: list[dict[str, int]], host: str = "127.0.0.1"
) -> tuple[str, dict[str, int]]:
    """The template with ``replicas`` (each ``ws``, ``grpc``, ``http`` ports) in slots r1..r3, a
    stats socket in ``workdir`` and two free front ports. Returns (config, front ports)."""
    if len(replicas) != len(SLOTS):
        raise ValueError(f"the template has {len(SLOTS)} server slots")
    front = {"ws": free_port(host), "grpc": free_port(host)}
    values: dict[str, object] = {
        "STATS_SOCKET": str(workdir / "haproxy.sock"),
        "BIND": host,
        "WS_PORT": front["ws"],
        "GRPC_PORT": front["grpc"],
    }
    for slot, ports in zip(SLOTS, replicas, strict=True):
        key = slot.upper()
        values |= {
            f"{key}_HOST": host,
            f"{key}_WS": ports["ws"],
            f"{key}_GRPC": ports["grpc"],
            f"{key}_HTTP": ports["http"],
        }
    return Template(TEMPLATE.read_text()).substitute(values), front


class HAProxy:
    def __init__(self, workdir: Path, replicas: list[dict[str, int]]) -> None:
        exe = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
        if exe is None:
            raise Unavailable("haproxy is not installed (apt-get install haproxy, as root)")
        self.exe = exe
        self.workdir = workdir
        config, self.front = render(workdir, replicas)
        self.config_path = workdir / "haproxy.cfg"
        self.config_path.write_text(config)
        self.socket_path = workdir / "haproxy.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "haproxy.log"

    def version(self) -> str:
        out = subprocess.run([self.exe, "-v"], capture_output=True, text=True, check=False)
        return out.stdout.splitlines()[0] if out.stdout else "haproxy (unknown version)"

    async def start(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        await asyncio.to_thread(self._spawn)
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise Unavailable(f"haproxy exited: {self.log_path.read_text()[-2000:]}")
            try:
                await self.command("show info")
                return
            except OSError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.05)

    def _spawn(self) -> None:
        check = subprocess.run(
            [self.exe, "-c", "-q", "-f", str(self.config_path)], capture_output=True, text=True
        )
        if check.returncode != 0:
            raise Unavailable(f"haproxy refuses the config: {check.stderr.strip()}")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.exe, "-db", "-f", str(self.config_path)], stdout=log, stderr=log
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    async def command(self, line: str) -> str:
        """One runtime API command over the stats socket; its answer."""
        reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
        try:
            writer.write(line.encode() + b"\n")
            await writer.drain()
            return (await reader.read()).decode()
        finally:
            writer.close()

    async def set_state(self, slot: str, state: str) -> None:
        """``ready``, ``drain`` or ``maint`` in both backends."""
        for backend in BACKENDS:
            answer = await self.command(f"set server {backend}/{slot} state {state}")
            if answer.strip():
                raise RuntimeError(f"haproxy: {answer.strip()}")

    async def cut(self, slot: str) -> None:
        """Close every connection HAProxy holds to ``slot`` (both backends): its devices
        reconnect through the balancer, the replica keeps their (detached) sessions."""
        for backend in BACKENDS:
            await self.command(f"shutdown sessions server {backend}/{slot}")

    async def point(self, slot: str, ports: dict[str, int], host: str = "127.0.0.1") -> None:
        """Re-point ``slot`` at a new replica (its health check too), then put it in rotation."""
        for backend, key in zip(BACKENDS, ("ws", "grpc"), strict=True):
            for cmd in (
                f"set server {backend}/{slot} addr {host} port {ports[key]}",
                f"set server {backend}/{slot} check-port {ports['http']}",
            ):
                answer = (await self.command(cmd)).strip()
                if answer and "changed" not in answer and "updated" not in answer:
                    raise RuntimeError(f"haproxy: {cmd}: {answer}")
        await self.set_state(slot, "ready")

    async def servers(self) -> dict[str, dict[str, str]]:
        """Per ``backend/slot``: status and current sessions (``show stat``)."""
        text = await self.command("show stat")
        lines = [line for line in text.splitlines() if line]
        head = lines[0].lstrip("# ").split(",")
        out: dict[str, dict[str, str]] = {}
        for line in lines[1:]:
            row = dict(zip(head, line.split(","), strict=False))
            if row.get("pxname") in BACKENDS and row.get("svname") in SLOTS:
                out[f"{row['pxname']}/{row['svname']}"] = {
                    "status": row.get("status", ""),
                    "scur": row.get("scur", ""),
                }
        return out
