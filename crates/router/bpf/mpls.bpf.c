// SPDX-License-Identifier: MIT OR GPL-2.0
//
// blockwire's kernel datapath for MPLS label switching: the same decisions
// as bw_mpls::LabelRouter (crates/mpls/src/switch.rs), which stays the
// reference and is checked against this file byte for byte
// (crates/cli/tests/integration/mpls.rs, bpf_datapath_matches_the_state_machine).
//
// Two programs, loaded and attached by crates/router/src/bpf.rs:
//
// - bw_mpls_tc (tcx ingress, on every router port):
//     customer port: push. The whole customer Ethernet frame gets a new
//       Ethernet header, the two-label stack and the pseudowire control word
//       in front (bpf_skb_change_head: bpf_skb_adjust_room refuses non-IP
//       frames such as AoE), then goes to the core port (bpf_redirect).
//     core port: swap the top label, decrement its TTL, rewrite the MACs,
//       redirect. Drops are counted by reason.
// - bw_mpls_xdp (XDP, generic mode, on the core ports of edge routers): pop.
//   A tc program cannot remove bytes in front of a non-IP frame (there is no
//   shrinking counterpart of bpf_skb_change_head, and bpf_skb_adjust_room
//   wants skb->protocol IPv4/IPv6), but XDP can (bpf_xdp_adjust_head). Frames
//   to swap are passed on to bw_mpls_tc; drops are counted here.
//
// The tables (ports, pseudowires, swaps, pops) come from the router's spec,
// the same one the userspace router uses; the pushed header is encoded in
// Rust by bw_mpls and only copied here.

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ETH_HLEN 14
#define ENTRY_LEN 4
#define CONTROL_WORD_LEN 4
// Outer Ethernet + route label + customer label + control word.
#define PUSH_LEN (ETH_HLEN + 2 * ENTRY_LEN + CONTROL_WORD_LEN)
#define MAX_STACK_DEPTH 8
#define FIRST_UNRESERVED_LABEL 16
#define ETH_P_MPLS_UC 0x8847
// Bytes that must be in the linear part for every check: the deepest stack
// walk (14 + 8 * 4) and the pop checks (26 + 14).
#define PULL_LEN 64
#define MAX_ETHERTYPES 8
#define MAX_PORTS 16

// Counter slots. The order of the drop reasons is bw_mpls::Drop's; the
// loader (bpf.rs, COUNTER_NAMES) names them the same way.
enum counter {
	C_RECEIVED = 0,
	C_FORWARDED,
	C_RUNT,
	C_UNKNOWN_PORT,
	C_NOT_FOR_US,
	C_NOT_MPLS,
	C_ETHERTYPE,
	C_BROKEN_STACK,
	C_TTL,
	C_RESERVED_LABEL,
	C_UNKNOWN_LABEL,
	C_CONTROL_WORD,
	C_TOO_BIG,
	// The kernel refused to grow or shrink the frame.
	C_SEND_ERRORS,
	// A frame to pop reached the tc program: bw_mpls_xdp is not attached.
	C_POP_WITHOUT_XDP,
	// Frames forwarded out of port i: C_PORT_BASE + i.
	C_PORT_BASE = 16,
	C_COUNTERS = C_PORT_BASE + MAX_PORTS,
};

struct port {
	__u8 mac[6];
	// 1: the customer port of pseudowire `pw`; 0: a core port.
	__u8 customer;
	__u8 index;
	__u32 pw;
};

struct pseudowire {
	// What the ingress edge puts in front of the customer frame: next hop,
	// core port MAC, 0x8847, route entry, customer entry, control word.
	__u8 header[PUSH_LEN];
	__u8 core_index;
	__u8 customer_index;
	// 1: the core port is a veth whose peer is in another namespace (see
	// forward()).
	__u8 core_peer;
	__u8 pad[3];
	__u32 core_ifindex;
	__u32 customer_ifindex;
	// Largest frame (Ethernet header included) each port may send.
	__u32 core_max_frame;
	__u32 customer_max_frame;
};

struct swap {
	__u8 next_hop[6];
	__u8 src_mac[6];
	__u32 out_label;
	__u32 ifindex;
	__u32 max_frame;
	__u32 index;
	// As pseudowire.core_peer, for the output port.
	__u32 peer;
};

struct settings {
	__u32 n_ethertypes;
	// Host byte order.
	__u16 ethertypes[MAX_ETHERTYPES];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32); // ifindex
	__type(value, struct port);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32);
	__type(value, struct pseudowire);
} pseudowires SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); // incoming label
	__type(value, struct swap);
} swaps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); // label that ends here
	__type(value, __u8);
} pops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PORTS);
	__type(key, __u32); // customer label
	__type(value, __u32); // pseudowire index
} customer_labels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct settings);
} settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &slot);
	if (c)
		*c += 1;
}

