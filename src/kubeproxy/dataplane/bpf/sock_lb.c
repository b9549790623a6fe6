// SPDX-License-Identifier: GPL-2.0
/*
 * kubeproxy's socket load-balancer (--proxy-mode ebpf): cgroup sock_addr hooks that
 * rewrite a Service frontend (ClusterIP:port) to one of its endpoints inside connect()
 * and sendmsg(), before any packet exists, so no DNAT and no NAT conntrack entry is
 * needed; recvmsg() and getpeername() give the frontend back to the application.
 *
 * Maps (the Python side, kubeproxy.dataplane.bpf.socklb, packs the same layouts):
 *   kp_svc4/6 (frontend, slot) -> endpoint. Slot 0 is the frontend's own entry: its
 *             value's count is how many endpoints follow in slots 1..count. A frontend
 *             with no entry (or count 0) is left alone: the nftables rules then
 *             handle it (REJECT, DROP, session affinity...), as in nftables mode.
 *             Slot 0's address field holds the ServicePort's ClientIP affinity
 *             timeout in seconds instead (0: no affinity).
 *   kp_rev4/6 (socket cookie, endpoint) -> frontend, for recvmsg and getpeername.
 *   kp_aff4/6 (client, frontend) -> the endpoint it was given and when (ClientIP
 *             session affinity). The client is the socket's network namespace (its
 *             cookie): at connect() a socket has no source address yet, and a Pod's
 *             namespace is that Pod's IP (the node's for host processes).
 *
 * Layout changes need socklb.LAYOUT bumped (the maps are pinned across restarts).
 * The IPv4 and IPv6 halves are the same code on different address sizes; IPv4-mapped
 * IPv6 destinations (::ffff:a.b.c.d, dual-stack sockets) use the IPv4 maps.
 *
 * Addresses and ports are kept in network byte order, as the hooks see them.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define NSEC_PER_SEC 1000000000ULL


struct svc_key4 {
	__u32 addr;
	__u16 port;
	__u16 slot;
	__u8 proto;
	__u8 pad[3];
};

struct endpoint4 {
	union {
		__u32 addr;
		__u32 affinity_timeout; /* slot 0 only: seconds, 0 for none */
	};
	__u16 port;
	__u16 count; /* slot 0 only: how many endpoint slots follow */
};

struct rev_key4 {
	__u64 cookie;
	__u32 addr;
	__u16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	/* 30,000 Services of 10 endpoints take 330,000; not preallocated. */
	__uint(max_entries, 1048576);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct svc_key4);
	__type(value, struct endpoint4);
} kp_svc4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct rev_key4);
	__type(value, struct endpoint4);
} kp_rev4 SEC(".maps");

struct affinity_key4 {
	__u64 netns;
	__u32 addr;
	__u16 port;
	__u8 proto;
	__u8 pad;
};

struct affinity4 {
	__u64 used; /* bpf_ktime_get_ns() of the client's last new connection */
	__u32 addr;
	__u16 port;
	__u16 slot;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct affinity_key4);
	__type(value, struct affinity4);
} kp_aff4 SEC(".maps");

/* The endpoint for a new socket to (addr, port, proto), or NULL to leave it alone.
 * With affinity, the client's last endpoint while it is still in the same slot and
 * the timeout (counted from the client's last new connection, as upstream's nftables
 * set refreshes it) has not run out. */
static __always_inline struct endpoint4 *pick4(struct bpf_sock_addr *ctx, __u32 addr,
					       __u16 port, __u8 proto, __u32 hash)
{
	struct svc_key4 key = {.addr = addr, .port = port, .slot = 0, .proto = proto};
	struct endpoint4 *svc = bpf_map_lookup_elem(&kp_svc4, &key);
	struct endpoint4 *ep;

	if (!svc || svc->count == 0)
		return 0;
	__u16 count = svc->count;
	__u64 timeout = svc->affinity_timeout * NSEC_PER_SEC;

	if (!timeout) {
		key.slot = (__u16)(hash % count) + 1;
		return bpf_map_lookup_elem(&kp_svc4, &key);
	}
	struct affinity_key4 akey = {
		.netns = bpf_get_netns_cookie(ctx), .addr = addr, .port = port, .proto = proto};
	struct affinity4 *aff = bpf_map_lookup_elem(&kp_aff4, &akey);
	__u64 now = bpf_ktime_get_ns();

	if (aff && now - aff->used <= timeout && aff->slot >= 1 && aff->slot <= count) {
		key.slot = aff->slot;
		ep = bpf_map_lookup_elem(&kp_svc4, &key);
		if (ep && ep->addr == aff->addr && ep->port == aff->port) {
			aff->used = now;
			return ep;
		}
	}
	key.slot = (__u16)(hash % count) + 1;
	ep = bpf_map_lookup_elem(&kp_svc4, &key);
	if (ep) {
		struct affinity4 chosen = {
			.used = now, .addr = ep->addr, .port = ep->port, .slot = key.slot};
		bpf_map_update_elem(&kp_aff4, &akey, &chosen, BPF_ANY);
	}
	return ep;
}

