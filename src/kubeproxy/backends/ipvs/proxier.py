"""The ipvs backend: the service plan as IPVS virtual servers, ipsets and a few iptables
rules, as upstream kube-proxy's ipvs mode programs them.

The sync loop is :class:`~kubeproxy.backends.driver.SyncDriver`'s (one unit per IP
family); the phases of a family here:

1. **observe** — on a full sync (at start, after a failure, when node-level settings
   change) read the kernel: virtual servers and their destinations, the addresses on
   ``kube-ipvs0``, the family's sets; otherwise use what the last sync left (it is what
   the kernel holds, unless someone changed it, which the next full sync repairs);
2. **want** — on a full sync every plan's :func:`.render.contribution` (pure); on a
   partial one only the changed ServicePorts are planned and their contributions
   replaced in the kept :class:`.render.DesiredState` (a change that involves a virtual
   server two plans claim renders everything);
3. **diff** — :func:`.diff.diff` (pure): only the changed virtual servers, real servers,
   addresses and set members (on a partial sync, looking only at what it touched);
4. **apply** — the ipsets in one ``ipset restore``; the iptables chains in one
   ``iptables-restore`` (legacy or nft, the flavour chosen as iptables mode chooses it;
   rewritten only when they differ from what was written); then IPVS over netlink, the
   addresses of ``kube-ipvs0``; removed real servers go through graceful termination
   (:mod:`.graceful`); stale addresses and virtual servers go last.

``start`` checks what upstream checks before it runs the ipvs proxier (IPVS in the
kernel, ipset >= 6.0, the scheduler, by creating and deleting a virtual server with it
on 198.51.100.0:20000 when none uses it yet) and sets upstream's sysctls; a kernel
without IPVS is a :class:`~kubeproxy.backends.BackendError` naming the reason, never a
fallback to another mode.

Each side effect is an interface with a strict fake beside it
(:mod:`kubeproxy.dataplane.ipvs`, :mod:`kubeproxy.dataplane.ipset`,
:mod:`kubeproxy.dataplane.iptables`), so this orchestration is tested without IPVS.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kubeproxy.backends.base import BackendError, SyncResult
from kubeproxy.backends.driver import PerFamilyDriver, Unit
from kubeproxy.backends.iptables.runners import Reopen, working_runners
from kubeproxy.backends.ipvs import names as n
from kubeproxy.backends.ipvs.diff import Changes, Network, Observed, diff
from kubeproxy.backends.ipvs.graceful import Action, GracefulTermination, needs_grace
from kubeproxy.backends.ipvs.render import (
    Context,
    DesiredState,
    RuleSettings,
    Touched,
    contribution,
    empty_state,
    iptables_rules,
)
from kubeproxy.config.modes import ProxyMode
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.ipset import Ipset, IpsetError, IpsetScript
from kubeproxy.dataplane.iptables.cleanup import NOTHING, Jump, Keep, KeepMap, cleanup_chains
from kubeproxy.dataplane.iptables.runner import Iptables, IptablesError
from kubeproxy.dataplane.ipvs import (
    FLAG_PERSISTENT,
    FLAG_SCHED1,
    FLAG_SCHED2,
    Change,
    Destination,
    Ipvs,
    IpvsError,
    Links,
    Op,
    Outcome,
    ServiceKey,
    VirtualServer,
)
from kubeproxy.dataplane.kernel import kernel_version
from kubeproxy.model.plan import FamilyPlan
from kubeproxy.model.planning import NodePlan
from kubeproxy.model.types import IPFamily, ServicePortName

log = logging.getLogger(__name__)

MIN_IPSET_VERSION = (6, 0)
# upstream's IPVSConnReuseModeMinSupportedKernelVersion / ...FixedKernelVersion
CONN_REUSE_MIN_KERNEL = (4, 1)
CONN_REUSE_FIXED_KERNEL = (5, 9)
PROBE = VirtualServer(ServiceKey("198.51.100.0", "TCP", 20000))
Endpoint = tuple[str, int]


@dataclass
class _Family:
    plan: FamilyPlan
    observed: Observed
    rules_text: str = ""
    valid: bool = True
    desired: DesiredState = field(default_factory=DesiredState)
    context: Context | None = None  # what ``desired`` was rendered with


def sysctls(config: ProxyConfig, kernel: tuple[int, ...]) -> list[tuple[str, int]]:
    """upstream's ipvs NewProxier: (path under /proc/sys, value)."""
    out = [("net/ipv4/vs/conntrack", 1)]
    if CONN_REUSE_MIN_KERNEL <= kernel < CONN_REUSE_FIXED_KERNEL:
        out.append(("net/ipv4/vs/conn_reuse_mode", 0))
    out += [
        ("net/ipv4/vs/expire_nodest_conn", 1),
        ("net/ipv4/vs/expire_quiescent_template", 1),
        ("net/ipv4/ip_forward", 1),
    ]
    if config.ipvs.strict_arp:
        out += [("net/ipv4/conf/all/arp_ignore", 1), ("net/ipv4/conf/all/arp_announce", 2)]
    return out


