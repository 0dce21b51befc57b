"""One frozen settings object: flags > env ``BRIDGE_*`` > optional config file > defaults.

Every field is keyword-only, grouped by concern; sizes are in bytes, durations in float seconds,
named so. :func:`load` reports every invalid value at once (a :class:`ConfigError`), never just
the first one, so an operator fixes a config in one round.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from bridge.config.credentials import read_device_tokens
from bridge.config.pemfiles import ca_problem as pem_ca_problem
from bridge.config.pemfiles import pair_problems as pem_pair_problems
from bridge.config.settings_help import flag_help
from bridge.protocol.errors import ConfigError

MiB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Settings:
    # Listeners (port 0 = pick a free port; the bound port is logged and exposed)
    host: str = "0.0.0.0"
    ws_port: int = 8080
    grpc_port: int = 9090
    http_port: int = 9100
    # SO_REUSEPORT on the WebSocket and gRPC listeners: off, so a second process on the same
    # ports fails to start instead of silently taking half of the connections (gRPC's own
    # default is on); on only for several ingest processes sharing ports (docs/scaling.md).
    reuse_port: bool = False
    # Ingest processes in the pod (docs/scaling.md "Processes in a pod"): auto (one per whole
    # core of the CPU quota, re-planned live on resize), N (exactly N) or max:K (auto, at most K).
    # 1 runs the bridge as a single process with no supervisor.
    processes: str = "auto"
    pod_claim_timeout_seconds: float = 5.0  # > release timeout + 1 s (a hung owner is passed over)
    pod_release_timeout_seconds: float = 2.0  # an owner delivers a moving device's frames within
    pod_restart_backoff_max_seconds: float = 30.0  # a crashed process restarts after 0.5 s, 1 s..
    pod_crash_loop_restarts: int = 5  # this many crashes within 60 s: not ready until one holds
    # Limits
    max_frame_bytes: int = 16 * MiB
    max_points: int = 4_000_000
    max_streams_per_session: int = 64
    max_sessions: int = 1024
    max_subscribers: int = 64
    subscriber_queue_frames: int = 256
    # Rings
    ring_budget_bytes: int = 512 * MiB  # with adapt: only when memory is unlimited
    overflow_policy: str = "backpressure"  # backpressure | drop_oldest
    # Processing
    workers: int = 0  # 0 = from the CPU quota / affinity
    worker_depth: int = 2
    decimate_backend: str = "auto"  # auto | cuda | c | numpy
    voxel_size: float = 0.05
    passthrough: bool = False
    # Egress
    sink_address: str = ""  # host:port of a VisualizationSink; empty = no sink (auto-ack)
    bridge_id: str = ""  # names this bridge on its push streams; empty = Pod name or host-pid
    sink_backoff_initial_seconds: float = 0.1
    sink_backoff_max_seconds: float = 5.0
    sink_handshake_timeout_seconds: float = 5.0
    # Timeouts
    ping_interval_seconds: float = 20.0
    ping_timeout_seconds: float = 20.0
    ack_interval_seconds: float = 0.01  # acks to edges are coalesced over this interval
    ack_accepted_delay_seconds: float = 0.05  # an accepted-only ack waits for a delivered one
    session_ttl_seconds: float = 300.0
    drain_grace_seconds: float = 20.0
    reconnect_after_ms: int = 1000
    # Resources
    cgroup_poll_seconds: float = 0.05
    resize_pending_timeout_seconds: float = 60.0  # raise an Event when a resize pends this long
    adapt: bool = True  # re-plan workers / ring budgets / GPU from the limits the pod has
    cgroup_root: str = ""  # a cgroup directory to watch instead of the own one (tests, demo)
    kube_api: str = ""  # Kubernetes API base URL; empty = the in-cluster service account
    kube_token_file: str = ""  # bearer token file for kube_api (re-read on every request)
    pod_name: str = ""  # the own Pod (downward API); both empty = not watched
    pod_namespace: str = ""
    container_name: str = ""  # the bridge's container in the Pod; empty = "bridge", else the first
    cuda_lib: str = ""  # the CUDA library to load; empty = _sbv_cuda.so next to the package
    # Operations
    tune_allocator: bool = True  # glibc: frames from the heap, trimmed after planned shrinks
    heap_trim_idle_seconds: float = 10.0  # free heap below the budget is trimmed after this long
    log_format: str = "text"  # text | json
    log_level: str = "INFO"
    auth_token: str = ""  # optional bearer token required from edges (Hello.auth_token / header)
    # TLS (PEM files; empty = plaintext). The server pair serves WSS and gRPC; a client CA makes
    # edges present certificates (mTLS). The sink trio makes the push connection TLS / mTLS.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    sink_ca_file: str = ""
    sink_cert_file: str = ""
    sink_key_file: str = ""
    # Hardening: who may read, how long a connection may stay anonymous, what a message may cost
    viewer_token: str = ""  # bearer token for Subscribe; empty = auth_token
    bind_device_to_certificate: bool = False  # mTLS: device id must be a name in the cert
    device_tokens_file: str = (
        ""  # per-device tokens (bridge/config/credentials.py); reloaded on change
    )
    device_tokens_check_seconds: float = 1.0  # at most one stat of that file per this long
    metrics_auth: str = "token"  # with auth on, /metrics needs the token (token) or not (open)
    hello_timeout_seconds: float = 5.0  # a connection must say Hello within this
    max_pending_connections: int = 256  # connections that have not said Hello yet
    max_telemetry_bytes: int = 1 * MiB  # a telemetry payload (blob + map) above this is refused
    max_telemetry_entries: int = 4096  # telemetry map entries
    max_cloud_fields: int = 256  # fields one PointCloud may declare (Python work per field)
    sink_ack_timeout_seconds: float = 10.0  # frames in flight with no ack progress: reconnect
    # HTTP/2 pings on an idle push channel; gRPC servers refuse pings more often than every
    # 5 min unless they allow it (GOAWAY too_many_pings), so lower it only for sinks that do
    sink_keepalive_seconds: float = 300.0
    # Consecutive frames per PushBatch message to the sink (bytes, frames); 0 bytes = one frame
    # per Push message. Sinks without PushBatch get Push whatever this says.
    sink_batch_bytes: int = 256 * 1024
    sink_batch_frames: int = 64
    max_batch_frames: int = 256  # frames per FrameBatch from an edge (0 = refuse batches)
    # HTTP/2 receive window of each gRPC ingest call (fixed, no BDP probing): what an edge may
    # send ahead of our reads. Each open call is charged this much to the memory budget.
    grpc_window_bytes: int = 64 * 1024
    # Incomplete chunked frames (docs/protocol.md §3.2). A 16 MiB frame takes 6.7 s over a
    # 20 Mbit/s uplink; the age leaves twice that. A connection that holds incomplete frames for
    # chunk_stall_seconds in all since it last completed one is closed (longer than the age, so
    # a frame paused mid-way is only dropped, not its connection).
    chunk_max_age_seconds: float = 15.0
    chunk_stall_seconds: float = 30.0
    chunk_check_interval_seconds: float = 0.25
    # Decoded bytes of refused codec decodes a connection may cost beyond what it decoded
    # successfully before it is closed (docs/protocol.md §4.1): two refused 16 MiB clouds.
    refused_decode_budget_bytes: int = 32 * MiB

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def public_dict(self) -> dict[str, Any]:
        """Settings as a dict, secrets masked (for logs and /debug)."""
        d = dataclasses.asdict(self)
        for secret in ("auth_token", "viewer_token"):
            if d[secret]:
                d[secret] = "***"
        return d


_CHOICES = {
    "overflow_policy": ("backpressure", "drop_oldest"),
    "decimate_backend": ("auto", "cuda", "c", "numpy"),
    "log_format": ("text", "json"),
    "log_level": ("DEBUG", "INFO", "WARNING", "ERROR"),
    "metrics_auth": ("token", "open"),
}
_PORTS = ("ws_port", "grpc_port", "http_port")
_NON_NEGATIVE = (
    "workers",
    "voxel_size",
    "reconnect_after_ms",
    "sink_batch_bytes",
    "max_batch_frames",
)


def env_name(field: str) -> str:
    """The environment variable of a setting (the one naming rule: ``BRIDGE_`` + upper case)."""
    return f"BRIDGE_{field.upper()}"


# ``BRIDGE_*`` variables that name no setting but are still the project's own: the config file,
# and the build switches setup.py reads (a developer's shell may export them).
_OTHER_ENV = frozenset(
    {
        "BRIDGE_CONFIG",
        "BRIDGE_BUILD_NATIVE",
        "BRIDGE_BUILD_CUDA",
        "BRIDGE_SANITIZE",
        "BRIDGE_CUDA_ARCH",
    }
)


def unknown_env(env: Mapping[str, str] | None = None) -> list[str]:
    """One line per ``BRIDGE_*`` variable that is not a setting: a misspelt name (``BRIDGE_WSPORT``)
    would otherwise be ignored without a word. The closest setting's variable is suggested."""
    env = os.environ if env is None else env
    known = {env_name(f.name) for f in fields(Settings)}
    lines = []
    for key in sorted(env):
        if key.startswith("BRIDGE_") and key not in known and key not in _OTHER_ENV:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            lines.append(f"environment variable {key} is not a setting; ignored{hint}")
    return lines


