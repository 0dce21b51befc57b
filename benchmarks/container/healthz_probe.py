"""``GET /healthz`` every PERIOD seconds, one line per probe on stdout:
``t latency_s ok control_latency_s`` (``t`` on ``time.monotonic``, the system-wide clock the
harness shares; the control is -1 without a control port).

Why a process of its own: in a thread of the harness, a probe's timing shared the harness's GIL,
which parses ``/metrics`` every 100 ms. Why a control: on a 2-vCPU VM shared with the attackers,
a trivial server in its own process (:mod:`benchmarks.container.null_http`) sometimes needs
100 ms to answer too; each round probes the bridge and the control at the same instant, so a slow
answer can be told apart from a busy host. Standard library only: it starts in milliseconds.

    python -m benchmarks.container.healthz_probe PORT [PERIOD_S] [TIMEOUT_S] [CONTROL_PORT]
"""

from __future__ import annotations

import selectors
import signal
import socket
import sys
import time

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: rig\r\nConnection: close\r\n\r\n"


def probe(ports: list[int], timeout_s: float) -> list[tuple[float, bool]]:
    """GET each port at once: (seconds to its status line, or ``timeout_s`` if none; 200 or not)
    per port, in order."""
    t0 = time.monotonic()
    sel = selectors.DefaultSelector()
    out: list[tuple[float, bool]] = [(timeout_s, False)] * len(ports)
    socks = []
    for i, port in enumerate(ports):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        sel.register(sock, selectors.EVENT_WRITE, (i, "send"))
        socks.append(sock)
    pending = len(ports)
    try:
        while pending:
            left = timeout_s - (time.monotonic() - t0)
            if left <= 0:
                break
            for key, _ in sel.select(left):
                i, step = key.data
                sock = socks[i]
                try:
                    if step == "send":
                        sock.sendall(REQUEST)
                        sel.modify(sock, selectors.EVENT_READ, (i, "read"))
                        continue
                    head = sock.recv(64)
                    ok = head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200"))
                    out[i] = (time.monotonic() - t0 if ok else timeout_s, ok)
                except OSError:
                    out[i] = (timeout_s, False)
                sel.unregister(sock)
                pending -= 1
    finally:
        for sock in socks:
            sock.close()
        sel.close()
    return out


def main(argv: list[str]) -> int:
    port = int(argv[0])
    period_s = float(argv[1]) if len(argv) > 1 else 0.1
    timeout_s = float(argv[2]) if len(argv) > 2 else 2.0
    control = int(argv[3]) if len(argv) > 3 else 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    next_t = time.monotonic()
    while True:
        t = time.monotonic()
        answers = probe([port, control] if control else [port], timeout_s)
        (latency, ok), ctl = answers[0], (answers[1][0] if control else -1.0)
        sys.stdout.write(f"{t:.6f} {latency:.6f} {int(ok)} {ctl:.6f}\n")
        sys.stdout.flush()
        next_t = max(next_t + period_s, time.monotonic())
        time.sleep(max(0.0, next_t - time.monotonic()))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
