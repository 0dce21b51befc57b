"""TLS end to end with real certificates (made by openssl for the test): WSS and gRPC ingest
with client certificates required (mTLS), and mTLS on the push connection to the sink."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import grpc
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage

from bridge.v1 import bridge_pb2 as pb
from loadgen.sink import SinkServer
from tests.integration.harness import cloud_frame, hello, running_bridge, wait_until

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not found")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(pki: Path, name: str, cn: str, ext: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-subj",
             f"/CN={cn}", "-out", f"{name}.csr", cwd=pki)  # fmt: skip
    (pki / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
             cwd=pki)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pki = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-days", "1", "-subj", "/CN=simbridge-test-ca", cwd=pki)  # fmt: skip
    server_ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    _issue(pki, "server", "127.0.0.1", server_ext)
    _issue(pki, "client", "edge-or-bridge", "extendedKeyUsage=clientAuth\n")
    return pki


async def test_wss_and_grpc_ingest_with_mtls_and_mtls_push_to_the_sink(pki: Path) -> None:
    received: list[pb.ProcessedFrame] = []
    sink_creds = grpc.ssl_server_credentials(
        [((pki / "server.key").read_bytes(), (pki / "server.pem").read_bytes())],
        root_certificates=(pki / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    async with (
        SinkServer(fsync=False, on_frame=received.append, server_credentials=sink_creds) as sink,
        running_bridge(
            passthrough=True,
            sink_address=sink.address,
            tls_cert_file=str(pki / "server.pem"),
            tls_key_file=str(pki / "server.key"),
            tls_client_ca_file=str(pki / "ca.pem"),
            sink_ca_file=str(pki / "ca.pem"),
            sink_cert_file=str(pki / "client.pem"),
            sink_key_file=str(pki / "client.key"),
        ) as bridge,
    ):
        assert bridge.ports is not None
        url = f"wss://127.0.0.1:{bridge.ports.ws}/v1/ingest"
        client_ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        client_ctx.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
        async with connect(url, ssl=client_ctx, compression=None) as ws:
            await ws.send(hello("wss-edge", "lidar").SerializeToString())
            assert pb.BridgeMessage.FromString(await ws.recv(decode=False)).HasField("welcome")
            await ws.send(pb.EdgeMessage(frame=cloud_frame("lidar", 1)).SerializeToString())
            assert await wait_until(lambda: len(received) == 1)

        # Without a client certificate the server refuses the handshake (with TLS 1.3 the client
        # learns it only when the connection drops before the HTTP upgrade answer).
        no_cert = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        with pytest.raises((ssl.SSLError, ConnectionError, OSError, InvalidMessage)):
            async with connect(url, ssl=no_cert, compression=None) as ws:
                await ws.send(hello("anon", "lidar").SerializeToString())
                await ws.recv()

        creds = grpc.ssl_channel_credentials(
            root_certificates=(pki / "ca.pem").read_bytes(),
            private_key=(pki / "client.key").read_bytes(),
            certificate_chain=(pki / "client.pem").read_bytes(),
        )
        async with grpc.aio.secure_channel(f"127.0.0.1:{bridge.ports.grpc}", creds) as channel:
            call = channel.stream_stream(
                "/bridge.v1.Ingest/Connect",
                request_serializer=None,
                response_deserializer=pb.BridgeMessage.FromString,
            )()
            await call.write(hello("grpc-edge", "lidar").SerializeToString())
            assert (await call.read()).HasField("welcome")
            await call.write(pb.EdgeMessage(frame=cloud_frame("lidar", 1)).SerializeToString())
            assert await wait_until(lambda: len(received) == 2)
            call.cancel()
        assert {f.device_id for f in received} == {"wss-edge", "grpc-edge"}
        assert bridge.registry.get_sample_value("bridge_sink_connected") == 1


def test_tls_settings_are_validated(tmp_path: Path) -> None:
    from bridge.config import settings
    from bridge.protocol.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        settings.load(
            {"tls_cert_file": str(tmp_path / "missing.pem"), "sink_cert_file": "x.pem"}, env={}
        )
    text = "\n".join(info.value.problems)
    assert "tls_cert_file and tls_key_file" in text
    assert "sink_cert_file and sink_key_file" in text
    assert "not a readable file" in text


async def test_device_id_bound_to_the_client_certificate(pki: Path) -> None:
    """With ``bind_device_to_certificate`` a device id must be a name in the client certificate
    (here its CN, ``edge-or-bridge``), on both transports."""
    async with running_bridge(
        passthrough=True,
        tls_cert_file=str(pki / "server.pem"),
        tls_key_file=str(pki / "server.key"),
        tls_client_ca_file=str(pki / "ca.pem"),
        bind_device_to_certificate=True,
    ) as bridge:
        assert bridge.ports is not None
        url = f"wss://127.0.0.1:{bridge.ports.ws}/v1/ingest"
        client_ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        client_ctx.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
        for device, expected in (("edge-or-bridge", "welcome"), ("someone-else", "error")):
            async with connect(url, ssl=client_ctx, compression=None) as ws:
                await ws.send(hello(device, "lidar").SerializeToString())
                reply = pb.BridgeMessage.FromString(await ws.recv(decode=False))
                assert reply.WhichOneof("kind") == expected, device
        creds = grpc.ssl_channel_credentials(
            root_certificates=(pki / "ca.pem").read_bytes(),
            private_key=(pki / "client.key").read_bytes(),
            certificate_chain=(pki / "client.pem").read_bytes(),
        )
        async with grpc.aio.secure_channel(f"127.0.0.1:{bridge.ports.grpc}", creds) as channel:
            for device, expected in (("someone-else", "error"), ("edge-or-bridge", "welcome")):
                call = channel.stream_stream(
                    "/bridge.v1.Ingest/Connect",
                    request_serializer=None,
                    response_deserializer=pb.BridgeMessage.FromString,
                )()
                await call.write(hello(device, "lidar").SerializeToString())
                assert (await call.read()).WhichOneof("kind") == expected, device
                call.cancel()