def _convert(name: str, kind: type, raw: object) -> object:
    if isinstance(raw, kind) and not (kind is int and isinstance(raw, bool)):
        return raw
    text = str(raw).strip()
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}: expected a boolean, got {raw!r}")
    if kind is int:
        return int(text.replace("_", ""))
    if kind is float:
        return float(text)
    return text


def _types() -> dict[str, type]:
    return {
        f.name: {"int": int, "float": float, "bool": bool, "str": str}[str(f.type)]
        for f in fields(Settings)
    }


def read_file(path: Path) -> dict[str, object]:
    """A YAML, TOML or JSON config file whose keys are Settings field names."""
    text = path.read_text()
    if path.suffix == ".toml":
        data: object = tomllib.loads(text)
    elif path.suffix == ".json":
        data = json.loads(text)
    else:
        data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping at the top level"])
    return data


def load(
    flags: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Merge the sources (flags > env > file > defaults) and validate everything at once."""
    env = os.environ if env is None else env
    types = _types()
    problems: list[str] = []
    merged: dict[str, object] = {}
    if config_file is None and env.get("BRIDGE_CONFIG"):
        config_file = Path(env["BRIDGE_CONFIG"])
    if config_file is not None:
        try:
            file_values = read_file(config_file)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            problems.append(f"config file {config_file}: {exc}")
            file_values = {}
        for key, value in file_values.items():
            if key not in types:
                problems.append(f"config file {config_file}: unknown setting {key!r}")
            else:
                merged[key] = value
    for name in types:
        env_key = env_name(name)
        if env_key in env:
            merged[name] = env[env_key]
    for name, value in (flags or {}).items():
        if value is not None:
            merged[name] = value
    values: dict[str, object] = {}
    for name, raw in merged.items():
        try:
            values[name] = _convert(name, types[name], raw)
        except ValueError:
            problems.append(f"{name}: cannot parse {raw!r} as {types[name].__name__}")
    settings = Settings(**values)  # type: ignore[arg-type]
    problems += validate(settings)
    if problems:
        raise ConfigError(problems)
    return settings


def validate(s: Settings) -> list[str]:
    problems = []
    for name, choices in _CHOICES.items():
        value = getattr(s, name)
        if value not in choices:
            problems.append(f"{name}: {value!r} is not one of {', '.join(choices)}")
    for name in _PORTS:
        if not 0 <= getattr(s, name) <= 65535:
            problems.append(f"{name}: {getattr(s, name)} is not a port")
    for name in _NON_NEGATIVE:
        if getattr(s, name) < 0:
            problems.append(f"{name}: must be >= 0")
    for f in fields(Settings):
        value = getattr(s, f.name)
        positive = (
            (f.name.startswith("max_") and f.name not in _NON_NEGATIVE)
            or f.name.endswith("_seconds")
            or f.name
            in (
                "ring_budget_bytes",
                "worker_depth",
                "subscriber_queue_frames",
                "sink_batch_frames",
                "refused_decode_budget_bytes",
            )
        )
        if positive and isinstance(value, int | float) and value <= 0:
            problems.append(f"{f.name}: must be > 0")
    problems += _address_problems(s)
    if s.device_tokens_file:
        try:
            read_device_tokens(s.device_tokens_file)
        except (OSError, ValueError) as exc:
            problems.append(f"device_tokens_file: {exc}")
    if not 16 * 1024 <= s.grpc_window_bytes <= 64 * MiB:
        problems.append("grpc_window_bytes: must be between 16384 (16 KiB) and 64 MiB")
    if s.chunk_stall_seconds < s.chunk_max_age_seconds:
        problems.append("chunk_stall_seconds: must be >= chunk_max_age_seconds")
    if not re.fullmatch(r"auto|max:[1-9][0-9]*|[1-9][0-9]*", s.processes.strip().lower()):
        problems.append(f"processes: expected auto, N or max:K (N, K >= 1), got {s.processes!r}")
    if s.pod_crash_loop_restarts < 1:
        problems.append("pod_crash_loop_restarts: must be >= 1")
    if s.max_cloud_fields < 3:
        problems.append("max_cloud_fields: must be >= 3 (x, y and z)")
    if s.bridge_id and not re.fullmatch(r"[!-~]{1,128}", s.bridge_id):
        problems.append("bridge_id: 1-128 printable ASCII characters, no spaces")
    if s.sink_backoff_initial_seconds > s.sink_backoff_max_seconds:
        problems.append("sink_backoff_initial_seconds: must be <= sink_backoff_max_seconds")
    problems += _tls_problems(s)
    return problems


_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")


def valid_host(host: str) -> bool:
    """An IP literal (v4, v6, optionally bracketed) or a DNS name; no lookup happens here."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(host))


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:port``) into its parts; ValueError says what is wrong."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{address!r} is not host:port")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{address!r}: port must be 1-65535")
    if not valid_host(host):
        raise ValueError(f"{address!r}: {host!r} is not a host name or IP address")
    return host.strip("[]"), int(port_text)


