"""The API stand-in as a process of its own, driven line by line by ``bench.e2e``.

    python -m bench.e2e_api SERVICES ENDPOINTS

Serves Node ``node-a`` and the synthetic cluster of :mod:`bench.cluster` with the tests'
stand-in (tests/apiserver.py), prints its port, then reads JSON commands from stdin, one
a line: ``{"apply": [OBJECT...]}`` or ``{"delete": [[KIND, NAMESPACE, NAME]...]}``. Each
command is answered with ``ok`` once the stand-in has stored the writes and queued their
watch events: the acknowledgement a client of a real API server gets.
"""

from __future__ import annotations

import asyncio
import json
import sys

from tests.apiserver import ApiServer

from bench.cluster import cluster
from kubeproxy.lab.objects import node


async def serve(services: int, endpoints: int) -> None:
    api = ApiServer()
    api.create(node("node-a", ["192.168.77.1"]))
    for obj in cluster(services, endpoints):
        api.create(obj)
    await api.start()
    print(api.port, flush=True)
    loop = asyncio.get_running_loop()
    # A command carries whole objects: a line may be megabytes (the soak's churn).
    reader = asyncio.StreamReader(limit=1 << 30)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command = json.loads(line)
        for obj in command.get("apply", ()):
            api.apply(obj)
        for kind, namespace, name in command.get("delete", ()):
            api.delete(kind, name, namespace)
        sys.stdout.write("ok\n")
        sys.stdout.flush()


def main() -> int:
    asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
