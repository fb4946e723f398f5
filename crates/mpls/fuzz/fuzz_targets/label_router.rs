#![no_main]
// Any frame on any port of an edge and a switch router: never panics; what is
// forwarded fits the buffer, and a swap leaves with the TTL one lower.
use bw_mpls::switch::{LabelRouter, Pseudowire, RouterConfig, Swap, Verdict};
use bw_mpls::LabelEntry;
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

// Built once: a LabelRouter is immutable after new() (process takes &self),
// so nothing carries over from one input to the next.
static ROUTERS: LazyLock<[LabelRouter; 2]> = LazyLock::new(routers);

fn routers() -> [LabelRouter; 2] {
    let mac = |n: u8| [2, 0, 0, 0, 0, n];
    let mut edge = RouterConfig::new(vec![mac(1), mac(2)]);
    edge.pseudowires.push(Pseudowire { customer_port: 0, core_port: 1, route_label: 101, customer_label: 1000, next_hop: mac(3) });
    edge.pop_labels.push(204);
    let mut sw = RouterConfig::new(vec![mac(3), mac(4)]);
    sw.swaps.insert(101, Swap { out_label: 102, port: 1, next_hop: mac(5) });
    [LabelRouter::new(edge).unwrap(), LabelRouter::new(sw).unwrap()]
}

fuzz_target!(|data: &[u8]| {
    let Some((&port, frame)) = data.split_first() else { return };
    let mut out = [0u8; 512];
    for (i, r) in ROUTERS.iter().enumerate() {
        if let Verdict::Forward { port: p, len } = r.process(port as usize % 3, frame, &mut out) {
            assert!(len <= out.len() && p < 2);
            if i == 1 {
                let tin = LabelEntry::read(&frame[14..]).unwrap();
                let tout = LabelEntry::read(&out[14..]).unwrap();
                assert_eq!((tout.label, tout.ttl), (102, tin.ttl - 1));
            }
        }
    }
});