def _address_problems(s: Settings) -> list[str]:
    problems = []
    if not valid_host(s.host):
        problems.append(f"host: {s.host!r} is not a host name or IP address")
    if s.sink_address:
        try:
            split_address(s.sink_address)
        except ValueError as exc:
            problems.append(f"sink_address: {exc}")
    bound = [(name, getattr(s, name)) for name in _PORTS if getattr(s, name)]
    for i, (name, port) in enumerate(bound):
        for other, other_port in bound[:i]:
            if port == other_port:
                problems.append(f"{name}: port {port} is also {other}")
    return problems


_PEM_FILES = (
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
    "sink_ca_file",
    "sink_cert_file",
    "sink_key_file",
)


def _tls_problems(s: Settings) -> list[str]:
    problems = []
    for a, b in (("tls_cert_file", "tls_key_file"), ("sink_cert_file", "sink_key_file")):
        if bool(getattr(s, a)) != bool(getattr(s, b)):
            problems.append(f"{a} and {b}: set both or neither")
    if s.bind_device_to_certificate and not s.tls_client_ca_file:
        problems.append("bind_device_to_certificate: needs tls_client_ca_file (mTLS)")
    if s.tls_client_ca_file and not s.tls_cert_file:
        problems.append("tls_client_ca_file: needs tls_cert_file/tls_key_file (a TLS server)")
    if s.sink_cert_file and not s.sink_ca_file:
        problems.append("sink_cert_file: mTLS to the sink also needs sink_ca_file")
    for name in _PEM_FILES:
        path = getattr(s, name)
        if path and not Path(path).is_file():
            problems.append(f"{name}: {path} is not a readable file")
    return problems + _pem_problems(s)


