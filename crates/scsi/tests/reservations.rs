//! RESERVE(6)/RELEASE(6) and persistent reservations between two nexuses.

mod common;
use bw_scsi::status;
use common::*;

const RESERVATION_CONFLICT: u8 = status::RESERVATION_CONFLICT;

fn conflict(t: &bw_scsi::ScsiTarget, nexus: u64, cdb: &[u8], data: &[u8]) {
    let (o, d) = run(t, nexus, cdb, data);
    assert_eq!(o.status, RESERVATION_CONFLICT, "cdb {cdb:02x?} from nexus {nexus}");
    assert!(o.sense.is_empty() && d.is_empty());
}

const MODE_SENSE_ALL: [u8; 6] = [0x1a, 0, 0x3f, 0, 0xff, 0];
const RESERVE6: [u8; 6] = [0x16, 0, 0, 0, 0, 0];
const RELEASE6: [u8; 6] = [0x17, 0, 0, 0, 0, 0];

#[test]
fn reserve6_between_two_nexuses() {
    let t = ram_target(64);
    good(&t, 1, &RESERVE6, &[]);
    good(&t, 1, &RESERVE6, &[]); // re-reserve by the holder
    conflict(&t, 2, &RESERVE6, &[]);
    good(&t, 2, &RELEASE6, &[]); // a no-op for non-holders
    good(&t, 1, &MODE_SENSE_ALL, &[]);
    conflict(&t, 2, &MODE_SENSE_ALL, &[]);
    conflict(&t, 2, &read10(0, 1, 0), &[]);
    conflict(&t, 2, &write10(0, 1, 0), &pattern(1, 0));
    conflict(&t, 2, &tur(), &[]);
    // Exempt commands.
    good(&t, 2, &[0x12, 0, 0, 0, 0xff, 0], &[]);
    good(&t, 2, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    good(&t, 2, &[0x03, 0, 0, 0, 18, 0], &[]);
    good(&t, 2, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    // Persistent reservation commands conflict with an SPC-2 reservation.
    conflict(&t, 2, &prout(0, 0), &prout_params(0, 0x1234));
    good(&t, 1, &RELEASE6, &[]);
    good(&t, 2, &RESERVE6, &[]);
    good(&t, 2, &write10(0, 1, 0), &pattern(1, 0));
    conflict(&t, 1, &read10(0, 1, 0), &[]);
    // Nexus loss releases it.
    t.nexus_gone(2);
    good(&t, 1, &RESERVE6, &[]);
    // So does a LUN reset.
    t.lun_reset(0);
    check(&t, 1, &tur(), &[], POWER_ON_RESET);
    check(&t, 2, &tur(), &[], POWER_ON_RESET);
    good(&t, 2, &RESERVE6, &[]);
    good(&t, 2, &RELEASE6, &[]);
    check(&t, 1, &[0x16, 1, 0, 0, 0, 0], &[], INVALID_FIELD_IN_CDB); // extents
}

fn prout(sa: u8, scope_type: u8) -> [u8; 10] {
    [0x5f, sa, scope_type, 0, 0, 0, 0, 0, 24, 0]
}
fn prout_params(key: u64, sa_key: u64) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p
}
fn prin(sa: u8) -> [u8; 10] {
    [0x5e, sa, 0, 0, 0, 0, 0, 0x10, 0, 0]
}
const REGISTER: u8 = 0;
const RESERVE: u8 = 1;
const RELEASE: u8 = 2;
const CLEAR: u8 = 3;
const PREEMPT: u8 = 4;
const REGISTER_IGNORE: u8 = 6;
const WE: u8 = 1;
const EA: u8 = 3;
const WE_RO: u8 = 5;
const EA_RO: u8 = 6;
const WE_AR: u8 = 7;
const EA_AR: u8 = 8;

fn keys(t: &bw_scsi::ScsiTarget) -> (u32, Vec<u64>) {
    let d = good(t, 9, &prin(0), &[]);
    let gen = u32::from_be_bytes(d[0..4].try_into().unwrap());
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    assert_eq!(len, d.len() - 8);
    (gen, d[8..].chunks(8).map(|c| u64::from_be_bytes(c.try_into().unwrap())).collect())
}

fn reservation(t: &bw_scsi::ScsiTarget) -> Option<(u64, u8)> {
    let d = good(t, 9, &prin(1), &[]);
    match u32::from_be_bytes(d[4..8].try_into().unwrap()) {
        0 => None,
        16 => Some((u64::from_be_bytes(d[8..16].try_into().unwrap()), d[21] & 0x0f)),
        n => panic!("bad additional length {n}"),
    }
}

#[test]
fn register_and_read_keys() {
    let t = ram_target(64);
    assert_eq!(keys(&t), (0, vec![]));
    t.set_initiator_name(2, "iqn.2026-11.test:client,i,0x400001370000");
    good(&t, 1, &prout(REGISTER, 0), &prout_params(0, 0xaa));
    good(&t, 2, &prout(REGISTER_IGNORE, 0), &prout_params(0, 0xbb));
    assert_eq!(keys(&t), (2, vec![0xaa, 0xbb]));
    // Wrong current key: conflict. Unregistered with a nonzero key: conflict.
    conflict(&t, 1, &prout(REGISTER, 0), &prout_params(0x99, 0xcc));
    conflict(&t, 3, &prout(REGISTER, 0), &prout_params(0x99, 0xcc));
    // Change key, then unregister with service action key 0.
    good(&t, 1, &prout(REGISTER, 0), &prout_params(0xaa, 0xcc));
    assert_eq!(keys(&t), (3, vec![0xcc, 0xbb]));
    good(&t, 1, &prout(REGISTER, 0), &prout_params(0xcc, 0));
    assert_eq!(keys(&t), (4, vec![0xbb]));
    // Unregistered nexus registering key 0: nothing happens.
    good(&t, 1, &prout(REGISTER, 0), &prout_params(0, 0));
    assert_eq!(keys(&t).0, 4);
    // Parameter list errors.
    check(&t, 1, &[0x5f, 0, 0, 0, 0, 0, 0, 0, 20, 0], &prout_params(0, 1)[..20], PARAM_LIST_LENGTH);
    let mut spec_i_pt = prout_params(0, 1);
    spec_i_pt[20] = 0x08;
    check(&t, 1, &prout(REGISTER, 0), &spec_i_pt, INVALID_FIELD_IN_PARAM);
    check(&t, 1, &prout(5, 0), &prout_params(0, 1), INVALID_FIELD_IN_CDB); // PREEMPT AND ABORT
    check(&t, 1, &prin(4), &[], INVALID_FIELD_IN_CDB);
    // REPORT CAPABILITIES: length 8, PTPL_C (the state lives with the
    // volume), type mask of the six types, PTPL_A off.
    let caps = good(&t, 1, &prin(2), &[]);
    assert_eq!(&caps[..2], &[0, 8]);
    assert_eq!(caps[2] & 0x01, 0x01, "PTPL_C");
    assert_eq!(caps[3] & 0x81, 0x80, "TMV, PTPL_A clear");
    // APTPL comes with a registration, and PTPL_A reports it.
    let mut aptpl = prout_params(0, 0x77);
    aptpl[20] = 0x01;
    good(&t, 3, &prout(REGISTER, 0), &aptpl);
    assert_eq!(good(&t, 1, &prin(2), &[])[3] & 0x01, 0x01, "PTPL_A");
    good(&t, 3, &prout(REGISTER, 0), &prout_params(0x77, 0));
    assert_eq!(u16::from_be_bytes([caps[4], caps[5]]), 0xea01);
    // READ FULL STATUS: one descriptor with the initiator name as TransportID.
    t.set_initiator_name(2, "iqn.2026-11.test:client");
    let full = good(&t, 1, &prin(3), &[]);
    assert_eq!(u32::from_be_bytes(full[4..8].try_into().unwrap()) as usize, full.len() - 8);
    assert_eq!(u64::from_be_bytes(full[8..16].try_into().unwrap()), 0xbb);
    let tid = &full[8 + 24..];
    assert_eq!(tid[0], 0x05, "iSCSI TransportID");
    assert!(tid[4..].starts_with(b"iqn.2026-11.test:client,i,0x400001370000\0"));
    assert_eq!(u16::from_be_bytes([tid[2], tid[3]]) as usize % 4, 0);
}

/// (registered other can read, can write, unregistered other can read, can write)
fn access_matrix(ptype: u8) -> (bool, bool, bool, bool) {
    let t = ram_target(64);
    good(&t, 1, &prout(REGISTER_IGNORE, 0), &prout_params(0, 0x11));
    good(&t, 2, &prout(REGISTER_IGNORE, 0), &prout_params(0, 0x22));
    good(&t, 1, &prout(RESERVE, ptype), &prout_params(0x11, 0));
    let want_key = if matches!(ptype, WE_AR | EA_AR) { 0 } else { 0x11 };
    assert_eq!(reservation(&t), Some((want_key, ptype)));
    good(&t, 1, &read10(0, 1, 0), &[]);
    good(&t, 1, &write10(0, 1, 0), &pattern(1, 0));
    let can = |n| {
        let r = run(&t, n, &read10(0, 1, 0), &[]).0.status == status::GOOD;
        let w = run(&t, n, &write10(0, 1, 0), &pattern(1, 0)).0.status == status::GOOD;
        (r, w)
    };
    let (rr, rw) = can(2);
    good(&t, 2, &prout(REGISTER, 0), &prout_params(0x22, 0));
    let (ur, uw) = can(2);
    // Holder releases; everyone has access again.
    good(&t, 1, &prout(RELEASE, ptype), &prout_params(0x11, 0));
    assert_eq!(reservation(&t), None);
    assert_eq!(can(2), (true, true));
    (rr, rw, ur, uw)
}

#[test]
fn persistent_reservation_access_per_type() {
    assert_eq!(access_matrix(WE), (true, false, true, false));
    assert_eq!(access_matrix(EA), (false, false, false, false));
    assert_eq!(access_matrix(WE_RO), (true, true, true, false));
    assert_eq!(access_matrix(EA_RO), (true, true, false, false));
    assert_eq!(access_matrix(WE_AR), (true, true, true, false));
    assert_eq!(access_matrix(EA_AR), (true, true, false, false));
}

#[test]
fn reserve_release_rules() {
    let t = ram_target(64);
    conflict(&t, 1, &prout(RESERVE, WE), &prout_params(0x11, 0)); // not registered
    good(&t, 1, &prout(REGISTER, 0), &prout_params(0, 0x11));
    good(&t, 2, &prout(REGISTER, 0), &prout_params(0, 0x22));
    conflict(&t, 1, &prout(RESERVE, WE), &prout_params(0x12, 0)); // wrong key
    check(&t, 1, &prout(RESERVE, 2), &prout_params(0x11, 0), INVALID_FIELD_IN_CDB); // bad type
    check(&t, 1, &prout(RESERVE, 0x10 | WE), &prout_params(0x11, 0), INVALID_FIELD_IN_CDB); // scope
    good(&t, 1, &prout(RESERVE, EA), &prout_params(0x11, 0));
    good(&t, 1, &prout(RESERVE, EA), &prout_params(0x11, 0)); // same again: fine
    conflict(&t, 1, &prout(RESERVE, WE), &prout_params(0x11, 0)); // other type
    conflict(&t, 2, &prout(RESERVE, EA), &prout_params(0x22, 0));
    // PR IN is never blocked; RESERVE(6) conflicts with PR state.
    good(&t, 2, &prin(0), &[]);
    conflict(&t, 2, &RESERVE6, &[]);
    // Non-holder release: no-op. Holder with the wrong type: 26/04.
    good(&t, 2, &prout(RELEASE, EA), &prout_params(0x22, 0));
    assert!(reservation(&t).is_some());
    check(&t, 1, &prout(RELEASE, WE), &prout_params(0x11, 0), (5, 0x26, 0x04));
    // Unregistering the holder releases the reservation.
    good(&t, 1, &prout(REGISTER, 0), &prout_params(0x11, 0));
    assert_eq!(reservation(&t), None);
    good(&t, 2, &write10(0, 1, 0), &pattern(1, 0));
    // Reservations survive nexus loss (persistent), registrations too.
    good(&t, 2, &prout(RESERVE, WE), &prout_params(0x22, 0));
    t.nexus_gone(2);
    assert_eq!(reservation(&t), Some((0x22, WE)));
    conflict(&t, 1, &write10(0, 1, 0), &pattern(1, 0));
}

#[test]
fn registrants_only_release_notifies_registrants() {
    let t = ram_target(64);
    good(&t, 1, &prout(REGISTER, 0), &prout_params(0, 0x11));
    good(&t, 2, &prout(REGISTER, 0), &prout_params(0, 0x22));
    good(&t, 1, &prout(RESERVE, WE_RO), &prout_params(0x11, 0));
    good(&t, 1, &prout(RELEASE, WE_RO), &prout_params(0x11, 0));
    check(&t, 2, &tur(), &[], (6, 0x2a, 0x04));
    good(&t, 2, &tur(), &[]);
    good(&t, 1, &tur(), &[]);
}

#[test]
fn clear_and_preempt() {
    let t = ram_target(64);
    good(&t, 1, &prout(REGISTER, 0), &prout_params(0, 0x11));
    good(&t, 2, &prout(REGISTER, 0), &prout_params(0, 0x22));
    let (gen, _) = keys(&t);
    // Preempt without a reservation removes the other registration.
    good(&t, 2, &prout(PREEMPT, EA), &prout_params(0x22, 0x11));
    assert_eq!(keys(&t), (gen + 1, vec![0x22]));
    check(&t, 1, &tur(), &[], (6, 0x2a, 0x05));
    conflict(&t, 2, &prout(PREEMPT, EA), &prout_params(0x22, 0x77)); // no such key
    check(&t, 2, &prout(PREEMPT, EA), &prout_params(0x22, 0), INVALID_FIELD_IN_PARAM);
    // Preempt the holder: the reservation moves to the preempting nexus.
    good(&t, 1, &prout(REGISTER, 0), &prout_params(0, 0x11));
    good(&t, 1, &prout(RESERVE, EA), &prout_params(0x11, 0));
    conflict(&t, 2, &read10(0, 1, 0), &[]);
    good(&t, 2, &prout(PREEMPT, WE), &prout_params(0x22, 0x11));
    assert_eq!(reservation(&t), Some((0x22, WE)));
    assert_eq!(keys(&t).1, vec![0x22]);
    let _ = run(&t, 1, &tur(), &[]);
    good(&t, 1, &read10(0, 1, 0), &[]);
    conflict(&t, 1, &write10(0, 1, 0), &pattern(1, 0));
    // All-registrants: preempt with key 0 takes over and drops everyone else.
    good(&t, 1, &prout(REGISTER, 0), &prout_params(0, 0x11));
    good(&t, 2, &prout(RELEASE, WE), &prout_params(0x22, 0));
    good(&t, 2, &prout(RESERVE, WE_AR), &prout_params(0x22, 0));
    good(&t, 1, &write10(0, 1, 0), &pattern(1, 0)); // a registrant is a holder
    good(&t, 2, &prout(PREEMPT, EA), &prout_params(0x22, 0));
    assert_eq!(reservation(&t), Some((0x22, EA)));
    assert_eq!(keys(&t).1, vec![0x22]);
    check(&t, 1, &tur(), &[], (6, 0x2a, 0x05));
    // CLEAR: everything goes, the others are told.
    good(&t, 1, &prout(REGISTER_IGNORE, 0), &prout_params(0, 0x11));
    let (gen, _) = keys(&t);
    conflict(&t, 1, &prout(CLEAR, 0), &prout_params(0x12, 0));
    let _ = run(&t, 1, &tur(), &[]);
    good(&t, 1, &prout(CLEAR, 0), &prout_params(0x11, 0));
    assert_eq!(keys(&t), (gen + 1, vec![]));
    assert_eq!(reservation(&t), None);
    check(&t, 2, &tur(), &[], (6, 0x2a, 0x03));
    good(&t, 2, &write10(0, 1, 0), &pattern(1, 0));
}

#[test]
fn named_initiator_port_keeps_registration_across_sessions() {
    let t = ram_target(64);
    let port = "iqn.2026-11.test:host,i,0x400001370001";
    t.set_initiator_name(10, port);
    good(&t, 10, &prout(REGISTER, 0), &prout_params(0, 0x77));
    good(&t, 10, &prout(RESERVE, WE), &prout_params(0x77, 0));
    t.nexus_gone(10);
    // The same initiator port logs in again as a new session: it still
    // holds the reservation and can write; another port cannot.
    t.set_initiator_name(11, port);
    good(&t, 11, &write10(0, 1, 0), &pattern(1, 0));
    t.set_initiator_name(12, "iqn.2026-11.test:other,i,0x400001370002");
    conflict(&t, 12, &write10(0, 1, 0), &pattern(1, 0));
    good(&t, 11, &prout(REGISTER, 0), &prout_params(0x77, 0));
    assert_eq!(keys(&t).1, Vec::<u64>::new());
    good(&t, 12, &write10(0, 1, 0), &pattern(1, 0));
    // RESERVE(6) from the named port ends with its session.
    good(&t, 11, &RESERVE6, &[]);
    conflict(&t, 12, &read10(0, 1, 0), &[]);
    t.nexus_gone(11);
    good(&t, 12, &read10(0, 1, 0), &[]);
}

/// Two gateways (two targets, each with its own open of one file volume
/// and its own relative target port): a persistent reservation made
/// through one is enforced by the other, a preemption through the other
/// raises the unit attention at the first, and a third open (a gateway
/// restarted) reads it all back.
#[test]
fn two_gateways_share_persistent_reservations_through_the_volume() {
    let f = TempFile::new("pr-gateways");
    let gateway = |port: u16| {
        let mut cfg = bw_scsi::LunConfig::for_volume("disk", "iqn.2026-11.test:t", 0);
        cfg.port_group.relative_port = port;
        cfg.port_group.id = port;
        target_with(f.volume(64), cfg)
    };
    let (a, b) = (gateway(1), gateway(2));
    a.set_initiator_name(1, "iqn.2026-11.test:host1,i,0x1");
    b.set_initiator_name(1, "iqn.2026-11.test:host1,i,0x2");
    b.set_initiator_name(2, "iqn.2026-11.test:host2,i,0x3");
    good(&a, 1, &prout(REGISTER, 0), &prout_params(0, 0xa));
    good(&a, 1, &prout(RESERVE, 1), &prout_params(0xa, 0)); // Write Exclusive
    // B checks against the same state: its nexuses may read, not write.
    let until = |what: &str, f: &dyn Fn() -> bool| {
        let t = std::time::Instant::now();
        while !f() {
            assert!(t.elapsed() < std::time::Duration::from_secs(30), "{what}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    };
    until("B never saw A's reservation", &|| run(&b, 2, &write10(0, 1, 0), &pattern(1, 0)).0.status == RESERVATION_CONFLICT);
    conflict(&b, 1, &write10(0, 1, 0), &pattern(1, 0));
    good(&b, 2, &read10(0, 1, 0), &[]);
    assert_eq!(reservation(&b), Some((0xa, 1)));
    // B registers host2 and preempts host1 through A's key.
    good(&b, 2, &prout(REGISTER, 0), &prout_params(0, 0xb));
    good(&b, 2, &prout(PREEMPT, 1), &prout_params(0xb, 0xa));
    good(&b, 2, &write10(0, 1, 0), &pattern(1, 0));
    // A's nexus learns it lost its registration, then is fenced.
    until("A never raised REGISTRATIONS PREEMPTED", &|| {
        let (o, _) = run(&a, 1, &tur(), &[]);
        o.status == status::CHECK_CONDITION && sense(&o) == (6, 0x2a, 0x05)
    });
    conflict(&a, 1, &write10(0, 1, 0), &pattern(1, 0));
    assert_eq!(keys(&a), (3, vec![0xb]));
    // Released through B: A sees no reservation and may write again.
    good(&b, 2, &prout(RELEASE, 1), &prout_params(0xb, 0));
    until("A never saw the release", &|| run(&a, 1, &write10(0, 1, 0), &pattern(1, 0)).0.status == status::GOOD);
    assert_eq!(reservation(&a), None);
    // A gateway started again reads the registrations back.
    good(&b, 2, &prout(RESERVE, 3), &prout_params(0xb, 0)); // Exclusive Access
    drop(a);
    let a = gateway(1);
    a.set_initiator_name(1, "iqn.2026-11.test:host1,i,0x1");
    assert_eq!(reservation(&a), Some((0xb, 3)));
    conflict(&a, 1, &read10(0, 1, 0), &[]);
}

/// tpg_set / drain: the operator's ALUA state applies to every LUN, is
/// reported by REPORT TARGET PORT GROUPS, gates media access, and each
/// nexus learns it through ASYMMETRIC ACCESS STATE CHANGED; back to the
/// configured state with `None`.
#[test]
fn operator_alua_state_changes_raise_a_unit_attention() {
    use bw_scsi::AluaState;
    let t = ram_target(64);
    good(&t, 1, &tur(), &[]);
    let rtpg = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    assert!(t.set_alua_state(Some(AluaState::Unavailable)));
    assert!(!t.set_alua_state(Some(AluaState::Unavailable)), "no change, no notice");
    // REPORT TARGET PORT GROUPS runs in every state: it gets the unit
    // attention first (the command a host's ALUA handler sends), then the
    // new state; media access is refused.
    check(&t, 1, &rtpg, &[], (6, 0x2a, 0x06));
    assert_eq!(good(&t, 1, &rtpg, &[])[4] & 0x0f, 3, "RTPG reports unavailable");
    check(&t, 1, &read10(0, 1, 0), &[], (2, 0x04, 0x0c));
    assert!(t.set_alua_state(Some(AluaState::ActiveNonOptimized)));
    check(&t, 1, &tur(), &[], (6, 0x2a, 0x06));
    good(&t, 1, &read10(0, 1, 0), &[]);
    assert!(t.set_alua_state(None));
    check(&t, 1, &rtpg, &[], (6, 0x2a, 0x06));
    assert_eq!(good(&t, 1, &rtpg, &[])[4] & 0x0f, 0, "back to the configured active/optimized");
}
