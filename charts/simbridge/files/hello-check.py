"""`helm test` check: connect to the bridge's WebSocket ingest, send Hello, expect Welcome.

Runs with the bridge image's own Python (websockets and the generated bridge.v1 protobuf are
installed there). Configured by environment variables set in the test Pod:
SIMBRIDGE_URL (ws:// or wss://), SIMBRIDGE_AUTH_TOKEN, SIMBRIDGE_TIMEOUT_SECONDS, and for wss://
SIMBRIDGE_CA_FILE, SIMBRIDGE_TLS_SERVER_NAME, SIMBRIDGE_CLIENT_CERT_FILE/SIMBRIDGE_CLIENT_KEY_FILE.
Exit status 0 only when a Welcome arrives.
"""

import asyncio
import os
import ssl
import sys
import time

import websockets

from bridge.v1 import bridge_pb2 as pb


def tls_context(env):
    ca = env.get("SIMBRIDGE_CA_FILE") or None
    if ca and not os.path.exists(ca):
        ca = None  # the Secret has no ca.crt: verify against the system roots
    ctx = ssl.create_default_context(cafile=ca)
    cert = env.get("SIMBRIDGE_CLIENT_CERT_FILE")
    if cert:
        ctx.load_cert_chain(cert, env["SIMBRIDGE_CLIENT_KEY_FILE"])
    return ctx


async def check(env):
    url = env["SIMBRIDGE_URL"]
    timeout = float(env.get("SIMBRIDGE_TIMEOUT_SECONDS", "20"))
    kwargs = {"open_timeout": timeout, "compression": None, "max_size": 16 * 2**20}
    if url.startswith("wss://"):
        kwargs["ssl"] = tls_context(env)
        if env.get("SIMBRIDGE_TLS_SERVER_NAME"):
            kwargs["server_hostname"] = env["SIMBRIDGE_TLS_SERVER_NAME"]
    hello = pb.EdgeMessage(
        hello=pb.Hello(
            device_id=f"helm-test-{int(time.time())}",
            auth_token=env.get("SIMBRIDGE_AUTH_TOKEN", ""),
        )
    )
    async with websockets.connect(url, **kwargs) as ws:
        await ws.send(hello.SerializeToString())
        raw = await asyncio.wait_for(ws.recv(), timeout)
    reply = pb.BridgeMessage.FromString(raw)
    kind = reply.WhichOneof("kind")
    if kind != "welcome":
        print(f"FAIL: expected Welcome from {url}, got {kind}: {reply}", file=sys.stderr)
        return 1
    print(f"OK: Welcome from {url} (session {reply.welcome.session_id})")
    return 0


def main():
    try:
        return asyncio.run(check(os.environ))
    except Exception as exc:  # any failure is a failed test, said in one line
        print(f"FAIL: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


sys.exit(main())