def _pem_problems(s: Settings) -> list[str]:
    """The contents of the PEM files that exist, read as gRPC and the ssl module will read them."""
    present = {name for name in _PEM_FILES if getattr(s, name) and Path(getattr(s, name)).is_file()}
    problems = []
    for cert, key in (("tls_cert_file", "tls_key_file"), ("sink_cert_file", "sink_key_file")):
        if {cert, key} <= present:
            problems += pem_pair_problems(cert, getattr(s, cert), key, getattr(s, key))
    for ca in ("tls_client_ca_file", "sink_ca_file"):
        problem = pem_ca_problem(ca, getattr(s, ca)) if ca in present else None
        if problem is not None:
            problems.append(problem)
    return problems


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per setting (defaults None so unset flags do not override env/file)."""
    defaults = Settings()
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        kind = _types()[f.name]
        help_text = flag_help(f.name, getattr(defaults, f.name), _CHOICES.get(f.name))
        if kind is bool:
            parser.add_argument(
                flag,
                dest=f.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag,
                dest=f.name,
                default=None,
                type=str,
                metavar=kind.__name__.upper(),
                help=help_text,
            )
    parser.add_argument(
        "--config", type=Path, default=None, help="YAML/TOML/JSON config file (env BRIDGE_CONFIG)"
    )


def from_args(ns: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    flags = {f.name: getattr(ns, f.name, None) for f in fields(Settings)}
    return load(flags, env, getattr(ns, "config", None))