def ensure_sysctl(proc: Path, path: str, value: int) -> None:
    """Write ``value`` unless it is there; BackendError if it cannot be written."""
    target = proc / "sys" / path
    try:
        if target.read_text().strip() != str(value):
            target.write_text(str(value))
    except OSError as err:
        raise BackendError(f"can't set sysctl {path} to {value}: {err.strerror or err}") from None


def init_node(config: ProxyConfig, proc: Path, release: str | None = None) -> None:
    """The sysctls ipvs mode needs (what ``--init-only`` does for it, as upstream's
    NewProxier with initOnly), under ``proc``: the /proc of the node's network
    namespace. Raises BackendError."""
    for path, value in sysctls(config, kernel_version(release)):
        ensure_sysctl(proc, path, value)


class IpvsBackend(PerFamilyDriver):
    mode = ProxyMode.IPVS

    def __init__(
        self,
        config: ProxyConfig,
        *,
        open_ipvs: Callable[[], Ipvs],
        links: Links,
        ipset: Ipset,
        runners: Mapping[IPFamily, Iptables],
        proc: Path,
        clock: Callable[[], float] = time.monotonic,
        release: str | None = None,
        reopen: Reopen | None = None,
    ) -> None:
        """``proc``: the /proc of the node's network namespace, which :func:`init_node`
        writes (no default, as iptables mode's). ``reopen``: as iptables mode's
        (:func:`~kubeproxy.backends.iptables.proxier.working_runners`)."""
        super().__init__(config)
        self.reopen = reopen
        self.open_ipvs = open_ipvs
        self._ipvs: Ipvs | None = None
        self.links = links
        self.ipset = ipset
        self.runners: dict[IPFamily, Iptables] = dict(runners)
        self.clock = clock
        self.proc = proc
        self.release = release
        self.scheduler = config.ipvs.scheduler or "rr"
        self.exclude: list[Network] = [
            ipaddress.ip_network(c, strict=False) for c in config.ipvs.exclude_cidrs
        ]
        self.graceful = GracefulTermination()
        self._families: dict[IPFamily, _Family] = {}
        self.errors: list[str] = []
        self._seconds = 0.0

    @property
    def ipvs(self) -> Ipvs:
        if self._ipvs is None:
            try:
                self._ipvs = self.open_ipvs()
            except IpvsError as err:
                raise BackendError(f"can't use the IPVS proxier: {err}") from None
        return self._ipvs

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        ipvs = self.ipvs
        try:
            version = self.ipset.version()
        except IpsetError as err:
            raise BackendError(f"can't use the IPVS proxier: ipset: {err}") from None
        numbers = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if numbers < MIN_IPSET_VERSION:
            raise BackendError(
                f"can't use the IPVS proxier: ipset version {version} is less than 6.0"
            )
        for family, runner in self.runners.items():
            reason = runner.available()
            if reason is not None:
                raise BackendError(f"ipvs mode cannot run ({family.value}): {reason}")
        self.runners = working_runners(self.runners, self.reopen)
        self._probe_scheduler(ipvs)
        init_node(self.config, self.proc, self.release)
        ipvs_cfg = self.config.ipvs
        if ipvs_cfg.tcp_timeout or ipvs_cfg.tcp_fin_timeout or ipvs_cfg.udp_timeout:
            try:
                ipvs.set_timeouts(
                    ipvs_cfg.tcp_timeout, ipvs_cfg.tcp_fin_timeout, ipvs_cfg.udp_timeout
                )
            except IpvsError as err:
                log.error("Failed to configure IPVS timeouts: %s", err)

    def _probe_scheduler(self, ipvs: Ipvs) -> None:
        """As upstream's CanUseIPVSProxier: a scheduler some service already uses works;
        otherwise create (and delete) a service with it."""
        try:
            services = ipvs.services()
            if any(vs.scheduler == self.scheduler for vs in services):
                return
            probe = VirtualServer(PROBE.key, self.scheduler)
            ipvs.add_service(probe)
            ipvs.delete_service(probe.key)
        except IpvsError as err:
            raise BackendError(
                f"can't use the IPVS proxier: scheduler {self.scheduler!r}: {err}"
            ) from None

    def owned(self) -> KeepMap:
        """The chains and jumps this backend owns, per flavour and family it drives."""
        mine = owned()
        return {(runner.flavor, family): mine for family, runner in self.runners.items()}

    def stop(self) -> None:
        """Close the netlink sockets; what was programmed stays, so traffic flows across a
        restart."""
        if self._ipvs is not None:
            self._ipvs.close()
            self._ipvs = None
        self.links.close()

    def counters(self) -> dict[str, int]:
        return {}

    # ----------------------------------------------------------------- phases

    def _desired(self, node_plan: NodePlan, ctx: Context) -> DesiredState:
        """Every plan's contribution, in name order (the first claim of a key wins)."""
        out = empty_state(ctx.fam)
        for name, plan in sorted(node_plan.service_ports(ctx.fam).items()):
            if plan is not None:
                out.add(name, contribution(ctx, plan))
        return out

    @staticmethod
    def _update(
        node_plan: NodePlan, ctx: Context, desired: DesiredState, changed: set[ServicePortName]
    ) -> Touched | None:
        """Replace the changed plans' contributions in ``desired``; what that touched,
        or None (``desired`` unchanged) when a changed plan shares a virtual server with
        another plan: then the conflict's winner is decided by a whole render."""
        plans = node_plan.service_ports(ctx.fam, changed)
        parts = {
            name: None if plan is None else contribution(ctx, plan) for name, plan in plans.items()
        }
        if any(desired.shares_keys(name, part) for name, part in parts.items()):
            return None
        touched = Touched()
        for name, part in sorted(parts.items()):
            touched.update(desired.remove(name))
            if part is not None:
                touched.update(desired.add(name, part))
        return touched

    def _observe(self, fam: FamilyPlan) -> Observed:
        v6 = fam.family is IPFamily.IPv6
        ipvs = self.ipvs
        services = {vs.key: vs for vs in ipvs.services() if vs.key.v6 == v6}
        dests = {key: {d.endpoint: d for d in ipvs.destinations(key)} for key in services}
        bound = {a for a in self.links.addresses(n.DUMMY_DEVICE) if (":" in a) == v6}
        ours = {spec.name for spec in n.FamilySets(v6).specs()}
        members = {
            name: set(state.members) for name, state in self.ipset.sets().items() if name in ours
        }
        return Observed(services, dests, bound, members)

    def _rules(self, fam: FamilyPlan, desired: DesiredState) -> str:
        runner = self.runners[fam.family]
        return str(iptables_rules(fam, desired, RuleSettings(runner.has_random_fully)))

    def _ensure_jumps(self, runner: Iptables) -> None:
        for table, builtin, chain, comment in n.JUMPS:
            runner.ensure_chain(table, chain)
            runner.ensure_rule(table, builtin, ("-m", "comment", "--comment", comment, "-j", chain))

    # ----------------------------------------------------------------- apply

    def _done(self, what: Sequence[object], outcomes: Sequence[Outcome]) -> list[bool]:
        """Log and record each refusal; True for each item done."""
        done = []
        for item, outcome in zip(what, outcomes, strict=True):
            if outcome is not None:
                self.errors.append(f"{item}: {outcome}")
                log.error("IPVS: %s failed: %s", item, outcome)
            done.append(outcome is None)
        return done

    def _batch(self, changes: list[Change]) -> list[Change]:
        """Apply ``changes`` in one batch; the ones the kernel took."""
        if not changes:
            return []
        done = self._done(changes, self.ipvs.apply(changes))
        return [c for c, ok in zip(changes, done, strict=True) if ok]

    def _addresses(self, add: bool, addresses: list[str]) -> list[str]:
        if not addresses:
            return []
        call = self.links.add_addresses if add else self.links.delete_addresses
        verb = "bind" if add else "unbind"
        outcomes = call(n.DUMMY_DEVICE, addresses)
        done = self._done([f"{verb} {a}" for a in addresses], outcomes)
        return [a for a, ok in zip(addresses, done, strict=True) if ok]

    def _apply(self, state: _Family, desired: DesiredState, changes: Changes, full: bool) -> int:
        fam = state.plan
        runner = self.runners[fam.family]
        obs = state.observed
        # Sets first: the iptables rules name them.
        script = IpsetScript()
        for spec in changes.create_sets:
            script.create(spec)
            obs.members[spec.name] = set()
        for name, members in changes.set_adds.items():
            script.add(name, members)
        for name, members in changes.set_dels.items():
            script.delete(name, members)
        self.ipset.restore(script)
        for name, members in changes.set_adds.items():
            obs.members[name].update(members)
        for name, members in changes.set_dels.items():
            obs.members[name].difference_update(members)
        # Virtual servers before their destinations (a batch of their own, so that a
        # refused service does not also fail each of its destinations).
        services = [Change.add_service(vs) for vs in changes.add_services]
        services += [Change.set_service(vs) for vs in changes.set_services]
        done = self._batch(services)
        for change in done:
            assert change.service is not None
            obs.services[change.key] = change.service
            if change.op is Op.ADD_SERVICE:
                obs.dests[change.key] = {}
        ops = len(done)
        for key, dest in changes.set_dests:
            self.graceful.cancel(key, dest.endpoint)
        dests = [Change.add_dest(k, d) for k, d in changes.add_dests if k in obs.services]
        dests += [Change.set_dest(k, d) for k, d in changes.set_dests]
        ops += self._record_dests(obs, self._batch(dests))
        bound = self._addresses(True, changes.bind)
        obs.bound.update(bound)
        ops += len(bound)
        # The iptables rules once what they send traffic to is there, as upstream's
        # syncProxyRules: a node switched from iptables mode has its DNAT rules in the
        # chains of the same names, and until the virtual servers and their addresses
        # are in, replacing them would leave Service traffic to the default route.
        text = self._rules(fam, desired)
        if full or text != state.rules_text:
            if full:
                self._ensure_jumps(runner)
            runner.restore(iptables_rules(fam, desired, RuleSettings(runner.has_random_fully)))
            state.rules_text = text
        ops += self._remove_dests(changes.remove_dests, obs)
        unbound = self._addresses(False, changes.unbind)
        obs.bound.difference_update(unbound)
        ops += len(unbound)
        done = self._batch([Change.delete_service(key) for key in changes.delete_services])
        for change in done:
            obs.services.pop(change.key, None)
            obs.dests.pop(change.key, None)
            self.graceful.forget_service(change.key)
        return ops + len(done) + len(script)

    @staticmethod
    def _record_dests(obs: Observed, done: list[Change]) -> int:
        """Write the destination changes the kernel took into ``obs``."""
        for change in done:
            assert change.dest is not None
            table = obs.dests.setdefault(change.key, {})
            if change.op is Op.DELETE_DEST:
                table.pop(change.dest.endpoint, None)
            else:
                table[change.dest.endpoint] = change.dest
        return len(done)

    def _live(self, keys: Iterable[ServiceKey]) -> dict[ServiceKey, dict[Endpoint, Destination]]:
        """The kernel's destinations (with connection counts) of each service."""
        live: dict[ServiceKey, dict[Endpoint, Destination]] = {}
        for key in keys:
            try:
                live[key] = {d.endpoint: d for d in self.ipvs.destinations(key)}
            except IpvsError as err:
                self.errors.append(f"list destinations of {key}: {err}")
                live[key] = {}
        return live

    def _remove_dests(self, removals: list[tuple[ServiceKey, Destination]], obs: Observed) -> int:
        """Graceful termination's decision for each removed real server, as one batch."""
        now = self.clock()
        # The decision needs the kernel's connection counts, as upstream reads them.
        asking = {
            key
            for key, dest in removals
            if needs_grace(key) and not self.graceful.is_waiting(key, dest.endpoint)
        }
        live = self._live(sorted(asking))
        out: list[Change] = []
        for key, known in removals:
            dest = live[key].get(known.endpoint) if key in live else known
            if dest is None:  # gone already
                obs.dests[key].pop(known.endpoint, None)
                continue
            action = self.graceful.remove(key, dest, now)
            if action is Action.DELETE:
                out.append(Change.delete_dest(key, dest))
            elif action is Action.QUIESCE and dest.weight != 0:
                out.append(Change.set_dest(key, Destination(dest.address, dest.port, 0)))
        return self._record_dests(obs, self._batch(out))

    def flush_terminated(self) -> int:
        """Delete the real servers graceful termination is done waiting for."""
        due = self.graceful.due(self.clock())
        if not due:
            return 0
        listed = self._live(sorted({key for key, _ in due}))
        deletes = []
        for key, endpoint in due:
            dest = listed[key].get(endpoint)
            if self.graceful.settle((key, endpoint), dest, self.clock()) and dest is not None:
                deletes.append(Change.delete_dest(key, dest))
        done = self._batch(deletes)
        for state in self._families.values():
            for change in done:
                assert change.dest is not None
                state.observed.dests.get(change.key, {}).pop(change.dest.endpoint, None)
        return len(done)

    # ----------------------------------------------------------------- public

    def _begin(self, node_plan: NodePlan) -> None:
        self.errors = []
        try:
            self.links.ensure_dummy(n.DUMMY_DEVICE)
            self._node_addrs = self.links.node_addresses(n.DUMMY_DEVICE)
        except IpvsError as err:
            raise BackendError(f"{n.DUMMY_DEVICE}: {err}") from None

    def _partial(
        self, node_plan: NodePlan, unit: Unit, changed: set[ServicePortName], result: SyncResult
    ) -> None:
        (fam,) = unit
        state = self._families[fam.family]
        ctx = Context.of(fam, self.scheduler, self._node_addrs)
        # Node addresses changed: the whole family's desired state is rendered again
        # (against what was observed before, so the diff is still small).
        scope = (
            self._update(node_plan, ctx, state.desired, changed) if state.context == ctx else None
        )
        self._translate(
            node_plan, state, ctx, scope=scope, result=result, changed=len(changed), full=False
        )

    def _full(self, node_plan: NodePlan, unit: Unit, result: SyncResult) -> None:
        (fam,) = unit
        state = self._families[fam.family] = _Family(fam, self._observe(fam))
        ctx = Context.of(fam, self.scheduler, self._node_addrs)
        self._translate(node_plan, state, ctx, scope=None, result=result, changed=0, full=True)

    def _translate(
        self,
        node_plan: NodePlan,
        state: _Family,
        ctx: Context,
        *,
        scope: Touched | None,
        result: SyncResult,
        changed: int,
        full: bool,
    ) -> None:
        """Diff ``state``'s desired state (``scope``: what a partial update touched; None:
        rendered whole, now) against what was observed, and apply the difference
        (``full``: ``state`` was just observed; the iptables rules are written anyway)."""
        if scope is None:
            state.desired = self._desired(node_plan, ctx)
            state.context = ctx
            result.rendered += len(state.desired.contributions)
        else:
            result.rendered += changed
        v6 = ctx.fam.family is IPFamily.IPv6
        changes = diff(
            state.desired,
            state.observed,
            v6=v6,
            specs=n.FamilySets(v6).specs(),
            exclude=self.exclude,
            scope=scope,
        )
        result.operations += self._apply(state, state.desired, changes, full)
        state.valid = not self.errors

    def _report(self, node_plan: NodePlan, result: SyncResult) -> None:
        for fam in self._fams(node_plan):
            desired = self._families[fam.family].desired
            result.elements += len(desired.services) + desired.dest_count
            result.conflicts.extend(desired.conflicts)
            result.count_no_local(fam.family, desired.no_local_internal, desired.no_local_external)
        result.operations += self.flush_terminated()

    def check(self) -> str | None:
        """Deletes terminated real servers that are due; then the canary: kube-ipvs0 and
        the nat KUBE-SERVICES chain still exist."""
        with contextlib.suppress(BackendError):
            self.flush_terminated()
        if not self._families:
            return None
        try:
            if not self.links.exists(n.DUMMY_DEVICE):
                return f"{n.DUMMY_DEVICE} is gone"
        except IpvsError as err:
            return str(err)
        for family, runner in self.runners.items():
            if family not in self._families:
                continue
            try:
                if not runner.chain_exists("nat", n.KUBE_SERVICES):
                    return f"{family.value} nat table lost {n.KUBE_SERVICES}"
            except IptablesError as err:
                return str(err).splitlines()[0]
        return None

    def render_plan(self, node_plan: NodePlan) -> str:
        """What a sync from scratch programs: IPVS as ``ipvsadm --save -n`` prints it,
        the kube-ipvs0 addresses, the ipset restore input and the iptables-restore input.

        NodePort virtual servers go on the Node object's primary IPs (as ``explain``
        offline): ``render`` describes the node the flags name, which need not be the
        machine it runs on, so this machine's addresses say nothing about it."""
        node_addrs = set(node_plan.snapshot.node.primary_ips.values())
        out: list[str] = []
        for fam in self._fams(node_plan):
            v6 = fam.family is IPFamily.IPv6
            desired = self._desired(node_plan, Context.of(fam, self.scheduler, node_addrs))
            out.append(f"# IPVS ({fam.family.value}), as ipvsadm --save -n\n")
            for key, vs in sorted(desired.services.items()):
                out.append(_ipvsadm_service(vs) + "\n")
                for (ip, port), weight in sorted(desired.dests[key].items()):
                    host = f"[{ip}]" if ":" in ip else ip
                    out.append(f"-a {_ipvsadm_key(key)} -r {host}:{port} -m -w {weight}\n")
            out.append(f"# {n.DUMMY_DEVICE} addresses ({fam.family.value})\n")
            out.extend(f"{a}\n" for a in sorted(desired.bind))
            script = IpsetScript()
            for spec in n.FamilySets(v6).specs():
                script.create(spec)
                script.add(spec.name, desired.members.get(spec.name, ()))
            out.append(f"# ipset restore -exist ({fam.family.value})\n{script}")
            tool = "ip6tables-restore" if v6 else "iptables-restore"
            rules = iptables_rules(fam, desired, RuleSettings())
            out.append(f"# {tool} --noflush ({fam.family.value})\n{rules}")
        return "".join(out)


