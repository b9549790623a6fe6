"""kubeproxy: a Python reimplementation of Kubernetes kube-proxy.

Map of the package:

* :mod:`kubeproxy.cli` / :mod:`kubeproxy.__main__` — command line (upstream flag names).
* :mod:`kubeproxy.app` — composition root: source → state → runner → backend.
* :mod:`kubeproxy.config` — the KubeProxyConfiguration file and flags (types, codec,
  defaults, validation, flags) and the effective configuration (``runtime``).
* :mod:`kubeproxy.model` — pure core: API objects → model types (``parse``), change
  trackers (``tracker``), endpoint selection (``topology``), the proxy's view (``state``).
* :mod:`kubeproxy.sources` — where objects come from (a manifest directory).
* :mod:`kubeproxy.runner` — bounded-frequency sync runner with an injected clock.
* :mod:`kubeproxy.backends` — one package per proxy mode (``nftables``) behind one interface.
* :mod:`kubeproxy.dataplane` — thin wrappers over kernel tools (``nft``).
* :mod:`kubeproxy.lab` — network-namespace lab: the demo and the real-kernel tests.
"""

__version__ = "0.1.0"
