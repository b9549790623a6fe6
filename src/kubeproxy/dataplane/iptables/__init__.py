"""Thin wrappers over iptables-restore / iptables-save (nft and legacy), with a strict fake."""
