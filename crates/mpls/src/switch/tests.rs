use super::*;

const C: PortId = 0; // edge: customer port
const K: PortId = 1; // edge: core port
const W: PortId = 0; // switch: west port
const E: PortId = 1; // switch: east port

fn mac(n: u8) -> Mac {
    [0x02, 0, 0, 0, 0, n]
}

/// ler1 (push 101, customer 1000) -> lsr 101->102 -> ler2 (pops 102).
fn chain() -> (LabelRouter, LabelRouter, LabelRouter) {
    let mut a = RouterConfig::new(vec![mac(0xa0), mac(0xa1)]);
    a.pseudowires.push(Pseudowire {
        customer_port: C,
        core_port: K,
        route_label: 101,
        customer_label: 1000,
        next_hop: mac(0xb0),
    });
    let mut b = RouterConfig::new(vec![mac(0xb0), mac(0xb1)]);
    b.swaps.insert(
        101,
        Swap {
            out_label: 102,
            port: E,
            next_hop: mac(0xc1),
        },
    );
    let mut c = RouterConfig::new(vec![mac(0xc0), mac(0xc1)]);
    c.pop_labels.push(102);
    c.pseudowires.push(Pseudowire {
        customer_port: C,
        core_port: K,
        route_label: 201,
        customer_label: 1000,
        next_hop: mac(0xb1),
    });
    (
        LabelRouter::new(a).unwrap(),
        LabelRouter::new(b).unwrap(),
        LabelRouter::new(c).unwrap(),
    )
}

/// A broadcast AoE Query Config from 02:..:01.
fn aoe_frame() -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&mac(1));
    f.extend_from_slice(&[0x88, 0xA2, 0x10, 0, 0, 0, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5]);
    f.resize(60, 0);
    f
}

fn fwd(r: &LabelRouter, port: PortId, f: &[u8]) -> (PortId, Vec<u8>) {
    let mut out = vec![0u8; 2048];
    match r.process(port, f, &mut out) {
        Verdict::Forward { port, len } => (port, out[..len].to_vec()),
        Verdict::Drop(d) => panic!("dropped: {d}"),
    }
}

fn drop_reason(r: &LabelRouter, port: PortId, f: &[u8]) -> Drop {
    let mut out = vec![0u8; 2048];
    match r.process(port, f, &mut out) {
        Verdict::Drop(d) => d,
        v => panic!("forwarded: {v:?}"),
    }
}

#[test]
fn push_swap_pop_byte_for_byte() {
    let (a, b, c) = chain();
    let cust = aoe_frame();
    let (p, pushed) = fwd(&a, C, &cust);
    assert_eq!(p, K);
    let mut want = vec![];
    want.extend_from_slice(&mac(0xb0)); // next hop
    want.extend_from_slice(&mac(0xa1)); // our core port
    want.extend_from_slice(&[0x88, 0x47]);
    want.extend_from_slice(&[0x00, 0x06, 0x50, 0xFF]); // 101, tc 0, not bottom, ttl 255
    want.extend_from_slice(&[0x00, 0x3E, 0x81, 0xFF]); // 1000, bottom, ttl 255
    want.extend_from_slice(&[0, 0, 0, 0]); // control word
    want.extend_from_slice(&cust);
    assert_eq!(pushed, want);

    let (p, swapped) = fwd(&b, W, &pushed);
    assert_eq!(p, E);
    let mut want2 = vec![];
    want2.extend_from_slice(&mac(0xc1));
    want2.extend_from_slice(&mac(0xb1));
    want2.extend_from_slice(&[0x88, 0x47]);
    want2.extend_from_slice(&[0x00, 0x06, 0x60, 0xFE]); // 102, ttl 254
    want2.extend_from_slice(&want[18..]); // bottom label, CW, customer frame untouched
    assert_eq!(swapped, want2);

    // ler2 receives on its core port; the top label addresses its MAC.
    let (p, popped) = fwd(&c, K, &swapped);
    assert_eq!(p, C);
    assert_eq!(popped, cust);

    // And back: ler2 pushes 201 towards the west.
    let (p, back) = fwd(&c, C, &cust);
    assert_eq!((p, &back[14..18]), (K, &[0x00, 0x0C, 0x90, 0xFF][..]));
}

