"""The Event kube-proxy records when it starts, as upstream's: ``kubectl get events``
shows ``Starting`` / ``StartKubeProxy`` for the Node.

Upstream (cmd/kube-proxy/app/server.go) records, through client-go's events.k8s.io/v1
recorder, one Normal event regarding its Node (``apiVersion``, ``kind`` and ``name``: no
``uid``), reason ``Starting``, action ``StartKubeProxy``, reported by controller
``kube-proxy`` from instance ``kube-proxy-<host name>``. Events about a cluster-scoped
object go to the ``default`` namespace; the name is the object's name and the time in hex
nanoseconds, as the recorder makes it. tests/realk8s/test_events.py compares ours with
the one upstream's kube-proxy v1.37 posts to a real API server, field by field.

One difference, on purpose: the API server names the field manager after the client's
User-Agent, so ``managedFields`` say ``kubeproxy`` where upstream's say ``kube-proxy``;
audit logs and managed fields tell the two proxies apart.

Best effort, as upstream's broadcaster: a failed post is retried a few times with backoff
and then dropped with one log line; the proxy never waits for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from datetime import UTC, datetime
from typing import Any

from kubeproxy.logs import V2
from kubeproxy.sources.kube_client import ApiClient, RequestError

log = logging.getLogger(__name__)

EVENTS_PATH = "/apis/events.k8s.io/v1/namespaces/default/events"
REPORTING_CONTROLLER = "kube-proxy"
ATTEMPTS = 5


def starting_event(node_name: str, now: float, host: str | None = None) -> dict[str, Any]:
    """The events.k8s.io/v1 Event upstream posts at start (``now``: seconds since epoch)."""
    instance = f"{REPORTING_CONTROLLER}-{host if host is not None else socket.gethostname()}"
    nanos = int(now * 1e9)
    when = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{node_name}.{nanos:x}", "namespace": "default"},
        "eventTime": when,
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance,
        "action": "StartKubeProxy",
        "reason": "Starting",
        "regarding": {"kind": "Node", "name": node_name, "apiVersion": "v1"},
        "type": "Normal",
    }


async def post_event(client: ApiClient, event: dict[str, Any], *, backoff: float = 1.0) -> None:
    """Post ``event``, retrying a few times; a last failure is logged, not raised."""
    body = json.dumps(event).encode()
    for attempt in range(ATTEMPTS):
        try:
            await client.post(EVENTS_PATH, body)
            return
        except RequestError as err:
            if attempt == ATTEMPTS - 1:
                log.warning("Could not record the %s event: %s", event["reason"], err)
                return
            log.log(V2, "Recording the %s event failed, retrying: %s", event["reason"], err)
            await asyncio.sleep(backoff * 2**attempt)
