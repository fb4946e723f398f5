// SPDX-License-Identifier: MIT OR GPL-2.0
//
// bw_xsk_redirect: hands the frames of one EtherType to the AF_XDP socket
// bound to the receive queue they arrived on (crates/net/src/xdp.rs loads
// and attaches it); every other frame goes on to the kernel stack.
//
// Two optional matches narrow what is taken: one on the byte at
// `byte_offset` and one on the big-endian 32-bit word at `word_offset`
// ((field & mask) == value; a zero mask matches everything). AoE uses them
// to take only requests (target) or only replies carrying its tag prefix
// (initiator), so other AoE users on the interface keep theirs. A frame too
// short for a match that is asked for is not taken. A frame with no socket
// on its queue goes to the stack (bpf_redirect_map's XDP_PASS fallback).
//
// Section xdp.frags: frames larger than one page (jumbo MTU) arrive in
// several buffers; only the headers in the first one are read here.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define MAX_QUEUES 64
#define MAX_OFFSET 63

struct filter {
	__u16 ethertype;   // host order
	__u16 byte_offset;
	__u8 byte_mask;
	__u8 byte_value;
	__u16 word_offset;
	__u32 word_mask;
	__u32 word_value;
};

// Sizes, not BTF types: the kernel refuses BTF on socket maps.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_QUEUES);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} sockets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct filter);
} filter SEC(".maps");

SEC("xdp.frags")
int bw_xsk_redirect(struct xdp_md *ctx)
{
	unsigned char *data = (unsigned char *)(long)ctx->data;
	unsigned char *end = (unsigned char *)(long)ctx->data_end;
	__u32 zero = 0;
	struct filter *f = bpf_map_lookup_elem(&filter, &zero);
	if (!f || data + 14 > end)
		return XDP_PASS;
	if ((((__u16)data[12] << 8) | data[13]) != f->ethertype)
		return XDP_PASS;
	if (f->byte_mask) {
		unsigned char *p = data + (f->byte_offset & MAX_OFFSET);
		if (p + 1 > end || (p[0] & f->byte_mask) != f->byte_value)
			return XDP_PASS;
	}
	if (f->word_mask) {
		unsigned char *p = data + (f->word_offset & MAX_OFFSET);
		if (p + 4 > end)
			return XDP_PASS;
		__u32 w = ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | p[3];
		if ((w & f->word_mask) != f->word_value)
			return XDP_PASS;
	}
	return bpf_redirect_map(&sockets, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
