"""The nftables backend: one sync, as named phases.

``sync`` = ``_families`` (per-family settings from config and node state) →
``_render_changed`` (re-render only the ServicePorts that changed, per family, cached) →
``_assemble`` (merge cached per-ServicePort rules into whole tables, resolve conflicts) →
``_apply`` (one atomic ``nft -f`` transaction) → a :class:`SyncResult` for the caller to
log and export.

A full sync replaces the ``kube-proxy`` tables in one transaction
(``add table; delete table; table { ... }``), which also repairs anything someone else
changed. If the kernel refuses the transaction nothing changes (nft batches are atomic),
the cache is dropped and the next sync is a full one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from kubeproxy.backends import SyncResult
from kubeproxy.backends.nftables.render import (
    TABLE,
    FamilyConfig,
    PortRules,
    TableContents,
    Vocabulary,
    collect,
    render_service_port,
    render_table,
)
from kubeproxy.backends.nftables.script import Transaction
from kubeproxy.config import ProxyConfig
from kubeproxy.dataplane.nft import NftRunner
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import IPFamily, ServicePortName

log = logging.getLogger(__name__)


@dataclass
class _FamilyCache:
    config: FamilyConfig
    rules: dict[ServicePortName, PortRules] = field(default_factory=dict)


class NftablesBackend:
    """Programs the ``ip``/``ip6`` ``kube-proxy`` tables."""

    name = "nftables"

    def __init__(self, config: ProxyConfig, runner: NftRunner) -> None:
        self.config = config
        self.runner = runner
        self._cache: dict[IPFamily, _FamilyCache] = {}
        self._warned_no_node_ip: set[IPFamily] = set()

    # ------------------------------------------------------------------ phases

    def _families(self, snapshot: Snapshot) -> list[FamilyConfig]:
        configs = []
        node = snapshot.node
        for family in self.config.families:
            primary = node.primary_ips.get(family)
            node_ports = self.config.nodeport_addresses.for_family(family, primary)
            if (
                self.config.nodeport_addresses.primary
                and primary is None
                and family not in self._warned_no_node_ip
                and _has_node_ports(snapshot, family)
            ):
                self._warned_no_node_ip.add(family)
                log.warning(
                    "No %s primary IP known for node %s (no Node object with an InternalIP or "
                    "ExternalIP, and no --bind-address): NodePorts are accepted on every local "
                    "address of that family, as upstream kube-proxy does",
                    family.value,
                    node.name,
                )
            configs.append(
                FamilyConfig(
                    family=family,
                    node=node.topology,
                    node_ports=node_ports,
                    cluster_cidrs=self.config.cluster_cidrs_of(family),
                    masquerade_all=self.config.masquerade_all,
                    masquerade_mark=self.config.masquerade_mark,
                    flags=self.config.features,
                )
            )
        return configs

    def _render_changed(
        self,
        snapshot: Snapshot,
        changed: Iterable[ServicePortName] | None,
        configs: list[FamilyConfig],
    ) -> int:
        """Re-render changed ServicePorts (all of them for a family whose settings changed)."""
        rendered = 0
        for cfg in configs:
            cache = self._cache.get(cfg.family)
            names: Iterable[ServicePortName]
            if cache is None or cache.config != cfg or changed is None:
                cache = self._cache[cfg.family] = _FamilyCache(cfg)
                names = snapshot.services.keys()
            else:
                names = changed
            for name in names:
                svc = snapshot.services.get(name)
                if svc is None:
                    cache.rules.pop(name, None)
                    continue
                cache.rules[name] = render_service_port(svc, snapshot.endpoints.get(name, ()), cfg)
                rendered += 1
        return rendered

    def _assemble(self, configs: list[FamilyConfig]) -> tuple[Transaction, list[TableContents]]:
        tx = Transaction()
        contents = []
        for cfg in configs:
            fam = cfg.vocab.table_family
            merged = collect(self._cache[cfg.family].rules)
            contents.append(merged)
            tx.add_table(fam, TABLE)
            tx.delete_table(fam, TABLE)
            tx.define_table(render_table(cfg, merged))
        return tx, contents

    def _apply(self, tx: Transaction) -> None:
        try:
            self.runner.apply(str(tx))
        except Exception:
            # The kernel kept the previous rules; our cache may no longer describe them.
            self._cache.clear()
            raise

    # ----------------------------------------------------------------- public

    def sync(self, snapshot: Snapshot, changed: set[ServicePortName] | None) -> SyncResult:
        """Bring the kernel in line with ``snapshot``. ``changed=None`` forces a full sync."""
        configs = self._families(snapshot)
        rendered = self._render_changed(snapshot, changed, configs)
        tx, contents = self._assemble(configs)
        self._apply(tx)
        return self._report(snapshot, configs, contents, tx, rendered)

    def render(self, snapshot: Snapshot) -> str:
        """The exact script a full sync of ``snapshot`` applies (touches nothing)."""
        configs = self._families(snapshot)
        self._render_changed(snapshot, None, configs)
        tx, _ = self._assemble(configs)
        return str(tx)

    def cleanup(self) -> list[str]:
        """Delete our tables (and nothing else); returns what was removed."""
        ours = {Vocabulary.of(f).table_family for f in IPFamily}
        present = [
            (fam, name) for fam, name in self.runner.list_tables() if name == TABLE and fam in ours
        ]
        if present:
            tx = Transaction()
            for fam, name in present:
                tx.delete_table(fam, name)
            self.runner.apply(str(tx))
        self._cache.clear()
        return [f"table {fam} {name}" for fam, name in present]

    def _report(
        self,
        snapshot: Snapshot,
        configs: list[FamilyConfig],
        contents: list[TableContents],
        tx: Transaction,
        rendered: int,
    ) -> SyncResult:
        result = SyncResult(
            full=True,
            service_ports=len(snapshot.services),
            rendered=rendered,
            operations=tx.operations,
        )
        for cfg, merged in zip(configs, contents, strict=True):
            result.elements += merged.element_count()
            result.chains += len(merged.chains)
            result.conflicts.extend(
                f"Service port {c.loser} also claims {c.claim[0]} destination {c.claim[1]}, "
                f"which belongs to {c.owner}; ignoring it there ({cfg.family.value})"
                for c in merged.conflicts
            )
            for rules in self._cache[cfg.family].rules.values():
                result.no_local_internal += rules.no_local_internal
                result.no_local_external += rules.no_local_external
        return result


def _has_node_ports(snapshot: Snapshot, family: IPFamily) -> bool:
    return any(svc.node_port and svc.cluster_ip(family) for svc in snapshot.services.values())