static __always_inline void remember4(struct bpf_sock_addr *ctx, struct endpoint4 *ep,
				     __u32 addr, __u16 port)
{
	struct rev_key4 rkey = {
		.cookie = bpf_get_socket_cookie(ctx),
		.addr = ep->addr,
		.port = ep->port,
	};
	struct endpoint4 front = {.addr = addr, .port = port};

	bpf_map_update_elem(&kp_rev4, &rkey, &front, BPF_ANY);
}

static __always_inline int rewrite4(struct bpf_sock_addr *ctx, __u32 hash)
{
	__u8 proto = ctx->protocol;
	struct endpoint4 *ep;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	__u32 addr = ctx->user_ip4;
	__u16 port = (__u16)ctx->user_port;

	ep = pick4(ctx, addr, port, proto, hash);
	if (!ep)
		return 1;
	remember4(ctx, ep, addr, port);
	ctx->user_ip4 = ep->addr;
	ctx->user_port = ep->port;
	return 1;
}

/* A new connection: any endpoint, at random (nftables mode's numgen random). */
SEC("cgroup/connect4")
int kp_connect4(struct bpf_sock_addr *ctx)
{
	return rewrite4(ctx, bpf_get_prandom_u32());
}

/* An unconnected UDP datagram: the same endpoint for every datagram of this socket,
 * as a conntrack entry keeps one flow on one endpoint in nftables mode. */
SEC("cgroup/sendmsg4")
int kp_sendmsg4(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);

	return rewrite4(ctx, (__u32)((cookie * 0x9E3779B97F4A7C15ULL) >> 32));
}

static __always_inline void restore4(struct bpf_sock_addr *ctx)
{
	struct rev_key4 rkey = {
		.cookie = bpf_get_socket_cookie(ctx),
		.addr = ctx->user_ip4,
		.port = (__u16)ctx->user_port,
	};
	struct endpoint4 *front = bpf_map_lookup_elem(&kp_rev4, &rkey);

	if (!front)
		return;
	ctx->user_ip4 = front->addr;
	ctx->user_port = front->port;
}

/* A UDP reply: its source becomes the frontend the application sent to (DNS clients
 * check it). */
SEC("cgroup/recvmsg4")
int kp_recvmsg4(struct bpf_sock_addr *ctx)
{
	restore4(ctx);
	return 1;
}

SEC("cgroup/getpeername4")
int kp_getpeername4(struct bpf_sock_addr *ctx)
{
	restore4(ctx);
	return 1;
}

/* ------------------------------------------------------------------- IPv6 */

struct svc_key6 {
	__u32 addr[4];
	__u16 port;
	__u16 slot;
	__u8 proto;
	__u8 pad[3];
};

struct endpoint6 {
	union {
		__u32 addr[4];
		__u32 affinity_timeout; /* slot 0 only */
	};
	__u16 port;
	__u16 count;
};

struct rev_key6 {
	__u64 cookie;
	__u32 addr[4];
	__u16 port;
	__u16 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1048576);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct svc_key6);
	__type(value, struct endpoint6);
} kp_svc6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct rev_key6);
	__type(value, struct endpoint6);
} kp_rev6 SEC(".maps");

/* The context's address, one 4-byte word at a time (all the verifier allows). */
static __always_inline void ctx_ip6(struct bpf_sock_addr *ctx, __u32 *addr)
{
	addr[0] = ctx->user_ip6[0];
	addr[1] = ctx->user_ip6[1];
	addr[2] = ctx->user_ip6[2];
	addr[3] = ctx->user_ip6[3];
}

static __always_inline void set_ctx_ip6(struct bpf_sock_addr *ctx, const __u32 *addr)
{
	ctx->user_ip6[0] = addr[0];
	ctx->user_ip6[1] = addr[1];
	ctx->user_ip6[2] = addr[2];
	ctx->user_ip6[3] = addr[3];
}

struct affinity_key6 {
	__u64 netns;
	__u32 addr[4];
	__u16 port;
	__u8 proto;
	__u8 pad[5];
};

struct affinity6 {
	__u64 used;
	__u32 addr[4];
	__u16 port;
	__u16 slot;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct affinity_key6);
	__type(value, struct affinity6);
} kp_aff6 SEC(".maps");

