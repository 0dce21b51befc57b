"""kubesim's API server front: HTTP/1.1 on 127.0.0.1 with the routes, discovery documents and watch
stream that the bridge's client and ``kubectl`` use (see :mod:`loadgen.kubesim` for the list).

Why apart: the wire (request parsing, chunked bodies, watch framing) is the only I/O of the API
side; what an answer says comes from :class:`~loadgen.kubesim.model.PodStore`.
"""

from __future__ import annotations

import asyncio
import copy
import http
import json
import urllib.parse

from loadgen.kubesim.kubelet import Kubelet
from loadgen.kubesim.model import JSON, PodStore, status_error


class ApiServer:
    """Serves one :class:`PodStore`; a resize PATCH waits for the kubelet's lock."""

    def __init__(self, store: PodStore, kubelet: Kubelet) -> None:
        self.store = store
        self.kubelet = kubelet
        self.port = 0
        self.requests_seen: list[tuple[str, str]] = []
        self.last_authorization: str | None = None
        self._watches: list[asyncio.Queue[JSON | None]] = []
        self._server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def close(self) -> None:
        """Stop listening and end every watch (connections in flight finish on their own)."""
        self.end_watches()
        if self._server is not None:
            self._server.close()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def end_watches(self) -> None:
        for q in self._watches:
            q.put_nowait(None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                parts = line.decode("latin-1").strip().split(" ")
                if len(parts) != 3:
                    await self._send(
                        writer, 400, status_error(400, "BadRequest", "bad request line")
                    )
                    return
                method, target, _ = parts
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                elif "chunked" in headers.get("transfer-encoding", ""):
                    body = await _read_chunked(reader)
                url = urllib.parse.urlsplit(target)
                query = dict(urllib.parse.parse_qsl(url.query))
                self.requests_seen.append((method, target))
                self.last_authorization = headers.get("authorization")
                if method == "GET" and query.get("watch") in ("true", "1"):
                    await self._watch(writer, url.path, query)
                    return
                code, obj = await self._route(method, url.path, query, headers, body)
                await self._send(writer, code, obj)
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, code: int, obj: JSON) -> None:
        payload = json.dumps(obj).encode()
        reason = http.HTTPStatus(code).phrase
        head = (
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nCache-Control: no-cache, private\r\n\r\n"
        )
        writer.write(head.encode() + payload)
        await writer.drain()

    async def _route(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, JSON]:
        seg = [urllib.parse.unquote(s) for s in path.strip("/").split("/")] if path != "/" else []
        ns, name = self.store.namespace, self.store.name
        if method == "GET" and seg in (["version"],):
            return 200, _VERSION
        if method == "GET" and seg == ["api"]:
            return 200, {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
                ],
            }
        if method == "GET" and seg == ["apis"]:
            return 200, _API_GROUPS
        if method == "GET" and seg == ["api", "v1"]:
            return 200, _CORE_RESOURCES
        if method == "GET" and seg == ["apis", "resource.k8s.io", "v1"]:
            return 200, _RESOURCE_RESOURCES
        # /api/v1/namespaces/{ns}/pods[/{name}[/resize]]
        if seg[:3] == ["api", "v1", "namespaces"] and len(seg) >= 5 and seg[4] == "pods":
            if seg[3] != ns:
                return self._not_found("pods", seg[5] if len(seg) > 5 else "")
            if len(seg) == 5 and method == "GET":
                return 200, {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.store.rv)},
                    "items": [copy.deepcopy(self.store.pod)]
                    if _selects(query, self.store.pod)
                    else [],
                }
            if len(seg) >= 6 and seg[5] != name:
                return self._not_found("pods", seg[5])
            if len(seg) == 6 and method == "GET":
                return 200, copy.deepcopy(self.store.pod)
            if len(seg) == 7 and seg[6] == "resize":
                if method == "GET":
                    return 200, copy.deepcopy(self.store.pod)
                if method == "PATCH":
                    try:
                        patch = json.loads(body or b"null")
                    except ValueError as e:
                        return 400, status_error(400, "BadRequest", f"invalid JSON: {e}")
                    async with self.kubelet.lock:
                        return self.store.apply_resize_patch(patch, headers.get("content-type", ""))
            return 405, status_error(405, "MethodNotAllowed", f"{method} not supported on {path}")
        if seg[:3] == ["api", "v1", "namespaces"] and len(seg) == 5 and seg[4] == "events":
            if method == "GET":
                items = [e for e in self.store.events if e["metadata"].get("namespace") == seg[3]]
                return 200, {
                    "kind": "EventList",
                    "apiVersion": "v1",
                    "metadata": {},
                    "items": items,
                }
            if method == "POST":
                return self.store.create_event(seg[3], body)
        if seg[:3] == ["apis", "resource.k8s.io", "v1"]:
            if (
                len(seg) == 7
                and seg[3] == "namespaces"
                and seg[5] == "resourceclaims"
                and method == "GET"
            ):
                claim = self.store.claims.get(seg[6])
                if claim is None or claim["metadata"].get("namespace") != seg[4]:
                    return self._not_found("resourceclaims", seg[6], "resource.k8s.io")
                return 200, copy.deepcopy(claim)
            if len(seg) == 4 and seg[3] == "resourceslices" and method == "GET":
                items = [s for s in self.store.slices if _slice_selected(query, s)]
                return 200, {
                    "kind": "ResourceSliceList",
                    "apiVersion": "resource.k8s.io/v1",
                    "metadata": {"resourceVersion": str(self.store.rv)},
                    "items": items,
                }
        return 404, status_error(
            404, "NotFound", "the server could not find the requested resource"
        )

    def _not_found(self, resource: str, name: str, group: str = "") -> tuple[int, JSON]:
        res = f"{resource}.{group}" if group else resource
        return 404, status_error(404, "NotFound", f'{res} "{name}" not found', name, resource)

    async def _watch(self, writer: asyncio.StreamWriter, path: str, query: dict[str, str]) -> None:
        seg = path.strip("/").split("/")
        ns = self.store.namespace
        if (
            seg[:3] != ["api", "v1", "namespaces"]
            or len(seg) != 5
            or seg[4] != "pods"
            or seg[3] != ns
        ):
            await self._send(writer, 404, status_error(404, "NotFound", "watch not supported here"))
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nCache-Control: no-cache, private\r\n\r\n"
        )
        queue: asyncio.Queue[JSON | None] = asyncio.Queue()
        selected = _selects(query, self.store.pod)
        rv = query.get("resourceVersion")
        if selected and rv != self.store.pod["metadata"]["resourceVersion"]:
            queue.put_nowait(
                {"type": "ADDED" if not rv else "MODIFIED", "object": copy.deepcopy(self.store.pod)}
            )
        self.store.listeners.append(queue.put_nowait)
        self._watches.append(queue)
        timeout = float(query.get("timeoutSeconds", "1800"))
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        event = await queue.get()
                except TimeoutError:
                    break
                if event is None:
                    break
                if not _selects(query, event["object"]):
                    continue
                line = json.dumps(event).encode() + b"\n"
                writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            self.store.listeners.remove(queue.put_nowait)
            self._watches.remove(queue)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = b""
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return out
        out += await reader.readexactly(size)
        await reader.readexactly(2)


