"""simbridge's edge SDK: connect a device to a bridge and publish point clouds and telemetry.

    from bridge.client import EdgeClient, StreamSpec

    streams = [StreamSpec("lidar"), StreamSpec("status", kind="telemetry")]
    async with EdgeClient("ws://127.0.0.1:8080/v1/ingest", device_id="robot-1",
                          streams=streams) as edge:
        await edge.publish("lidar", points)              # NumPy (n, 3) float32 or structured array
        await edge.publish("status", {"battery": 0.8})
        await edge.drain(timeout=10)

The client keeps every frame until the bridge reports it delivered, resumes after reconnects
without loss or duplicates, honours PAUSE/RESUME and Drain, and speaks WebSocket (``ws://``,
``wss://``) or gRPC (``grpc://``, ``grpcs://``). :class:`SyncEdgeClient` is the blocking facade.
A refusal no retry can pass (a wrong token, say) stops it at once: ``start``, ``publish`` and
``drain`` raise :class:`BridgeRefused` with the bridge's code and words.

Modules: ``payload`` (encoding, sans-I/O), ``core`` (protocol state, sans-I/O), ``transport``
(WebSocket / gRPC), ``client`` (asyncio), ``sender`` (one connection's send loop), ``sync``
(blocking facade).
"""

from bridge.client.client import ClientClosed, DeliveryTimeout, EdgeClient
from bridge.client.core import EdgeCore, EdgeStats, StreamSpec
from bridge.client.payload import PreparedPayload
from bridge.client.refusal import BridgeRefused
from bridge.client.sync import SyncEdgeClient
from bridge.client.transport import TlsConfig

__all__ = [
    "BridgeRefused",
    "ClientClosed",
    "DeliveryTimeout",
    "EdgeClient",
    "EdgeCore",
    "EdgeStats",
    "PreparedPayload",
    "StreamSpec",
    "SyncEdgeClient",
    "TlsConfig",
]
