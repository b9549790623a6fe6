"""Differential packet testing: does every packet go where upstream kube-proxy sends it?

Map:

* :mod:`.states` — seeded cluster states (Services of every kind over a pool of Pods,
  ServiceCIDRs) and the API objects that make them;
* :mod:`.probes` — the probe matrix (origins x frontends x TCP/UDP), asking and recording
  which Pods answer, the source address they saw, DROP or REJECT;
* :mod:`.proxies` — upstream kube-proxy and kubeproxy on one node of the lab, the node's
  kernel state (rules, sysctls, what a cleanup leaves) and its reset between runs;
* :mod:`.compare` — two records of the same probes: their differences, and the ones
  kept on purpose (docs/differences-from-upstream.md);
* :mod:`.run` — one batch: states applied, each proxy run and probed in each mode,
  disputes asked again, results.

Used by tests/realk8s/test_differential.py (a few fixed seeds) and
``python -m bench.differential`` (hundreds).
"""