def _selects(query: dict[str, str], obj: JSON) -> bool:
    sel = query.get("fieldSelector", "")
    for term in filter(None, sel.split(",")):
        key, _, value = term.partition("=")
        value = value.lstrip("=")
        if key == "metadata.name" and obj.get("metadata", {}).get("name") != value:
            return False
        if key == "metadata.namespace" and obj.get("metadata", {}).get("namespace") != value:
            return False
    return True


def _slice_selected(query: dict[str, str], obj: JSON) -> bool:
    spec = obj.get("spec", {})
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        key, _, value = term.partition("=")
        value = value.lstrip("=")
        if key == "spec.nodeName" and spec.get("nodeName") != value:
            return False
        if key == "spec.driver" and spec.get("driver") != value:
            return False
    return True


_VERSION: JSON = {
    "major": "1",
    "minor": "35",
    "gitVersion": "v1.35.0-kubesim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_API_GROUPS: JSON = {
    "kind": "APIGroupList",
    "apiVersion": "v1",
    "groups": [
        {
            "name": "resource.k8s.io",
            "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "resource.k8s.io/v1", "version": "v1"},
        }
    ],
}


def _res(
    name: str, kind: str, namespaced: bool, verbs: list[str], short: list[str] | None = None
) -> JSON:
    out: JSON = {
        "name": name,
        "singularName": "",
        "namespaced": namespaced,
        "kind": kind,
        "verbs": verbs,
    }
    if short:
        out["shortNames"] = short
    return out


_CORE_RESOURCES: JSON = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [
        _res("pods", "Pod", True, ["get", "list", "watch"], ["po"]),
        _res("pods/resize", "Pod", True, ["get", "patch"]),
        _res("events", "Event", True, ["create", "get", "list"], ["ev"]),
    ],
}
_RESOURCE_RESOURCES: JSON = {
    "kind": "APIResourceList",
    "groupVersion": "resource.k8s.io/v1",
    "resources": [
        _res("resourceclaims", "ResourceClaim", True, ["get"]),
        _res("resourceslices", "ResourceSlice", False, ["list"]),
    ],
}
