"""``kubeproxy explain`` and ``kubeproxy list``: the service plan, read back for people.

* :mod:`.packet` (pure) — one packet's fate from the plan: origin, the Service and
  frontend it matches (or why none), every selection decision, the candidate endpoints
  with their probabilities, masquerading, DROP / REJECT and why. Mode-free: where the
  modes' rules differ it reads the mode's ``PacketRules``; the answer's type is
  :mod:`kubeproxy.model.fate`.
* Each mode's own knowledge (the kernel objects an answer goes through, reading them
  back, what the kernel holds that no Service explains) is in its package:
  ``backends/<mode>/inspect.py``, behind :mod:`kubeproxy.backends.inspection` and
  found through :func:`kubeproxy.backends.registry.inspector`.
* :mod:`.listing` (pure) — every frontend with its policies, endpoints and (``--live``)
  drift.
* :mod:`.output` (pure) — text and JSON for ``explain``.
* :mod:`.running` — ``--live`` without ``--proxy-mode``: the mode running on the node.
* :mod:`.cli` — the ``explain`` and ``list`` subcommands' arguments, run and printed.
* :mod:`.command` — plans from configuration and snapshot, as a sync makes them; one
  packet (``explain``) or every frontend (``list``, ``list --live``).
"""
