// SPDX-License-Identifier: MIT OR GPL-2.0
//
// bw_xsk_redirect: hands the frames of one EtherType to the AF_XDP socket
// bound to the receive queue they arrived on (crates/net/src/xdp.rs loads
// and attaches it); every other frame goes on to the kernel stack.
//
// Three optional matches narrow what is taken: one on the byte at
// `byte_offset` and one on the big-endian 32-bit word at `word_offset`
// ((field & mask) == value; a zero mask matches everything), and a key: the
// big-endian 32-bit word at `key_offset`, masked with `key_mask`, must be
// in the `keys` hash map, which user space fills and changes while the
// program runs. A frame too short for a match that is asked for is not
// taken. A frame with no socket on its queue goes to the stack
// (bpf_redirect_map's XDP_PASS fallback).
//
// The program knows no protocol: offsets, masks and keys come from user
// space. For AoE they come from bw-aoe's frame layout (crates/aoe/src/
// frame.rs, `field`; `bw_aoe::frame::xdp_match`): the flags nibble at byte
// 14 (response bit 0x08), shelf at 16-17, slot at 18 and command at 19 (the
// key word: shelf << 16 | slot << 8, command masked off), tag at 20-23.
// The target takes requests for the shelf.slot pairs it exports, the
// initiator replies carrying its tag prefix from the target it talks to;
// everything else, broadcast and wildcard queries (shelf 0xffff or slot
// 0xff, never a key) included, goes to the stack, where an AF_PACKET
// socket of ours answers them and other AoE software on the interface
// (vblade, a second blockwire, the kernel's aoe driver) sees its own.
//
// Section xdp.frags: frames larger than one page (jumbo MTU) arrive in
// several buffers; only the headers in the first one are read here.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define MAX_QUEUES 64
#define MAX_OFFSET 63
#define MAX_KEYS 4096

struct filter {
	__u16 ethertype;   // host order
	__u16 byte_offset;
	__u8 byte_mask;
	__u8 byte_value;
	__u16 word_offset;
	__u32 word_mask;
	__u32 word_value;
	__u16 key_offset;
	__u16 pad;
	__u32 key_mask;    // 0: no key match
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

// Keys of frames to take (host order); the value is unused.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_KEYS);
	__type(key, __u32);
	__type(value, __u8);
} keys SEC(".maps");

static __always_inline int word_at(unsigned char *data, unsigned char *end, __u16 offset, __u32 *w)
{
	unsigned char *p = data + (offset & MAX_OFFSET);
	if (p + 4 > end)
		return 0;
	*w = ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | p[3];
	return 1;
}

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
	__u32 w;
	if (f->word_mask) {
		if (!word_at(data, end, f->word_offset, &w) || (w & f->word_mask) != f->word_value)
			return XDP_PASS;
	}
	if (f->key_mask) {
		if (!word_at(data, end, f->key_offset, &w))
			return XDP_PASS;
		w &= f->key_mask;
		if (!bpf_map_lookup_elem(&keys, &w))
			return XDP_PASS;
	}
	return bpf_redirect_map(&sockets, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
