"""Kubernetes API configuration and error type, plus a minimal HTTP client on asyncio streams.

The bridge's own calls (its Pod, the watch on it, ResourceClaims, ResourceSlices, Events) go through
lightkube (:mod:`bridge.resources.kubelight`). This module keeps what both need and what tools use:
:class:`KubeConfig` (:meth:`KubeConfig.resolve`: the setting ``kube_api``, e.g. the local stand-in
``loadgen.kubesim``, or the in-cluster service account: ``KUBERNETES_SERVICE_HOST``/``_PORT``,
token and CA under ``/var/run/secrets/kubernetes.io/serviceaccount``), :class:`KubeError`, the
pod reference, the Event body, and :class:`KubeClient` (GET/POST/PATCH and JSON-lines watches over
HTTP/1.1, ``Connection: close`` per request), which the tests use to drive the stand-in. Without
an API configured there is no cluster: the Pod source is absent, which is not an error.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from bridge.config.settings import env_name

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# The variables a parent process sets for a bridge child (read by bridge.config.settings, not here).
ENV_API = env_name("kube_api")
ENV_TOKEN_FILE = env_name("kube_token_file")
ENV_POD_NAME = env_name("pod_name")
ENV_POD_NAMESPACE = env_name("pod_namespace")
MAX_BODY = 64 << 20  # a Pod or slice list is KiBs; bound what a broken server can make us hold


class KubeError(Exception):
    """A non-2xx answer (``status``) or a transport failure (``status`` 0)."""

    def __init__(self, status: int, message: str, body: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.body = dict(body or {})


@dataclass(frozen=True, slots=True)
class KubeConfig:
    base_url: str
    token_file: str | None = None
    ca_file: str | None = None

    @classmethod
    def resolve(
        cls,
        api: str = "",
        token_file: str = "",
        *,
        env: Mapping[str, str] | None = None,
        sa_dir: str = SA_DIR,
    ) -> KubeConfig | None:
        """``api`` (settings ``kube_api``/``kube_token_file``) when given, else the in-cluster
        service account (``KUBERNETES_SERVICE_*`` set by the kubelet), else None."""
        if api:
            return cls(api.rstrip("/"), token_file or None)
        env = os.environ if env is None else env
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        token = os.path.join(sa_dir, "token")
        if host and os.path.exists(token):
            if ":" in host and not host.startswith("["):
                host = f"[{host}]"
            ca = os.path.join(sa_dir, "ca.crt")
            return cls(f"https://{host}:{port}", token, ca if os.path.exists(ca) else None)
        return None


def own_pod(name: str, namespace: str) -> tuple[str, str] | None:
    """(namespace, name) from the settings ``pod_name``/``pod_namespace`` (the downward API sets
    their environment variables), or ``None`` outside a pod."""
    return (namespace, name) if name and namespace else None


@dataclass(slots=True)
class _Response:
    status: int
    reason: str
    headers: dict[str, str]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, honouring chunked encoding, Content-Length or EOF."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await self.reader.readline()
                if not size_line:
                    raise KubeError(0, "connection closed inside a chunked body")
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    await self.reader.readline()  # trailing CRLF (no trailers expected)
                    return
                data = await self.reader.readexactly(size)
                await self.reader.readexactly(2)
                yield data
        elif "content-length" in self.headers:
            n = int(self.headers["content-length"])
            if n > MAX_BODY:
                raise KubeError(self.status, f"body of {n} bytes exceeds {MAX_BODY}")
            if n:
                yield await self.reader.readexactly(n)
        else:
            while data := await self.reader.read(65536):
                yield data

    async def body(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        async for c in self.chunks():
            total += len(c)
            if total > MAX_BODY:
                raise KubeError(self.status, f"body exceeds {MAX_BODY} bytes")
            parts.append(c)
        return b"".join(parts)

    def close(self) -> None:
        self.writer.close()


class KubeClient:
    """One connection per request; safe to share between tasks."""

    def __init__(self, config: KubeConfig, *, timeout: float = 10.0) -> None:
        self.config = config
        self.timeout = timeout
        url = urllib.parse.urlsplit(config.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"unsupported API URL {config.base_url!r}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._prefix = url.path.rstrip("/")
        self._host_header = url.netloc
        self._ssl: ssl.SSLContext | None = None
        if url.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=config.ca_file)

    def _auth(self) -> str | None:
        if self.config.token_file is None:
            return None
        with open(self.config.token_file, encoding="ascii") as f:
            return f.read().strip()

    async def _open(
        self, method: str, path: str, body: bytes | None, content_type: str
    ) -> _Response:
        async with asyncio.timeout(self.timeout):
            reader, writer = await asyncio.open_connection(
                self._host,
                self._port,
                ssl=self._ssl,
                server_hostname=self._host if self._ssl else None,
            )
        try:
            lines = [
                f"{method} {self._prefix}{path} HTTP/1.1",
                f"Host: {self._host_header}",
                "Accept: application/json",
                "User-Agent: simbridge-resources",
                "Connection: close",
            ]
            token = self._auth()
            if token:
                lines.append(f"Authorization: Bearer {token}")
            if body is not None:
                lines += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
            await writer.drain()
            headers: dict[str, str] = {}
            async with asyncio.timeout(self.timeout):
                status_line = await reader.readline()
                parts = status_line.decode("latin-1").split(" ", 2)
                if len(parts) < 2 or not parts[0].startswith("HTTP/"):
                    raise KubeError(0, f"bad status line {status_line!r}")
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = line.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
            reason = parts[2].strip() if len(parts) > 2 else ""
            return _Response(int(parts[1]), reason, headers, reader, writer)
        except BaseException:
            writer.close()
            raise

    async def request(
        self,
        method: str,
        path: str,
        obj: object | None = None,
        *,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """Send ``obj`` as JSON, return the decoded JSON answer; :class:`KubeError` on >= 400."""
        body = None if obj is None else json.dumps(obj).encode()
        try:
            resp = await self._open(method, path, body, content_type)
            try:
                async with asyncio.timeout(self.timeout):
                    raw = await resp.body()
            finally:
                resp.close()
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
            raise KubeError(0, f"{method} {path}: {e!r}") from e
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw[:200].decode("utf-8", "replace")}
        if not isinstance(data, dict):
            data = {"items": data}
        if resp.status >= 400:
            raise KubeError(resp.status, str(data.get("message") or resp.reason), data)
        return data

    async def get(self, path: str) -> dict[str, Any]:
        return await self.request("GET", path)

    async def post(self, path: str, obj: object) -> dict[str, Any]:
        return await self.request("POST", path, obj)

    async def patch(
        self, path: str, obj: object, content_type: str = "application/strategic-merge-patch+json"
    ) -> dict[str, Any]:
        return await self.request("PATCH", path, obj, content_type=content_type)

    async def watch(self, path: str) -> AsyncIterator[dict[str, Any]]:
        """Yield each watch event (``{"type": ..., "object": ...}``) until the server ends the
        stream. Lines may span chunks; an answer >= 400 raises :class:`KubeError`."""
        try:
            resp = await self._open("GET", path, None, "application/json")
        except (OSError, TimeoutError) as e:
            raise KubeError(0, f"watch {path}: {e!r}") from e
        try:
            if resp.status >= 400:
                async with asyncio.timeout(self.timeout):
                    raw = await resp.body()
                raise KubeError(resp.status, raw[:200].decode("utf-8", "replace"))
            buf = b""
            async for chunk in resp.chunks():
                buf += chunk
                if len(buf) > MAX_BODY:
                    raise KubeError(resp.status, "watch line too long")
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        if isinstance(event, dict):
                            yield event
        except (OSError, asyncio.IncompleteReadError) as e:
            raise KubeError(0, f"watch {path}: {e!r}") from e
        finally:
            resp.close()


# ---------------------------------------------------------------------------------- paths


def pod_path(namespace: str, name: str) -> str:
    q = urllib.parse.quote
    return f"/api/v1/namespaces/{q(namespace)}/pods/{q(name)}"


def pod_watch_path(namespace: str, name: str, resource_version: str | None = None) -> str:
    params = {
        "watch": "true",
        "fieldSelector": f"metadata.name={name}",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "300",
    }
    if resource_version:
        params["resourceVersion"] = resource_version
    ns = urllib.parse.quote(namespace)
    return f"/api/v1/namespaces/{ns}/pods?{urllib.parse.urlencode(params)}"


def claim_path(namespace: str, name: str) -> str:
    q = urllib.parse.quote
    return f"/apis/resource.k8s.io/v1/namespaces/{q(namespace)}/resourceclaims/{q(name)}"


def slices_path(node_name: str | None = None) -> str:
    base = "/apis/resource.k8s.io/v1/resourceslices"
    if node_name:
        return base + "?" + urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node_name}"})
    return base


def event_body(
    *,
    namespace: str,
    pod_name: str,
    pod_uid: str,
    reason: str,
    message: str,
    now_iso: str,
    event_type: str = "Warning",
    suffix: str,
) -> dict[str, Any]:
    """A core/v1 Event about our own Pod (the classic shape kubectl describe shows)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod_name}.{suffix}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod_name,
            "namespace": namespace,
            "uid": pod_uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": "simbridge"},
        "reportingComponent": "simbridge",
        "reportingInstance": pod_name,
        "firstTimestamp": now_iso,
        "lastTimestamp": now_iso,
        "count": 1,
    }