def _ipvsadm_key(key: ServiceKey) -> str:
    flag = {"TCP": "-t", "UDP": "-u", "SCTP": "--sctp-service"}[key.protocol]
    host = f"[{key.address}]" if key.v6 else key.address
    return f"{flag} {host}:{key.port}"


def _ipvsadm_service(vs: VirtualServer) -> str:
    out = f"-A {_ipvsadm_key(vs.key)} -s {vs.scheduler}"
    prefix = vs.scheduler if vs.scheduler in ("sh", "mh") else "flag"
    names = [
        name
        for bit, name in ((FLAG_SCHED1, f"{prefix}-fallback"), (FLAG_SCHED2, f"{prefix}-port"))
        if vs.flags & bit
    ]
    if names:
        out += " -b " + ",".join(names)
    if vs.flags & FLAG_PERSISTENT:
        out += f" -p {vs.timeout}"
    return out


def cleanup_is_ours(chain: str) -> bool:
    return chain in set(n.NAT_CHAINS) | set(n.FILTER_CHAINS)


def owned() -> Keep:
    """ipvs mode's chains and jumps: what a cleanup of iptables mode (which uses some of
    the same names) leaves while ipvs mode runs."""
    return Keep(
        chains=frozenset(
            [("nat", c) for c in n.NAT_CHAINS] + [("filter", c) for c in n.FILTER_CHAINS]
        ),
        jumps=frozenset(_jumps()),
    )


