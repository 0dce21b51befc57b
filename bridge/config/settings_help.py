"""What each setting means, for ``simbridge serve --help`` (one entry per Settings field).

Kept beside :mod:`bridge.config.settings` rather than in it so that the settings module stays about
loading and validating; a unit test fails when a field has no entry here.
"""

from __future__ import annotations

from collections.abc import Sequence

HELP: dict[str, str] = {
    "host": "address the WebSocket, gRPC and HTTP listeners bind to",
    "ws_port": "WebSocket ingest port (path /v1/ingest); 0 picks a free port",
    "grpc_port": "gRPC port: Ingest, Visualization.Subscribe, grpc.health.v1; 0 picks a free port",
    "http_port": "HTTP port: /metrics, /healthz, /readyz, /debug/resources; 0 picks a free port",
    "reuse_port": "let several processes bind the same WebSocket and gRPC ports (SO_REUSEPORT; "
    "off: a port in use is a startup error, for gRPC too)",
    "processes": "ingest processes: auto (one per whole core of the CPU quota, re-planned live), "
    "N, or max:K; 1 = a single process, no supervisor",
    "pod_claim_timeout_seconds": "a Hello waits at most this long for the process owning its "
    "device to let it go",
    "pod_release_timeout_seconds": "a process letting a device go delivers that device's "
    "buffered frames within this, then drops the rest (the edge resends them)",
    "pod_restart_backoff_max_seconds": "longest wait before a crashed ingest process restarts",
    "pod_crash_loop_restarts": "crashes within 60 s that mark the pod not ready",
    "max_frame_bytes": "largest message accepted on either transport, in bytes",
    "max_points": "most points in one cloud",
    "max_streams_per_session": "most streams one edge may declare in its Hello",
    "max_sessions": "most attached sessions (and, separately, detached ones kept for resume)",
    "max_subscribers": "most Visualization.Subscribe viewers at once",
    "subscriber_queue_frames": "frames queued per viewer before it gets slow_subscriber gaps",
    "ring_budget_bytes": "bytes all stream rings share; with adapt, used only when memory is "
    "unlimited (otherwise planned from the memory limit)",
    "overflow_policy": "default per-stream policy when a ring is full: backpressure pauses the "
    "edge and never drops; drop_oldest evicts, counts and announces a gap",
    "workers": "decimation worker threads (0 = from the CPU quota, re-planned live)",
    "worker_depth": "frames queued per worker",
    "decimate_backend": "decimation backend; auto picks cuda > c > numpy; an explicit backend "
    "that is unavailable is a startup error",
    "voxel_size": "default voxel edge for streams whose Hello does not set one (cloud units)",
    "passthrough": "do not decimate: relay clouds as received",
    "sink_address": "host:port of the VisualizationSink to push to (empty = no sink; frames count "
    "as delivered once offered to subscribers)",
    "bridge_id": "this bridge's name on its push streams (metadata x-simbridge-bridge), so a "
    "sink tells replicas' bridge_seq apart; empty = the Pod name, else hostname-pid",
    "sink_backoff_initial_seconds": "first reconnect delay to the sink",
    "sink_backoff_max_seconds": "longest reconnect delay to the sink (exponential, with jitter)",
    "sink_handshake_timeout_seconds": "how long the sink has to send its watermarks on a new "
    "Push stream",
    "ping_interval_seconds": "WebSocket/gRPC keepalive ping interval",
    "ping_timeout_seconds": "close a connection whose ping is unanswered this long",
    "ack_interval_seconds": "acks to an edge are coalesced over this interval",
    "ack_accepted_delay_seconds": "an accepted-only ack waits this long for a delivered one",
    "session_ttl_seconds": "how long a detached session is kept for resume",
    "drain_grace_seconds": "after SIGTERM, how long to deliver what is buffered before exiting",
    "reconnect_after_ms": "reconnect delay the Drain message tells edges",
    "cgroup_poll_seconds": "how often the cgroup limit files are read (they raise no events)",
    "resize_pending_timeout_seconds": "raise an Event and bridge_resize_pending when an in-place "
    "resize stays pending this long",
    "adapt": "re-plan workers, ring budgets and GPU batches live from the limits the pod has",
    "tune_allocator": "glibc: serve frames from the heap and trim it after planned ring shrinks",
    "heap_trim_idle_seconds": "free heap pages (freed frames) below the data budget are given "
    "back once they have sat unused this long; past the budget they go within a second",
    "log_format": "log format; json = one object per line on stderr (and a JSON ready line)",
    "log_level": "log level",
    "auth_token": "bearer token edges must present (Hello.auth_token or Authorization: Bearer); "
    "empty = no authentication",
    "cgroup_root": "a cgroup directory to watch instead of the bridge's own (tests, the demo)",
    "kube_api": "Kubernetes API base URL; empty = the in-cluster service account",
    "kube_token_file": "bearer token file for kube_api (re-read on every request)",
    "pod_name": "the bridge's own Pod (downward API); with pod_namespace, its resize is watched",
    "pod_namespace": "namespace of pod_name",
    "container_name": "the bridge's container in the Pod; empty = 'bridge', else the first",
    "cuda_lib": "the CUDA decimation library to load; empty = _sbv_cuda.so next to the package",
    "viewer_token": "bearer token Visualization.Subscribe needs (gRPC authorization metadata); "
    "empty = auth_token",
    "bind_device_to_certificate": "with mTLS: a Hello's device id must be the client "
    "certificate's CN or one of its subject alternative names (and may then take over its "
    "own live session)",
    "device_tokens_file": "file of 'DEVICE_ID sha256:HEX' lines: each device proves its id with "
    "its own token (re-read when it changes); auth_token, if set, is still accepted",
    "device_tokens_check_seconds": "device_tokens_file is looked at (one stat) at most once per "
    "this long; a changed file is read and parsed once, a bad one keeps the last good entries",
    "metrics_auth": "with auth_token set: /metrics needs the token (token) or is open for "
    "Prometheus (open); /debug/* always needs it",
    "hello_timeout_seconds": "a connection must send Hello within this (also the gRPC "
    "HTTP/2 handshake deadline)",
    "max_pending_connections": "most connections that have not sent Hello yet",
    "max_telemetry_bytes": "largest telemetry payload, checked before it is parsed",
    "max_telemetry_entries": "most entries in a telemetry map",
    "max_cloud_fields": "most fields one point cloud may declare; more is INVALID_LAYOUT, "
    "refused before any work per field",
    "sink_batch_bytes": "bytes of consecutive frames per PushBatch message to the sink "
    "(0 = one frame per Push message)",
    "sink_batch_frames": "most frames per PushBatch message to the sink",
    "max_batch_frames": "most frames an edge may put in one FrameBatch (0 = batches refused)",
    "grpc_window_bytes": "HTTP/2 receive window of each gRPC ingest call (16 KiB-64 MiB): how "
    "far an edge may send ahead of the bridge's reads; charged to the memory budget per call",
    "chunk_max_age_seconds": "an incomplete chunked frame is dropped (CHUNK_ABANDONED) this "
    "long after its first piece, whether or not more pieces come",
    "chunk_stall_seconds": "a connection that has held incomplete chunked frames this long in "
    "all since a piece last completed a frame is closed (fatal CHUNK_ABANDONED); at least "
    "chunk_max_age_seconds",
    "chunk_check_interval_seconds": "how often a connection holding incomplete chunked frames "
    "checks their age, its fair share of memory and its stall deadline",
    "refused_decode_budget_bytes": "decoded bytes of refused codec decodes one connection may "
    "cost beyond what it decoded successfully; past it the connection is closed (fatal "
    "CODEC_ERROR)",
    "sink_ack_timeout_seconds": "frames in flight to the sink with no ack progress for this "
    "long: the push stream is reset and replayed",
    "sink_keepalive_seconds": "HTTP/2 keepalive ping interval on an idle push channel (gRPC "
    "servers refuse pings more often than every 300 s unless configured to allow them)",
    "tls_cert_file": "PEM certificate chain: serve WSS and TLS gRPC on the ingest ports",
    "tls_key_file": "PEM private key for tls_cert_file",
    "tls_client_ca_file": "PEM CA bundle: edges must present a certificate it signed (mTLS)",
    "sink_ca_file": "PEM CA bundle: connect to the sink over TLS and verify it",
    "sink_cert_file": "PEM client certificate for mTLS to the sink (re-read on every reconnect)",
    "sink_key_file": "PEM private key for sink_cert_file",
}


def flag_help(name: str, default: object, choices: Sequence[str] | None) -> str:
    """``description; one of: a, b (default X; env BRIDGE_NAME)`` for one setting's flag.

    Percent signs are doubled: argparse formats help strings with ``%``.
    """
    parts = [HELP.get(name, name.replace("_", " "))]
    if choices:
        parts.append("one of: " + ", ".join(choices))
    shown = "" if name in ("auth_token", "viewer_token") else repr(default)
    text = "; ".join(parts) + f" (default {shown or 'empty'}; env BRIDGE_{name.upper()})"
    return text.replace("%", "%%")
