"""iptables for the iptables proxy mode (nft and legacy flavours), with a strict fake.

* :mod:`.restore` -- an ``iptables-restore`` input as data (what backends build);
* :mod:`.runner` -- the :class:`~.runner.Iptables` interface, :class:`~.runner.IptablesCommand`
  (the real commands) and :func:`~.runner.detect_flavor`;
* :mod:`.rules` -- the rule language: parse, refuse, print as ``iptables-save`` does;
* :mod:`.fake` -- :class:`~.fake.FakeIptables`, the in-memory stand-in for tests;
* :mod:`.cleanup` -- removing a mode's chains (``kubeproxy cleanup``).
"""
