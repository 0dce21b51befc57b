"""A trivial HTTP server in a process of its own (standard library only): the control the
``/healthz`` probe measures beside the bridge. When it too answers slowly, the host was busy, not
the bridge. Prints its port, then answers every connection ``200 ok`` (after DELAY_S seconds:
a slow server, for the probe's own tests).

    python -m benchmarks.container.null_http [DELAY_S]
"""

from __future__ import annotations

import socket
import sys
import time

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"


def main() -> None:
    delay_s = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    server = socket.create_server(("127.0.0.1", 0))
    print(server.getsockname()[1], flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(2.0)
            try:
                conn.recv(1024)
                if delay_s:
                    time.sleep(delay_s)
                conn.sendall(RESPONSE)
            except OSError:
                pass


if __name__ == "__main__":
    main()