static __always_inline int same6(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* pick4's IPv6 half. */
static __always_inline struct endpoint6 *pick6(struct bpf_sock_addr *ctx, struct svc_key6 *key,
					       __u32 hash)
{
	struct endpoint6 *svc = bpf_map_lookup_elem(&kp_svc6, key);
	struct endpoint6 *ep;

	if (!svc || svc->count == 0)
		return 0;
	__u16 count = svc->count;
	__u64 timeout = svc->affinity_timeout * NSEC_PER_SEC;

	if (!timeout) {
		key->slot = (__u16)(hash % count) + 1;
		return bpf_map_lookup_elem(&kp_svc6, key);
	}
	struct affinity_key6 akey = {
		.netns = bpf_get_netns_cookie(ctx), .port = key->port, .proto = key->proto};
	__builtin_memcpy(akey.addr, key->addr, sizeof(akey.addr));
	struct affinity6 *aff = bpf_map_lookup_elem(&kp_aff6, &akey);
	__u64 now = bpf_ktime_get_ns();

	if (aff && now - aff->used <= timeout && aff->slot >= 1 && aff->slot <= count) {
		key->slot = aff->slot;
		ep = bpf_map_lookup_elem(&kp_svc6, key);
		if (ep && same6(ep->addr, aff->addr) && ep->port == aff->port) {
			aff->used = now;
			return ep;
		}
	}
	key->slot = (__u16)(hash % count) + 1;
	ep = bpf_map_lookup_elem(&kp_svc6, key);
	if (ep) {
		struct affinity6 chosen = {.used = now, .port = ep->port, .slot = key->slot};

		__builtin_memcpy(chosen.addr, ep->addr, sizeof(chosen.addr));
		bpf_map_update_elem(&kp_aff6, &akey, &chosen, BPF_ANY);
	}
	return ep;
}

static __always_inline int mapped4(const __u32 *addr)
{
	return addr[0] == 0 && addr[1] == 0 && addr[2] == bpf_htonl(0xffff);
}

static __always_inline int rewrite6(struct bpf_sock_addr *ctx, __u32 hash)
{
	__u8 proto = ctx->protocol;
	struct svc_key6 key = {.slot = 0};
	__u32 to[4];
	__u16 to_port;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	ctx_ip6(ctx, key.addr);
	key.port = (__u16)ctx->user_port;
	key.proto = proto;
	if (mapped4(key.addr)) {
		/* ::ffff:a.b.c.d from a dual-stack socket: the IPv4 Service, remembered in
		 * kp_rev4 (unconnected UDP goes through sendmsg4, with the IPv4 address). */
		struct endpoint4 *ep4 = pick4(ctx, key.addr[3], key.port, proto, hash);

		if (!ep4)
			return 1;
		remember4(ctx, ep4, key.addr[3], key.port);
		ctx->user_ip6[3] = ep4->addr;
		ctx->user_port = ep4->port;
		return 1;
	}
	struct endpoint6 *ep = pick6(ctx, &key, hash);

	if (!ep)
		return 1;
	__builtin_memcpy(to, ep->addr, sizeof(to));
	to_port = ep->port;

	struct rev_key6 rkey = {.cookie = bpf_get_socket_cookie(ctx), .port = to_port};
	struct endpoint6 front = {.port = key.port};

	__builtin_memcpy(rkey.addr, to, sizeof(rkey.addr));
	__builtin_memcpy(front.addr, key.addr, sizeof(front.addr));
	bpf_map_update_elem(&kp_rev6, &rkey, &front, BPF_ANY);
	set_ctx_ip6(ctx, to);
	ctx->user_port = to_port;
	return 1;
}

static __always_inline void restore6(struct bpf_sock_addr *ctx)
{
	struct rev_key6 rkey = {.cookie = bpf_get_socket_cookie(ctx)};
	struct endpoint6 *front;

	ctx_ip6(ctx, rkey.addr);
	if (mapped4(rkey.addr)) {
		struct rev_key4 rkey4 = {
			.cookie = rkey.cookie, .addr = rkey.addr[3], .port = (__u16)ctx->user_port};
		struct endpoint4 *front4 = bpf_map_lookup_elem(&kp_rev4, &rkey4);

		if (front4) {
			ctx->user_ip6[3] = front4->addr;
			ctx->user_port = front4->port;
		}
		return;
	}
	rkey.port = (__u16)ctx->user_port;
	front = bpf_map_lookup_elem(&kp_rev6, &rkey);
	if (!front)
		return;
	set_ctx_ip6(ctx, front->addr);
	ctx->user_port = front->port;
}

SEC("cgroup/connect6")
int kp_connect6(struct bpf_sock_addr *ctx)
{
	return rewrite6(ctx, bpf_get_prandom_u32());
}

SEC("cgroup/sendmsg6")
int kp_sendmsg6(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);

	return rewrite6(ctx, (__u32)((cookie * 0x9E3779B97F4A7C15ULL) >> 32));
}

SEC("cgroup/recvmsg6")
int kp_recvmsg6(struct bpf_sock_addr *ctx)
{
	restore6(ctx);
	return 1;
}

SEC("cgroup/getpeername6")
int kp_getpeername6(struct bpf_sock_addr *ctx)
{
	restore6(ctx);
	return 1;
}

char _license[] SEC("license") = "GPL";