#[test]
fn malformed_mpls_is_dropped() {
    let (a, b, c) = chain();
    let (_, pushed) = fwd(&a, C, &aoe_frame());
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut x = pushed.clone();
        f(&mut x);
        x
    };
    // TTL 1 and 0 on top.
    assert_eq!(drop_reason(&b, W, &with(&|x| x[17] = 1)), Drop::TtlExpired);
    assert_eq!(drop_reason(&b, W, &with(&|x| x[17] = 0)), Drop::TtlExpired);
    // TTL 2 still goes (leaves with 1).
    let (_, out) = fwd(&b, W, &with(&|x| x[17] = 2));
    assert_eq!(out[17], 1);
    // Unknown label (999) and a reserved one (3, implicit null).
    assert_eq!(
        drop_reason(
            &b,
            W,
            &with(&|x| x[14..18].copy_from_slice(
                &LabelEntry {
                    label: 999,
                    tc: 0,
                    bottom: false,
                    ttl: 64
                }
                .encode()
            ))
        ),
        Drop::UnknownLabel
    );
    assert_eq!(
        drop_reason(
            &b,
            W,
            &with(&|x| x[14..18].copy_from_slice(
                &LabelEntry {
                    label: 3,
                    tc: 0,
                    bottom: false,
                    ttl: 64
                }
                .encode()
            ))
        ),
        Drop::ReservedLabel
    );
    // Broken stacks: no bottom-of-stack bit anywhere, or cut short.
    let no_bottom = with(&|x| {
        x.truncate(22);
        x[20] &= !1;
    });
    assert_eq!(drop_reason(&b, W, &no_bottom), Drop::BrokenStack);
    assert_eq!(drop_reason(&b, W, &pushed[..17]), Drop::Runt);
    // Egress: the pop label as the only (bottom) entry, a customer label
    // that is not the bottom, an unknown customer, a bad control word.
    let (_, swapped) = fwd(&b, W, &pushed);
    let sw = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut x = swapped.clone();
        f(&mut x);
        x
    };
    assert_eq!(drop_reason(&c, K, &sw(&|x| x[16] |= 1)), Drop::BrokenStack);
    let three = sw(&|x| {
        x[20] &= !1;
        x.splice(
            22..22,
            LabelEntry {
                label: 50,
                tc: 0,
                bottom: true,
                ttl: 9,
            }
            .encode(),
        );
    });
    assert_eq!(drop_reason(&c, K, &three), Drop::BrokenStack);
    assert_eq!(
        drop_reason(
            &c,
            K,
            &sw(&|x| x[18..22].copy_from_slice(
                &LabelEntry {
                    label: 1001,
                    tc: 0,
                    bottom: true,
                    ttl: 9
                }
                .encode()
            ))
        ),
        Drop::UnknownLabel
    );
    assert_eq!(
        drop_reason(&c, K, &sw(&|x| x[22] = 0x45)),
        Drop::BadControlWord
    );
    assert_eq!(drop_reason(&c, K, &sw(&|x| x.truncate(30))), Drop::Runt);
    // Not for us, not MPLS, EtherType not carried (IPv6), runt, unknown port.
    assert_eq!(drop_reason(&b, W, &with(&|x| x[5] = 0x99)), Drop::NotForUs);
    assert_eq!(drop_reason(&b, W, &with(&|x| x[12] = 0x08)), Drop::NotMpls);
    let mut v6 = aoe_frame();
    v6[12..14].copy_from_slice(&[0x86, 0xDD]);
    assert_eq!(drop_reason(&a, C, &v6), Drop::EtherTypeNotCarried);
    assert_eq!(drop_reason(&a, C, &[0u8; 13]), Drop::Runt);
    assert_eq!(drop_reason(&a, 7, &aoe_frame()), Drop::UnknownPort);
    // An output buffer too small for the pushed frame.
    let mut small = [0u8; 70];
    assert_eq!(
        a.process(C, &aoe_frame(), &mut small),
        Verdict::Drop(Drop::TooBig)
    );
}

#[test]
fn bad_configurations_are_refused() {
    let mut c = RouterConfig::new(vec![mac(1), mac(2)]);
    c.swaps.insert(
        5,
        Swap {
            out_label: 100,
            port: 1,
            next_hop: mac(3),
        },
    );
    assert_eq!(
        LabelRouter::new(c.clone()).unwrap_err(),
        ConfigError::BadLabel(5)
    );
    c.swaps.clear();
    c.swaps.insert(
        100,
        Swap {
            out_label: 100,
            port: 2,
            next_hop: mac(3),
        },
    );
    assert_eq!(
        LabelRouter::new(c.clone()).unwrap_err(),
        ConfigError::NoSuchPort(2)
    );
    c.swaps.clear();
    c.swaps.insert(
        100,
        Swap {
            out_label: 101,
            port: 0,
            next_hop: mac(3),
        },
    );
    c.pop_labels.push(100);
    assert_eq!(
        LabelRouter::new(c.clone()).unwrap_err(),
        ConfigError::SwapAndPop(100)
    );
    c.pop_labels.clear();
    c.pseudowires.push(Pseudowire {
        customer_port: 0,
        core_port: 1,
        route_label: 200,
        customer_label: 300,
        next_hop: mac(3),
    });
    assert_eq!(
        LabelRouter::new(c.clone()).unwrap_err(),
        ConfigError::CustomerPortInCore(0)
    );
    c.push_ttl = 1;
    assert_eq!(LabelRouter::new(c).unwrap_err(), ConfigError::PushTtl);
}

proptest::proptest! {
    /// Random frames on any port never panic; anything forwarded fits the
    /// buffer and, on a switch router, keeps its length.
    #[test]
    fn random_frames_never_panic(port in 0usize..3, frame in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
        let (a, b, c) = chain();
        let mut out = vec![0u8; 256];
        for r in [&a, &b, &c] {
            if let Verdict::Forward { port: p, len } = r.process(port, &frame, &mut out) {
                proptest::prop_assert!(len <= out.len() && p < 2);
            }
        }
        if let Verdict::Forward { len, .. } = b.process(port, &frame, &mut out) {
            proptest::prop_assert_eq!(len, frame.len());
        }
    }

    /// Random MPLS frames addressed to the switch router (the interesting
    /// part of the space): TTL and label rules hold for everything forwarded.
    #[test]
    fn forwarded_frames_obey_ttl(stack in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
        let (_, b, _) = chain();
        let mut f = mac(0xb0).to_vec();
        f.extend_from_slice(&mac(9));
        f.extend_from_slice(&[0x88, 0x47]);
        f.extend_from_slice(&stack);
        let mut out = vec![0u8; 256];
        if let Verdict::Forward { .. } = b.process(W, &f, &mut out) {
            let top_in = LabelEntry::read(&stack).unwrap();
            let top_out = LabelEntry::read(&out[14..]).unwrap();
            proptest::prop_assert!(top_in.ttl > 1 && top_in.label == 101);
            proptest::prop_assert_eq!(top_out.ttl, top_in.ttl - 1);
            proptest::prop_assert_eq!(top_out.label, 102);
        }
    }
}
