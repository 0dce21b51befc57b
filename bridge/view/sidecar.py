"""``simbridge view`` as a child process next to another program, fed by a :class:`ViewFeed`.

Why: the load generator's demo keeps its own reference sink (the delivery accounting) and still
wants a live page and an MCAP record of what was delivered. :class:`ViewSidecar` starts the view
on free ports, tees frames to it, tells where to look, and stops it with SIGTERM so the MCAP
files are finished with their summaries and watermarks. The child runs at a lower CPU priority
(``nice``): on a busy machine it is the viewer that falls behind (its feed drops, counted), not
the program it watches.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from bridge.view.feed import ViewFeed


class ViewSidecar:
    def __init__(
        self, mcap_dir: Path, log_path: Path, *, web_port: int = 0, nice: int = 10
    ) -> None:
        self.mcap_dir = mcap_dir
        self.nice = nice
        self.log_path = log_path
        self.web_port = web_port
        self.proc: subprocess.Popen[str] | None = None
        self.ports: dict[str, int] = {}
        self.feed: ViewFeed | None = None

    def start(self) -> None:
        """Start the child and wait for its ready line (raises RuntimeError if it fails)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            nice = ["nice", "-n", str(self.nice)] if self.nice and shutil.which("nice") else []
            self.proc = subprocess.Popen(
                [*nice, sys.executable, "-m", "bridge.cli", "view", "--listen", "127.0.0.1:0",
                 "--foxglove-port", "0", "--web-port", str(self.web_port), "--no-fsync",
                 "--mcap", str(self.mcap_dir)],
                stdout=subprocess.PIPE, stderr=log, text=True, env=dict(os.environ),
            )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the child prints it within a second or two
        if not line.startswith("SIMBRIDGE_VIEW_READY"):
            self.stop()
            raise RuntimeError(f"simbridge view did not start (see {self.log_path})")
        self.ports = {k: int(v) for k, v in (w.split("=") for w in line.split()[1:])}
        self.feed = ViewFeed(f"127.0.0.1:{self.ports['grpc']}")

    def hook(self, mode: str, frame: Any) -> None:
        """A frame hook for the load generator: topics become ``/<mode>/<device>/<stream>``."""
        if self.feed is not None:
            self.feed.offer(frame, device_prefix=f"{mode}/")

    def where(self) -> list[str]:
        return [
            f"live page:  http://127.0.0.1:{self.ports.get('web', 0)}/",
            f"Foxglove:   open connection -> ws://127.0.0.1:{self.ports.get('foxglove', 0)}",
            f"MCAP files: {self.mcap_dir}/ (open them in Foxglove)",
        ]

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None
