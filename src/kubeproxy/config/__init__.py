"""Configuration: upstream's KubeProxyConfiguration file and flags, and what the proxy runs with.

Laid out as upstream's ``pkg/proxy/apis/config`` (types, scheme defaults, validation) and
``cmd/kube-proxy/app/options.go`` (flags), in the order a start-up uses them:

* :mod:`.duration` — Go's ``time.Duration``, parsed and printed as Go does.
* :mod:`.types` — the ``kubeproxy.config.k8s.io/v1alpha1`` dataclass tree, field for field.
* :mod:`.codec` — the ``--config`` file: strict decoding (every error at once, each naming
  its field path) and encoding (``--write-config-to``, ``/configz``).
* :mod:`.options` — kubeproxy's own optional second document of that file (settings
  upstream has no field for).
* :mod:`.defaults` — upstream's scheme and platform defaults, and which section each
  mode reads (:func:`~.defaults.mode_settings`).
* :mod:`.flags` — upstream's command-line flags as one table, their precedence over a
  file, and the argparse options generated from it.
* :mod:`.features` — the feature gates kube-proxy reads.
* :mod:`.validation` — every error at once in upstream's wording.
* :mod:`.runtime` — :class:`~.runtime.ProxyConfig`, the immutable effective
  configuration the rest of the program receives (``kubeproxy.cli`` builds it).

Imports run one way, no circle: duration → types → defaults → codec; types → features →
validation → flags (validation and flags read the mode's section from defaults); runtime
takes the types and builds the dataplane's small settings objects
(:func:`~.runtime.conntrack_settings`). Below the package: the model (feature flags,
ProxyConfig's fields) and the dataplane (the kernel's IPVS schedulers, the sysctl
settings), neither of which imports it back. This ``__init__`` re-exports nothing:
importers name the module they use.
"""
