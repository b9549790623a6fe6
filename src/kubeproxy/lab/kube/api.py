"""A small synchronous client of the lab's kube-apiserver, for the lab and its tests.

The API server's addresses exist only inside the lab's network namespaces, so every
request runs on a thread of a :class:`~kubeproxy.lab.netns.NetnsExecutor` (its sockets
live in that namespace). JSON over ``http.client`` with the admin's client certificate:
the lab needs create, get, list, merge-patch (status subresources included), server-side
apply and delete of a dozen kinds, nothing a client library would add.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeproxy.lab.kube.pki import Pair
from kubeproxy.lab.netns import NetnsExecutor

Obj = dict[str, Any]

# kind -> (API path prefix, plural, namespaced)
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Service": ("/api/v1", "services", True),
    "Endpoints": ("/api/v1", "endpoints", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Event": ("/api/v1", "events", True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    "ServiceCIDR": ("/apis/networking.k8s.io/v1", "servicecidrs", False),
    "IPAddress": ("/apis/networking.k8s.io/v1", "ipaddresses", False),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
}


class ApiError(RuntimeError):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"HTTP {code}: {message}")
        self.code = code


def path(kind: str, namespace: str | None = None, name: str | None = None) -> str:
    """The collection (no ``name``) or object path of ``kind``."""
    prefix, plural, namespaced = KINDS[kind]
    where = f"{prefix}/namespaces/{namespace or 'default'}" if namespaced else prefix
    out = f"{where}/{plural}"
    return f"{out}/{name}" if name else out


def object_path(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return path(obj["kind"], meta.get("namespace"), meta["name"])


@dataclass
class Api:
    """Requests to ``host:port`` from inside ``executor``'s namespace."""

    executor: NetnsExecutor
    host: str
    port: int
    ca: Path
    client: Pair | None = None
    token: str | None = None
    timeout: float = 30.0

    def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> Obj:
        if query:
            url = f"{url}?{urllib.parse.urlencode(query)}"
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body))
        return self.executor.call(self._send, method, url, data, content_type)

    def _send(self, method: str, url: str, data: Any, content_type: str) -> Obj:
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.client is not None:
            context.load_cert_chain(str(self.client.cert), str(self.client.key))
        conn = http.client.HTTPSConnection(
            self.host, self.port, context=context, timeout=self.timeout
        )
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            conn.request(method, url, body=data, headers=headers)
            response = conn.getresponse()
            text = response.read().decode()
        finally:
            conn.close()
        if response.status >= 300:
            try:
                message = json.loads(text).get("message", text)
            except ValueError:
                message = text
            raise ApiError(response.status, f"{method} {url}: {message}")
        try:
            return json.loads(text) if text else {}
        except ValueError:
            return {"text": text}  # /readyz and friends answer plain text

    # ------------------------------------------------------------------ verbs

    def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return self.request("POST", path(obj["kind"], meta.get("namespace")), obj)

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        return self.request("GET", path(kind, namespace, name))

    def list_of(self, kind: str, namespace: str | None = None, **query: str) -> list[Obj]:
        if KINDS[kind][2] and namespace is None:
            prefix, plural, _ = KINDS[kind]
            url = f"{prefix}/{plural}"  # every namespace
        else:
            url = path(kind, namespace)
        items: list[Obj] = self.request("GET", url, query=query or None)["items"]
        return items

    def patch(self, kind: str, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        return self.request(
            "PATCH",
            path(kind, namespace, name),
            patch,
            content_type="application/merge-patch+json",
        )

    def patch_status(self, kind: str, name: str, patch: Obj, namespace: str | None = None) -> Obj:
        return self.request(
            "PATCH",
            path(kind, namespace, name) + "/status",
            patch,
            content_type="application/merge-patch+json",
        )

    def apply(self, obj: Obj, manager: str = "kubeproxy-lab") -> Obj:
        """Server-side apply (creates or updates, conflicts forced)."""
        return self.request(
            "PATCH",
            object_path(obj),
            obj,
            content_type="application/apply-patch+yaml",
            query={"fieldManager": manager, "force": "true"},
        )

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        try:
            self.request("DELETE", path(kind, namespace, name))
        except ApiError as err:
            if err.code != 404:
                raise