static __always_inline int carried(__u16 ethertype)
{
	__u32 zero = 0;
	struct settings *s = bpf_map_lookup_elem(&settings, &zero);
	if (!s)
		return 0;
#pragma unroll
	for (int i = 0; i < MAX_ETHERTYPES; i++) {
		if (i < s->n_ethertypes && s->ethertypes[i] == ethertype)
			return 1;
	}
	return 0;
}

static __always_inline __u32 entry_at(__u8 *e)
{
	return ((__u32)e[0] << 24) | ((__u32)e[1] << 16) | ((__u32)e[2] << 8) | e[3];
}

// clang turns __builtin_memcmp into a call to memcmp, which BPF lacks.
static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] &&
	       a[4] == b[4] && a[5] == b[5];
}

#define ENTRY_LABEL(e) ((e) >> 12)
#define ENTRY_BOTTOM(e) (((e) >> 8) & 1)
#define ENTRY_TTL(e) ((e) & 0xff)

enum action { A_DROP, A_SWAP, A_POP };

struct decision {
	enum action action;
	enum counter reason;
	__u32 top;
	struct swap *swap;
	struct pseudowire *pw;
};

static __always_inline int drop_for(struct decision *d, enum counter reason)
{
	d->action = A_DROP;
	d->reason = reason;
	return 0;
}

// What to do with a frame that arrived on core port `p`: the checks of
// LabelRouter::route and ::pop, in the same order. `len` is the whole
// frame's length; at least min(len, PULL_LEN) bytes are at `data`.
static __always_inline int decide_core(void *data, void *data_end, __u64 len,
				       struct port *p, struct decision *d)
{
	__u8 *eth = data;
	if (len < ETH_HLEN || (void *)(eth + ETH_HLEN) > data_end)
		return drop_for(d, C_RUNT);
	if (!mac_eq(eth, p->mac))
		return drop_for(d, C_NOT_FOR_US);
	if (eth[12] != (ETH_P_MPLS_UC >> 8) || eth[13] != (ETH_P_MPLS_UC & 0xff))
		return drop_for(d, C_NOT_MPLS);
	__u8 *stack = eth + ETH_HLEN;
	if ((void *)(stack + ENTRY_LEN) > data_end)
		return drop_for(d, C_RUNT);
	__u32 top = entry_at(stack);
	d->top = top;
	// The stack must end (bottom-of-stack bit) within the frame and within
	// MAX_STACK_DEPTH entries.
	int ended = 0;
#pragma unroll
	for (int i = 0; i < MAX_STACK_DEPTH; i++) {
		if (!ended) {
			__u8 *e = stack + i * ENTRY_LEN;
			if ((void *)(e + ENTRY_LEN) > data_end)
				return drop_for(d, C_BROKEN_STACK);
			if (e[2] & 1)
				ended = 1;
		}
	}
	if (!ended)
		return drop_for(d, C_BROKEN_STACK);
	__u32 label = ENTRY_LABEL(top);
	if (label < FIRST_UNRESERVED_LABEL)
		return drop_for(d, C_RESERVED_LABEL);
	if (ENTRY_TTL(top) <= 1)
		return drop_for(d, C_TTL);
	d->swap = bpf_map_lookup_elem(&swaps, &label);
	if (d->swap) {
		if (len > d->swap->max_frame)
			return drop_for(d, C_TOO_BIG);
		d->action = A_SWAP;
		return 0;
	}
	if (!bpf_map_lookup_elem(&pops, &label))
		return drop_for(d, C_UNKNOWN_LABEL);
	// Egress edge: exactly [local label, customer label], a control word,
	// then a customer frame of a carried EtherType.
	if (ENTRY_BOTTOM(top))
		return drop_for(d, C_BROKEN_STACK);
	__u8 *cust = stack + ENTRY_LEN;
	if ((void *)(cust + ENTRY_LEN) > data_end)
		return drop_for(d, C_BROKEN_STACK);
	__u32 customer = entry_at(cust);
	if (!ENTRY_BOTTOM(customer))
		return drop_for(d, C_BROKEN_STACK);
	__u32 customer_label = ENTRY_LABEL(customer);
	__u32 *pwi = bpf_map_lookup_elem(&customer_labels, &customer_label);
	if (!pwi)
		return drop_for(d, C_UNKNOWN_LABEL);
	d->pw = bpf_map_lookup_elem(&pseudowires, pwi);
	if (!d->pw)
		return drop_for(d, C_UNKNOWN_LABEL);
	__u8 *cw = cust + ENTRY_LEN;
	if ((void *)(cw + CONTROL_WORD_LEN) > data_end || cw[0] != 0 || cw[1] != 0)
		return drop_for(d, C_CONTROL_WORD);
	__u8 *inner = data + PUSH_LEN;
	if (len < PUSH_LEN + ETH_HLEN || (void *)(inner + ETH_HLEN) > data_end)
		return drop_for(d, C_RUNT);
	if (!carried((__u16)inner[12] << 8 | inner[13]))
		return drop_for(d, C_ETHERTYPE);
	if (len - PUSH_LEN > d->pw->customer_max_frame)
		return drop_for(d, C_TOO_BIG);
	d->action = A_POP;
	return 0;
}

