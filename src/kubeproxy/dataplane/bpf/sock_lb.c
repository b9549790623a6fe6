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
 *   kp_rev4/6 (socket cookie, endpoint) -> frontend, for recvmsg and getpeername.
 *
 * The IPv4 and IPv6 halves are the same code on different address sizes.
 *
 * Addresses and ports are kept in network byte order, as the hooks see them.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>


struct svc_key4 {
	__u32 addr;
	__u16 port;
	__u16 slot;
	__u8 proto;
	__u8 pad[3];
};

struct endpoint4 {
	__u32 addr;
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

/* The endpoint for a new socket to (addr, port, proto), or NULL to leave it alone. */
static __always_inline struct endpoint4 *pick4(__u32 addr, __u16 port, __u8 proto, __u32 hash)
{
	struct svc_key4 key = {.addr = addr, .port = port, .slot = 0, .proto = proto};
	struct endpoint4 *svc = bpf_map_lookup_elem(&kp_svc4, &key);

	if (!svc || svc->count == 0)
		return 0;
	key.slot = (__u16)(hash % svc->count) + 1;
	return bpf_map_lookup_elem(&kp_svc4, &key);
}

static __always_inline void remember4(struct bpf_sock_addr *ctx, struct endpoint4 *ep)
{
	struct rev_key4 rkey = {
		.cookie = bpf_get_socket_cookie(ctx),
		.addr = ep->addr,
		.port = ep->port,
	};
	struct endpoint4 front = {.addr = ctx->user_ip4, .port = (__u16)ctx->user_port};

	bpf_map_update_elem(&kp_rev4, &rkey, &front, BPF_ANY);
}

static __always_inline int rewrite4(struct bpf_sock_addr *ctx, __u32 hash)
{
	__u8 proto = ctx->protocol;
	struct endpoint4 *ep;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	ep = pick4(ctx->user_ip4, (__u16)ctx->user_port, proto, hash);
	if (!ep)
		return 1;
	remember4(ctx, ep);
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
	__u32 addr[4];
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

static __always_inline int rewrite6(struct bpf_sock_addr *ctx, __u32 hash)
{
	__u8 proto = ctx->protocol;
	struct svc_key6 key = {.slot = 0};
	struct endpoint6 *svc, *ep;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	ctx_ip6(ctx, key.addr);
	key.port = (__u16)ctx->user_port;
	key.proto = proto;
	svc = bpf_map_lookup_elem(&kp_svc6, &key);
	if (!svc || svc->count == 0)
		return 1;
	key.slot = (__u16)(hash % svc->count) + 1;
	ep = bpf_map_lookup_elem(&kp_svc6, &key);
	if (!ep)
		return 1;

	struct rev_key6 rkey = {.cookie = bpf_get_socket_cookie(ctx), .port = ep->port};
	struct endpoint6 front = {.port = key.port};

	__builtin_memcpy(rkey.addr, ep->addr, sizeof(rkey.addr));
	__builtin_memcpy(front.addr, key.addr, sizeof(front.addr));
	bpf_map_update_elem(&kp_rev6, &rkey, &front, BPF_ANY);
	set_ctx_ip6(ctx, ep->addr);
	ctx->user_port = ep->port;
	return 1;
}

static __always_inline void restore6(struct bpf_sock_addr *ctx)
{
	struct rev_key6 rkey = {.cookie = bpf_get_socket_cookie(ctx)};
	struct endpoint6 *front;

	ctx_ip6(ctx, rkey.addr);
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
