"""The data plane: transports (WebSocket, gRPC, ops HTTP), ingest, admission, the sans-I/O core
and its rings, processing, delivery to the sink, the memory governor and live adaptation.
Imports ``bridge.protocol``, ``bridge.config``, ``bridge.decimate`` and ``bridge.resources``;
nothing outside the server imports it but the CLI that starts it."""