def _jumps() -> list[Jump]:
    return [
        (table, builtin, ("-m", "comment", "--comment", comment, "-j", chain))
        for table, builtin, chain, comment in n.JUMPS
    ]


def cleanup(
    ipvs: Ipvs | None,
    links: Links,
    ipset: Ipset,
    runners: list[Iptables],
    keep: KeepMap | None = None,
) -> list[str]:
    """Remove what ipvs mode (ours, or upstream's) created, and only that: the virtual
    servers on kube-ipvs0's addresses and the NodePort ones whose port is in our NodePort
    sets (upstream flushes the whole IPVS table; other users' virtual servers stay here),
    kube-ipvs0, our chains in both flavours and families but what ``keep`` names per
    (flavour, family) (the running iptables mode's), then our sets (iptables no longer
    uses them). ``ipvs`` None: the kernel has no IPVS."""

    removed: list[str] = []
    errors: list[str] = []
    try:
        sets = {name: s for name, s in ipset.sets().items() if name in n.all_set_names()}
    except IpsetError as err:
        if not err.missing:  # without the tool, no set of ours was ever created
            errors.append(f"ipset: {err}")
        sets = {}
    try:
        dummy = links.exists(n.DUMMY_DEVICE)
    except IpvsError as err:
        errors.append(str(err))
        dummy = False
    if not sets and not dummy and not errors:
        # ipvs mode leaves both behind: without either it never ran here (or was cleaned
        # up), and nothing would tell its virtual servers from anyone else's. This keeps
        # the start of the other modes cheap.
        return []
    node_ports: set[tuple[str, int]] = set()
    for name, state in sets.items():
        for base, proto in (
            (n.NODE_PORT_TCP, "TCP"),
            (n.NODE_PORT_UDP, "UDP"),
            (n.NODE_PORT_SCTP, "SCTP"),
        ):
            if name in (n.set_name(base, False), n.set_name(base, True)):
                for m in state.members:
                    node_ports.add((proto, int(m.rsplit(":", 1)[-1])))
    try:
        bound = links.addresses(n.DUMMY_DEVICE)
    except IpvsError as err:
        errors.append(str(err))
        bound = set()
    if ipvs is not None:
        try:
            ours = [
                vs.key
                for vs in ipvs.services()
                if vs.key.address in bound or (vs.key.protocol, vs.key.port) in node_ports
            ]
            outcomes = ipvs.apply([Change.delete_service(key) for key in ours])
            for key, outcome in zip(ours, outcomes, strict=True):
                if outcome is None:
                    removed.append(f"ipvs service {key}")
                else:
                    errors.append(f"ipvs: {outcome}")
        except IpvsError as err:
            errors.append(f"ipvs: {err}")
    try:
        if links.delete_link(n.DUMMY_DEVICE):
            removed.append(f"link {n.DUMMY_DEVICE}")
    except IpvsError as err:
        errors.append(str(err))
    jumps = _jumps()
    for runner in runners:
        if runner.available() is not None:
            continue
        mine = (keep or {}).get((runner.flavor, runner.family), NOTHING)
        try:
            removed.extend(
                f"{runner}: {item}" for item in cleanup_chains(runner, cleanup_is_ours, jumps, mine)
            )
        except IptablesError as err:
            errors.append(f"{runner}: {err}")
    if sets:
        script = IpsetScript()
        for name in sorted(sets):
            script.destroy(name)
        try:
            ipset.restore(script)
            removed.extend(f"ipset {name}" for name in sorted(sets))
        except IpsetError as err:
            errors.append(f"ipset: {err}")
    if errors:
        raise BackendError("ipvs cleanup: " + "; ".join(errors))
    return removed
