"""The bridge's Kubernetes API calls through ``lightkube`` (typed resources, ``lightkube-models``).

Why a library: watches with resourceVersion, stream restarts and 410-Gone relists are where
hand-written clients break; lightkube's watch resumes from the last resourceVersion when the server
ends the stream and surfaces 410 as an error (the Pod source then re-reads the Pod). Why this
narrow class: the bridge needs five calls (its Pod, a watch on it, its ResourceClaims, the
ResourceSlices of its node, an Event), and the rest of the adapter only sees plain dicts in the
API's JSON shape, so parsing (:mod:`bridge.resources.pod`) stays independent of the client.

lightkube is imported only when an API is configured (:func:`connect`); without a cluster it is
never imported. Configuration still comes from :class:`~bridge.resources.kubeapi.KubeConfig`
(``BRIDGE_KUBE_API`` or the in-cluster service account; the token file is re-read on every
request, so rotated projected tokens work).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from bridge.resources.kubeapi import KubeConfig, KubeError


@contextlib.contextmanager
def _kube_errors(what: str) -> Iterator[None]:
    """lightkube/httpx failures as :class:`KubeError` (status 0 for transport failures)."""
    import httpx2
    from lightkube import ApiError

    try:
        yield
    except ApiError as e:
        code = int(getattr(e.status, "code", 0) or e.response.status_code)
        raise KubeError(code, f"{what}: {e.status.message or e}") from e
    except httpx2.HTTPStatusError as e:
        raise KubeError(e.response.status_code, f"{what}: {e}") from e
    except (httpx2.HTTPError, OSError) as e:
        raise KubeError(0, f"{what}: {e!r}") from e


class LightkubeApi:
    """The calls the resource adapter makes, answering in the API's JSON shape (dicts)."""

    def __init__(self, config: KubeConfig, *, timeout: float = 10.0) -> None:
        import httpx2
        from lightkube import AsyncClient
        from lightkube import KubeConfig as LightkubeConfig
        from lightkube.config.models import Cluster, User

        cluster = Cluster(server=config.base_url, certificate_auth=config.ca_file)
        user = User(token_file=config.token_file) if config.token_file else User()
        self.config = config
        self.base_url = config.base_url
        self._client = AsyncClient(
            LightkubeConfig.from_one(cluster=cluster, user=user),
            timeout=httpx2.Timeout(timeout),
            trust_env=False,  # the API server, not whatever proxy the environment names
        )

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        from lightkube.resources.core_v1 import Pod

        with _kube_errors(f"GET pod {namespace}/{name}"):
            pod = await self._client.get(Pod, name, namespace=namespace)
        return dict(pod.to_dict())

    async def watch_pod(
        self, namespace: str, name: str, resource_version: str | None
    ) -> AsyncIterator[dict[str, Any]]:
        """``{"type": ..., "object": {...}}`` per change after ``resource_version``. Restarts of
        the stream by the server are resumed inside; an ERROR (e.g. 410 Gone) raises."""
        from lightkube.resources.core_v1 import Pod

        stream = self._client.watch(
            Pod,
            namespace=namespace,
            fields={"metadata.name": name},
            resource_version=resource_version,
        )
        with _kube_errors(f"watch pod {namespace}/{name}"):
            async for kind, obj in stream:
                yield {"type": kind, "object": dict(obj.to_dict())}

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import ResourceClaim

        with _kube_errors(f"GET resourceclaim {namespace}/{name}"):
            claim = await self._client.get(ResourceClaim, name, namespace=namespace)
        return dict(claim.to_dict())

    async def list_slices(self, node_name: str | None) -> dict[str, Any]:
        """The ResourceSlices of ``node_name`` (all of them when unknown), as a list object."""
        from lightkube.resources.resource_v1 import ResourceSlice

        stream = (
            self._client.list(ResourceSlice, fields={"spec.nodeName": node_name})
            if node_name
            else self._client.list(ResourceSlice)
        )
        with _kube_errors("LIST resourceslices"):
            items = [s.to_dict() async for s in stream]
        return {"kind": "ResourceSliceList", "items": items}

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        from lightkube.resources.core_v1 import Event

        event = Event.from_dict(body)
        assert isinstance(event, Event)
        with _kube_errors(f"POST event {namespace}"):
            await self._client.create(event)  # the namespace is in the Event's metadata

    async def close(self) -> None:
        await self._client.close()


def connect(config: KubeConfig, *, timeout: float = 10.0) -> LightkubeApi:
    """The API client for ``config`` (imports lightkube)."""
    return LightkubeApi(config, timeout=timeout)
