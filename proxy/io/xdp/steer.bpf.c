// SPDX-License-Identifier: Apache-2.0
//
// Sōya's XDP steering program (dc.backend = "xdp"; see
// proxy/io/src/xdp/mod.rs for the whole design).
//
// For every frame received on the DC interface: an untagged IPv4 or IPv6
// packet whose source is in `local_prefixes` and whose destination is in
// `remote_prefixes` is redirected into the AF_XDP socket of its shard,
// XSKMAP slot shard_of_pair(src, dst) % shards. Everything else (ARP, IPv6
// neighbour discovery, management traffic, other prefixes, VLAN tags) gets
// XDP_PASS and goes on to the kernel untouched.
//
// The shard hash is the one of proxy/src/gateway/shard.rs `shard_of_pair`,
// reimplemented byte for byte: FNV-1a 64 over the smaller then the larger
// address (IPv4 as IPv4-mapped IPv6, compared as 16 bytes), then
// splitmix64's finaliser, then modulo the shard count. A test runs this
// program with BPF_PROG_TEST_RUN and checks it agrees with the Rust one.
//
// "xdp.frags": the program accepts multi-buffer frames, which a veth (or a
// NIC) with an MTU above a page needs; RoCE at a 4096-byte path MTU sends
// ~4.2 KB frames. Only the first buffer (the headers) is read here.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// LPM trie keys: prefix length in bits, then the address in network order.
struct key4 {
	__u32 prefixlen;
	__u8 addr[4];
};

struct key6 {
	__u32 prefixlen;
	__u8 addr[16];
};

#define MAX_PREFIXES 1024
#define MAX_SHARDS 64

#define LPM_MAP(name, keytype)                                                 \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);                           \
		__type(key, struct keytype);                                   \
		__type(value, __u8);                                           \
		__uint(max_entries, MAX_PREFIXES);                             \
		__uint(map_flags, BPF_F_NO_PREALLOC);                          \
	} name SEC(".maps")

LPM_MAP(LOCAL4, key4);
LPM_MAP(REMOTE4, key4);
LPM_MAP(LOCAL6, key6);
LPM_MAP(REMOTE6, key6);

// Slot i: the AF_XDP socket of shard i.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, MAX_SHARDS);
} XSKS SEC(".maps");

// Slot 0: the number of shards (0 until the loader sets it: pass all).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} SHARDS SEC(".maps");

static __always_inline __u64 fnv_bytes(__u64 h, const __u8 *b)
{
#pragma unroll
	for (int i = 0; i < 16; i++) {
		h ^= b[i];
		h *= 0x00000100000001b3ULL;
	}
	return h;
}

// shard_of_pair of proxy/src/gateway/shard.rs, for canonical (16-byte)
// addresses a and b.
static __always_inline __u32 shard_of_pair(const __u8 *a, const __u8 *b,
					   __u32 shards)
{
	if (shards <= 1)
		return 0;
	// Lexicographic comparison, as Rust's `[u8; 16] <= [u8; 16]`.
	int a_le_b = 1;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		if (a[i] != b[i]) {
			a_le_b = a[i] < b[i];
			break;
		}
	}
	const __u8 *lo = a_le_b ? a : b;
	const __u8 *hi = a_le_b ? b : a;
	__u64 h = 0xcbf29ce484222325ULL;
	h = fnv_bytes(h, lo);
	h = fnv_bytes(h, hi);
	h ^= h >> 30;
	h *= 0xbf58476d1ce4e5b9ULL;
	h ^= h >> 27;
	h *= 0x94d049bb133111ebULL;
	h ^= h >> 31;
	return (__u32)(h % (__u64)shards);
}

// Slot i: packets steered to shard i (per CPU; read by the gateway for
// its status, and by the tests to see the shard the hash chose).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, MAX_SHARDS);
} STEERED SEC(".maps");

SEC("xdp.frags")
int soya_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u8 src[16] = {}, dst[16] = {};

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end || ip->version != 4)
			return XDP_PASS;
		struct key4 k = { .prefixlen = 32 };
		__builtin_memcpy(k.addr, &ip->saddr, 4);
		if (!bpf_map_lookup_elem(&LOCAL4, &k))
			return XDP_PASS;
		__builtin_memcpy(k.addr, &ip->daddr, 4);
		if (!bpf_map_lookup_elem(&REMOTE4, &k))
			return XDP_PASS;
		// IPv4-mapped IPv6: ::ffff:a.b.c.d
		src[10] = 0xff;
		src[11] = 0xff;
		dst[10] = 0xff;
		dst[11] = 0xff;
		__builtin_memcpy(&src[12], &ip->saddr, 4);
		__builtin_memcpy(&dst[12], &ip->daddr, 4);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end || ip6->version != 6)
			return XDP_PASS;
		struct key6 k = { .prefixlen = 128 };
		__builtin_memcpy(k.addr, &ip6->saddr, 16);
		if (!bpf_map_lookup_elem(&LOCAL6, &k))
			return XDP_PASS;
		__builtin_memcpy(k.addr, &ip6->daddr, 16);
		if (!bpf_map_lookup_elem(&REMOTE6, &k))
			return XDP_PASS;
		__builtin_memcpy(src, &ip6->saddr, 16);
		__builtin_memcpy(dst, &ip6->daddr, 16);
	} else {
		return XDP_PASS;
	}
	__u32 zero = 0;
	__u32 *shards = bpf_map_lookup_elem(&SHARDS, &zero);
	if (!shards || *shards == 0)
		return XDP_PASS;
	__u32 shard = shard_of_pair(src, dst, *shards);
	__u64 *count = bpf_map_lookup_elem(&STEERED, &shard);
	if (count)
		*count += 1;
	// XDP_PASS when the slot has no socket (not bound yet, or gone).
	return bpf_redirect_map(&XSKS, shard, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
