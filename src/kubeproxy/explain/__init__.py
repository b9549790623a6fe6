"""``kubeproxy explain`` and ``kubeproxy list``: the service plan, read back for people.

* :mod:`.packet` (pure) — one packet's fate from the plan: origin, the Service and
  frontend it matches (or why none), every selection decision, the candidate endpoints
  with their probabilities, masquerading, DROP / REJECT and why.
* :mod:`.objects` (pure) — the nftables elements and chains, or iptables chains and
  rules, that implement it, from the backends' own renderers.
* :mod:`.socket_hooks` (pure) — ebpf mode: whether its socket hooks take the connection (and
  their map entries), or the nftables explanation stands.
* :mod:`.listing` (pure) — every frontend with its policies, endpoints and (``--live``)
  drift.
* :mod:`.output` (pure) — text and JSON for ``explain``.
* :mod:`.live` — ``--live``: reads the kernel and compares (the comparison is pure).
* :mod:`.running` — ``--live`` without ``--proxy-mode``: the mode running on the node.
* :mod:`.command` — plans from configuration and snapshot, as a sync makes them; one
  packet (``explain``) or every frontend (``list``, ``list --live``).
"""
