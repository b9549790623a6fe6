"""kubeproxy: a Python reimplementation of Kubernetes kube-proxy.

Map of the package (layers, who may import whom, and where each policy is decided:
docs/architecture.md; tests/unit/test_architecture.py checks the layers):

* :mod:`kubeproxy.cli` / :mod:`kubeproxy.__main__` — command line (upstream flag names).
* :mod:`kubeproxy.app` — composition root: source → state → runner → backend; servers.
* :mod:`kubeproxy.explain` — ``explain`` and ``list``: the plan and the live kernel.
* :mod:`kubeproxy.metrics`, :mod:`kubeproxy.health` — upstream's metrics and health ports.
* :mod:`kubeproxy.sources` — where objects come from (a manifest directory, the API).
* :mod:`kubeproxy.runner` — bounded-frequency sync runner with an injected clock.
* :mod:`kubeproxy.backends` — one package per proxy mode behind one interface
  (``base``), named in one registry (``registry``).
* :mod:`kubeproxy.config` — the KubeProxyConfiguration file and flags (types, codec,
  defaults, validation, flags), the modes (``modes.ProxyMode``) and the effective
  configuration (``runtime``).
* :mod:`kubeproxy.controlplane` — upstream's allocators and EndpointSlice controller,
  for a cluster without a control plane.
* :mod:`kubeproxy.dataplane` — thin wrappers over kernel tools, each with a strict fake;
  one error root (``errors.DataplaneError``).
* :mod:`kubeproxy.model` — pure core: API objects → model types (``parse``), source
  events (``events``), change trackers (``tracker``), endpoint selection (``topology``),
  the proxy's view (``state``), the per-node plan (``plan``, ``planning``).
* :mod:`kubeproxy.lab` — network-namespace lab: the demo and the real-kernel tests.
"""

__version__ = "0.1.0"