// Send out of `ifindex`. A veth whose other end is in another namespace
// (the next router) gets the frame straight into that end's ingress
// (bpf_redirect_peer: no transmit queue, no backlog, and the skb is not
// marked "redirected", which would make the next router's generic XDP skip
// it); any other port transmits it (bpf_redirect).
static __always_inline long forward(__u32 ifindex, __u32 peer)
{
	return peer ? bpf_redirect_peer(ifindex, 0) : bpf_redirect(ifindex, 0);
}

static __always_inline int tc_drop(enum counter reason)
{
	count(reason);
	return TC_ACT_SHOT;
}

static __always_inline int tc_push(struct __sk_buff *skb, struct port *p)
{
	__u32 pwi = p->pw;
	struct pseudowire *pw = bpf_map_lookup_elem(&pseudowires, &pwi);
	if (!pw)
		return tc_drop(C_UNKNOWN_PORT);
	if (bpf_skb_pull_data(skb, ETH_HLEN))
		return tc_drop(C_RUNT);
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *eth = data;
	if ((void *)(eth + ETH_HLEN) > data_end)
		return tc_drop(C_RUNT);
	if (!carried((__u16)eth[12] << 8 | eth[13]))
		return tc_drop(C_ETHERTYPE);
	if (skb->len + PUSH_LEN > pw->core_max_frame)
		return tc_drop(C_TOO_BIG);
	if (bpf_skb_change_head(skb, PUSH_LEN, 0))
		return tc_drop(C_SEND_ERRORS);
	if (bpf_skb_store_bytes(skb, 0, pw->header, PUSH_LEN, 0))
		return tc_drop(C_SEND_ERRORS);
	count(C_FORWARDED);
	count(C_PORT_BASE + (pw->core_index & (MAX_PORTS - 1)));
	return forward(pw->core_ifindex, pw->core_peer);
}

static __always_inline int tc_core(struct __sk_buff *skb, struct port *p)
{
	__u32 len = skb->len;
	if (bpf_skb_pull_data(skb, len < PULL_LEN ? len : PULL_LEN))
		return tc_drop(C_RUNT);
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct decision d = {};
	decide_core(data, data_end, len, p, &d);
	if (d.action == A_DROP)
		return tc_drop(d.reason);
	if (d.action == A_POP) {
		// Pops belong to bw_mpls_xdp, attached to every core port of a
		// router with pop labels; reaching here means it is missing.
		return tc_drop(C_POP_WITHOUT_XDP);
	}
	struct swap *s = d.swap;
	__u8 *eth = data;
	if ((void *)(eth + ETH_HLEN + ENTRY_LEN) > data_end)
		return tc_drop(C_RUNT);
	__builtin_memcpy(eth, s->next_hop, 6);
	__builtin_memcpy(eth + 6, s->src_mac, 6);
	__u32 e = (s->out_label << 12) | (d.top & 0xf00) | (ENTRY_TTL(d.top) - 1);
	eth[14] = e >> 24;
	eth[15] = e >> 16;
	eth[16] = e >> 8;
	eth[17] = e;
	count(C_FORWARDED);
	count(C_PORT_BASE + (s->index & (MAX_PORTS - 1)));
	return forward(s->ifindex, s->peer);
}

SEC("classifier")
int bw_mpls_tc(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct port *p = bpf_map_lookup_elem(&ports, &ifindex);
	count(C_RECEIVED);
	if (!p)
		return tc_drop(C_UNKNOWN_PORT);
	if (skb->len < ETH_HLEN)
		return tc_drop(C_RUNT);
	if (p->customer)
		return tc_push(skb, p);
	return tc_core(skb, p);
}

SEC("xdp")
int bw_mpls_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 ifindex = ctx->ingress_ifindex;
	struct port *p = bpf_map_lookup_elem(&ports, &ifindex);
	if (!p || p->customer)
		return XDP_PASS;
	struct decision d = {};
	decide_core(data, data_end, data_end - data, p, &d);
	// Swaps are bw_mpls_tc's (which counts them).
	if (d.action == A_SWAP)
		return XDP_PASS;
	count(C_RECEIVED);
	if (d.action == A_DROP) {
		count(d.reason);
		return XDP_DROP;
	}
	struct pseudowire *pw = d.pw;
	if (!pw)
		return XDP_DROP;
	__u32 out = pw->customer_ifindex;
	__u32 slot = C_PORT_BASE + (pw->customer_index & (MAX_PORTS - 1));
	if (bpf_xdp_adjust_head(ctx, PUSH_LEN)) {
		count(C_SEND_ERRORS);
		return XDP_DROP;
	}
	count(C_FORWARDED);
	count(slot);
	return bpf_redirect(out, 0);
}

char _license[] SEC("license") = "Dual MIT/GPL";
