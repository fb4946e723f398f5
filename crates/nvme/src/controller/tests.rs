use super::*;
use crate::queue_entry::admin;
use crate::queue_entry::{sgl, Sgl};
use crate::subsystem::Namespace;
use bw_block::{BackendSpec, Volume};

fn ctrl() -> Controller {
    let v = Volume::open("v", &BackendSpec::ram(1 << 20)).unwrap();
    let s = Subsystem { nqn: "nqn.t:s".into(), serial: "S".into(), model: "M".into(), namespaces: vec![Namespace::new("nqn.t:s", 1, v, false)], allowed_hosts: vec![], ana: Default::default() };
    Controller::new(3, Role::Nvm(Arc::new(s)), "nqn.h".into(), [0; 16], 5000, Instant::now())
}

fn run(c: &mut Controller, s: Sqe) -> Completion {
    match c.execute_admin(&s, &[], Instant::now()) {
        AdminOutcome::Complete(x) => x,
        AdminOutcome::Held => panic!("held"),
    }
}

fn enable(c: &mut Controller) {
    assert!(run(c, Property::set_sqe(1, reg::CC, 0x46_0001)).status.is_success());
    assert_eq!(run(c, Property::get_sqe(2, reg::CSTS, false)).result, 1);
}

fn with_len(mut s: Sqe, len: u32) -> Sqe {
    s.set_sgl(Sgl { addr: 0, length: len, kind: sgl::TRANSPORT });
    s
}

#[test]
fn properties_enable_and_shutdown() {
    let mut c = ctrl();
    let cap = run(&mut c, Property::get_sqe(1, reg::CAP, true)).result;
    assert_eq!(cap & 0xFFFF, 1023);
    assert_eq!((cap >> 37) & 1, 1);
    assert_eq!(run(&mut c, Property::get_sqe(1, reg::VS, false)).result, 0x10300);
    // Admin commands before CC.EN are a sequence error.
    let id = with_len(Sqe::new(admin::IDENTIFY, 4, 0), 4096);
    assert_eq!(run(&mut c, id).status, Status::CMD_SEQ_ERROR);
    enable(&mut c);
    assert!(run(&mut c, Property::set_sqe(1, reg::CC, 0x46_4001)).status.is_success());
    assert_eq!(run(&mut c, Property::get_sqe(2, reg::CSTS, false)).result, 0x9);
    assert_eq!(run(&mut c, Property::get_sqe(2, 0x40, false)).status, Status::INVALID_FIELD.dnr());
    // Bad entry sizes: controller fatal status.
    let mut c = ctrl();
    run(&mut c, Property::set_sqe(1, reg::CC, 0x1));
    assert_eq!(run(&mut c, Property::get_sqe(2, reg::CSTS, false)).result & 2, 2);
}

#[test]
fn identify_controller_and_namespace() {
    let mut c = ctrl();
    enable(&mut c);
    let mut s = with_len(Sqe::new(admin::IDENTIFY, 4, 0), 4096);
    s.set_cdw(10, cns::CONTROLLER as u32);
    let d = run(&mut c, s).data.unwrap();
    let id = identify::IdCtrl::parse(&d).unwrap();
    assert_eq!(id.cntlid, 3);
    assert!(id.kas > 0 && id.ioccsz >= 4 && id.iorcsz >= 1 && id.icdoff == 0 && id.sgls & 3 != 0);
    assert_eq!(id.nn, 1);
    let mut s = with_len(Sqe::new(admin::IDENTIFY, 4, 1), 4096);
    s.set_cdw(10, cns::NAMESPACE as u32);
    let d = run(&mut c, s).data.unwrap();
    assert_eq!(identify::parse_namespace(&d), Some((2048, 512, false)));
    let mut s = with_len(Sqe::new(admin::IDENTIFY, 4, 5), 4096);
    s.set_cdw(10, cns::NAMESPACE as u32);
    assert_eq!(run(&mut c, s).status, Status::INVALID_NS.dnr());
    let mut s = with_len(Sqe::new(admin::IDENTIFY, 4, 0), 4096);
    s.set_cdw(10, 0x42);
    assert_eq!(run(&mut c, s).status, Status::INVALID_FIELD.dnr());
    assert_eq!(run(&mut c, with_len(Sqe::new(0x77, 9, 0), 0)).status, Status::INVALID_OPCODE.dnr());
}

#[test]
fn features_and_logs() {
    let mut c = ctrl();
    enable(&mut c);
    let mut s = Sqe::new(admin::SET_FEATURES, 5, 0);
    s.set_cdw(10, feature::NUM_QUEUES as u32);
    s.set_cdw(11, 0x0003_0003);
    assert_eq!(run(&mut c, s).result, 0x0003_0003);
    assert_eq!(c.io_queues(), 4);
    s.set_cdw(11, 0x1000_1000);
    assert_eq!(run(&mut c, s).result, ((MAX_IO_QUEUES as u64 - 1) << 16) | (MAX_IO_QUEUES as u64 - 1));
    let mut s = Sqe::new(admin::SET_FEATURES, 5, 0);
    s.set_cdw(10, feature::KATO as u32);
    s.set_cdw(11, 1234);
    assert!(run(&mut c, s).status.is_success());
    let mut g = Sqe::new(admin::GET_FEATURES, 6, 0);
    g.set_cdw(10, feature::KATO as u32);
    assert_eq!(run(&mut c, g).result, 1234);
    g.set_cdw(10, 0x55);
    assert_eq!(run(&mut c, g).status, Status::INVALID_FIELD.dnr());
    // The mandatory features without behaviour: stored and returned.
    for (fid, want) in [(0x01u32, 7u64), (0x02, 0), (0x04, 343), (0x0a, 0)] {
        g.set_cdw(10, fid);
        assert_eq!(run(&mut c, g).result, want, "feature {fid:#x}");
    }
    let mut s = Sqe::new(admin::SET_FEATURES, 5, 0);
    s.set_cdw(10, 0x04);
    s.set_cdw(11, 0x150);
    assert!(run(&mut c, s).status.is_success());
    g.set_cdw(10, 0x04);
    assert_eq!(run(&mut c, g).result, 0x150);
    s.set_cdw(10, 0x02);
    s.set_cdw(11, 3); // power state 3 does not exist
    assert_eq!(run(&mut c, s).status, Status::INVALID_FIELD.dnr());
    let l = LogRequest { lid: lid::SUPPORTED, rae: false, len: 1024, offset: 0 };
    let d = run(&mut c, with_len(l.to_sqe(7, 0), 1024)).data.unwrap();
    assert_eq!((d[0], d[4], d[8], d[20], d[24]), (1, 1, 1, 1, 0));
    let l = LogRequest { lid: lid::SMART, rae: false, len: 512, offset: 0 };
    let d = run(&mut c, with_len(l.to_sqe(7, 0xFFFF_FFFF), 512)).data.unwrap();
    assert_eq!(d.len(), 512);
    assert_eq!(d[3], 100);
    let l = LogRequest { lid: lid::CMD_EFFECTS, rae: false, len: 4096, offset: 0 };
    assert_eq!(run(&mut c, with_len(l.to_sqe(7, 0), 4096)).data.unwrap().len(), 4096);
    let l = LogRequest { lid: 0x33, rae: false, len: 512, offset: 0 };
    assert_eq!(run(&mut c, with_len(l.to_sqe(7, 0), 512)).status, Status::INVALID_LOG_PAGE.dnr());
}

#[test]
fn aer_is_held_until_an_event() {
    let mut c = ctrl();
    enable(&mut c);
    let mut s = Sqe::new(admin::SET_FEATURES, 5, 0);
    s.set_cdw(10, feature::ASYNC_EVENT as u32);
    s.set_cdw(11, 1 << 8);
    run(&mut c, s);
    for cid in 10..14 {
        assert_eq!(c.execute_admin(&Sqe::new(admin::ASYNC_EVENT, cid, 0), &[], Instant::now()), AdminOutcome::Held);
    }
    assert_eq!(run(&mut c, Sqe::new(admin::ASYNC_EVENT, 20, 0)).status, Status::ASYNC_LIMIT.dnr());
    let done = c.namespace_changed(1).unwrap();
    assert_eq!((done.cid, done.result), (10, AEN_NS_CHANGED as u64));
    let l = LogRequest { lid: lid::CHANGED_NS, rae: false, len: 4096, offset: 0 };
    let d = run(&mut c, with_len(l.to_sqe(7, 0), 4096)).data.unwrap();
    assert_eq!(&d[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn keep_alive_expires_without_traffic() {
    let t0 = Instant::now();
    let ka = KeepAlive::new(1000, t0);
    ka.touch(t0);
    assert!(!ka.expired(t0 + Duration::from_millis(900)));
    assert!(ka.expired(t0 + Duration::from_millis(1100)));
    ka.touch(t0 + Duration::from_millis(1050));
    assert!(!ka.expired(t0 + Duration::from_millis(1500)));
    assert!(!KeepAlive::new(0, t0).expired(t0 + Duration::from_secs(3600)));
}

#[test]
fn a_bounded_keep_alive_expires_whatever_the_host_asks() {
    let t0 = Instant::now();
    for asked in [0, 500, 3_000_000, u32::MAX] {
        let ka = KeepAlive::new(asked, t0);
        ka.bound(2000, 120_000);
        let want = match asked {
            0 => 2000,
            ms => ms.min(120_000),
        };
        assert_eq!(ka.kato(), Some(Duration::from_millis(want as u64)), "KATO {asked}");
        assert!(ka.expired(t0 + Duration::from_millis(want as u64 + 1)), "KATO {asked}");
        assert!(!ka.expired(t0 + Duration::from_millis(want as u64 - 1)), "KATO {asked}");
    }
    // Set Features KATO 0 later does not lift the bound either.
    let ka = KeepAlive::new(10_000, t0);
    ka.bound(2000, 120_000);
    ka.set_kato_ms(0);
    assert_eq!(ka.kato(), Some(Duration::from_millis(2000)));
}

#[test]
fn discovery_controller_serves_log_page() {
    let e = DiscoveryEntry { trtype: logpage::TRTYPE_TCP, subnqn: "nqn.t:s".into(), traddr: "127.0.0.1".into(), trsvcid: "4420".into(), portid: 1, subtype: 2, tls: Default::default() };
    let mut c = Controller::new(1, Role::Discovery(vec![e.clone()]), "h".into(), [0; 16], 0, Instant::now());
    enable(&mut c);
    let l = LogRequest { lid: lid::DISCOVERY, rae: false, len: 16, offset: 0 };
    let d = run(&mut c, with_len(l.to_sqe(1, 0), 16)).data.unwrap();
    assert_eq!(logpage::discovery_numrec(&d), Some(1));
    let l = LogRequest { lid: lid::DISCOVERY, rae: false, len: 2048, offset: 0 };
    let d = run(&mut c, with_len(l.to_sqe(1, 0), 2048)).data.unwrap();
    assert_eq!(logpage::parse_discovery_log(&d).unwrap().1, vec![e]);
    let mut s = with_len(Sqe::new(admin::IDENTIFY, 4, 0), 4096);
    s.set_cdw(10, cns::CONTROLLER as u32);
    let d = run(&mut c, s).data.unwrap();
    assert_eq!(identify::IdCtrl::parse(&d).unwrap().cntrltype, identify::CNTRLTYPE_DISCOVERY);
}

#[test]
fn ana_log_page_and_change_notice() {
    let mut c = ctrl();
    enable(&mut c);
    // No notice unless the host enabled ANA change notices.
    assert_eq!(c.ana_changed(), None);
    let mut sf = Sqe::new(admin::SET_FEATURES, 5, 0);
    sf.set_cdw(10, feature::ASYNC_EVENT as u32);
    sf.set_cdw(11, crate::ana::AEC_ANA_CHANGE);
    assert!(run(&mut c, sf).status.is_success());
    let aer = Sqe::new(admin::ASYNC_EVENT, 6, 0);
    assert_eq!(c.execute_admin(&aer, &[], Instant::now()), AdminOutcome::Held);
    let ana = c.subsystem().unwrap().ana.clone();
    assert!(ana.set_state(crate::ana::AnaState::Inaccessible));
    let done = c.ana_changed().expect("the parked AER completes");
    assert_eq!((done.cid, done.result), (6, crate::ana::AEN_ANA_CHANGE as u64));
    let log = LogRequest { lid: lid::ANA, rae: false, len: 16 + 32 + 4, offset: 0 };
    let got = run(&mut c, with_len(log.to_sqe(7, 0xFFFF_FFFF), 52));
    assert!(got.status.is_success());
    let (chg, groups) = crate::ana::parse_log(&got.data.unwrap()).unwrap();
    assert_eq!((chg, groups.len(), groups[0].group, groups[0].state, groups[0].nsids.clone()), (2, 1, 1, 3, vec![1]));
    // A notice with no AER parked waits for the next one.
    assert!(ana.set_state(crate::ana::AnaState::Optimized));
    assert_eq!(c.ana_changed(), None);
    let r = run(&mut c, Sqe::new(admin::ASYNC_EVENT, 8, 0));
    assert_eq!(r.result, crate::ana::AEN_ANA_CHANGE as u64);
}

/// Dispatch follows the command table: a discovery controller refuses what
/// its row does not allow, unknown opcodes and I/O opcodes are refused on
/// the admin queue, and every row the table lists is accepted.
#[test]
fn admin_dispatch_follows_the_command_table() {
    use crate::command_table::{QueueKind, COMMANDS};
    let mut nvm = ctrl();
    enable(&mut nvm);
    let mut disc = Controller::new(2, Role::Discovery(vec![]), "h".into(), [0; 16], 0, Instant::now());
    enable(&mut disc);
    for op in 0..=255u8 {
        let row = crate::command_table::lookup(QueueKind::Admin, op);
        for (c, is_disc) in [(&mut nvm, false), (&mut disc, true)] {
            let mut s = with_len(Sqe::new(op, 9, 0), 4096);
            s.set_cdw(10, 1); // a valid CNS / log id / feature for the listed commands
            let st = match c.execute_admin(&s, &[], Instant::now()) {
                AdminOutcome::Complete(x) => x.status,
                AdminOutcome::Held => Status::SUCCESS,
            };
            let listed = row.is_some_and(|r| r.discovery || !is_disc);
            if op == crate::queue_entry::FABRICS_OPCODE {
                continue;
            }
            assert_eq!(st == Status::INVALID_OPCODE.dnr(), !listed, "opcode {op:#04x} on {} controller: {st}", if is_disc { "discovery" } else { "NVM" });
        }
    }
    assert!(COMMANDS.iter().any(|r| r.queue == QueueKind::Admin && !r.discovery), "Abort is NVM-only");
}

/// A live change (namespace 2 added, 1 resized): Identify answers from the
/// new subsystem, one event reports both, and the log lists them; with
/// the event disabled nothing is sent (the log still lists them).
#[test]
fn live_subsystem_change_raises_one_namespace_event() {
    let mut c = ctrl();
    enable(&mut c);
    let old = c.subsystem().unwrap().clone();
    let v2 = Volume::open("v2", &BackendSpec::ram(2 << 20)).unwrap();
    let mut new = (*old).clone();
    new.namespaces.push(Namespace::new("nqn.t:s", 2, v2, false));
    let new = Arc::new(new);
    let mut changed = crate::changed_namespaces(&old, &new);
    changed.push(1);
    assert_eq!(c.subsystem_changed(new.clone(), &changed), None, "the host did not enable the event");
    let mut s = Sqe::new(admin::SET_FEATURES, 5, 0);
    s.set_cdw(10, feature::ASYNC_EVENT as u32);
    s.set_cdw(11, 1 << 8);
    run(&mut c, s);
    assert_eq!(c.execute_admin(&Sqe::new(admin::ASYNC_EVENT, 10, 0), &[], Instant::now()), AdminOutcome::Held);
    let done = c.subsystem_changed(new, &[1, 2]).unwrap();
    assert_eq!((done.cid, done.result), (10, AEN_NS_CHANGED as u64));
    let mut id = with_len(Sqe::new(admin::IDENTIFY, 4, 0), 4096);
    id.set_cdw(10, cns::CONTROLLER as u32);
    assert_eq!(identify::IdCtrl::parse(&run(&mut c, id).data.unwrap()).unwrap().nn, 2);
    let l = LogRequest { lid: lid::CHANGED_NS, rae: false, len: 4096, offset: 0 };
    let d = run(&mut c, with_len(l.to_sqe(7, 0), 4096)).data.unwrap();
    assert_eq!(&d[..12], &[2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
}

/// Reservation notices: a log entry per notice (read once, RAE keeps it),
/// an AEN for a parked AER, the mask drops a type; RESCAP and the
/// persistence feature report the shared state.
#[test]
fn reservation_notices_log_and_features() {
    use crate::reservation::notice;
    let mut c = ctrl();
    enable(&mut c);
    let aer = Sqe::new(admin::ASYNC_EVENT, 6, 0);
    assert_eq!(c.execute_admin(&aer, &[], Instant::now()), AdminOutcome::Held);
    let done = c.reservation_notice(1, notice::REGISTRATION_PREEMPTED).expect("the parked AER completes");
    assert_eq!((done.cid, done.result), (6, AEN_RESERVATION as u64));
    assert_eq!(c.reservation_notice(1, notice::RESERVATION_RELEASED), None, "no AER parked: it waits");
    let log = |c: &mut Controller, rae: bool| {
        let r = LogRequest { lid: lid::RESERVATION, rae, len: 64, offset: 0 };
        let got = run(c, with_len(r.to_sqe(7, 0xFFFF_FFFF), 64));
        let d = got.data.unwrap();
        (u64::from_le_bytes(d[..8].try_into().unwrap()), d[8], d[9], u32::from_le_bytes(d[12..16].try_into().unwrap()))
    };
    assert_eq!(log(&mut c, true), (1, notice::REGISTRATION_PREEMPTED, 1, 1), "RAE: read, kept");
    assert_eq!(log(&mut c, false), (1, notice::REGISTRATION_PREEMPTED, 1, 1));
    assert_eq!(log(&mut c, false), (2, notice::RESERVATION_RELEASED, 0, 1));
    assert_eq!(log(&mut c, false), (0, 0, 0, 0), "empty");
    assert_eq!(run(&mut c, Sqe::new(admin::ASYNC_EVENT, 8, 0)).result, AEN_RESERVATION as u64);
    // Masked: Registration Preempted (bit 1) on namespace 1.
    let mut sf = Sqe::new(admin::SET_FEATURES, 9, 1);
    sf.set_cdw(10, feature::RESV_MASK as u32);
    sf.set_cdw(11, 1 << notice::REGISTRATION_PREEMPTED);
    assert!(run(&mut c, sf).status.is_success());
    assert_eq!(c.reservation_notice(1, notice::REGISTRATION_PREEMPTED), None);
    assert_eq!(log(&mut c, false).1, 0, "a masked notice leaves no entry");
    let mut gf = Sqe::new(admin::GET_FEATURES, 10, 1);
    gf.set_cdw(10, feature::RESV_MASK as u32);
    assert_eq!(run(&mut c, gf).result, 1 << notice::REGISTRATION_PREEMPTED);
    // Persistence: Set goes to the volume's state, Get reads it.
    let mut sp = Sqe::new(admin::SET_FEATURES, 11, 1);
    sp.set_cdw(10, feature::RESV_PERSIST as u32);
    sp.set_cdw(11, 1);
    assert!(run(&mut c, sp).status.is_success());
    assert!(c.subsystem().unwrap().namespaces[0].volume.reservations().cached().aptpl);
    let mut gp = Sqe::new(admin::GET_FEATURES, 12, 1);
    gp.set_cdw(10, feature::RESV_PERSIST as u32);
    assert_eq!(run(&mut c, gp).result, 1);
    // Identify Namespace RESCAP.
    let mut id = Sqe::new(admin::IDENTIFY, 13, 1);
    id.set_cdw(10, crate::identify::cns::NAMESPACE as u32);
    assert_eq!(run(&mut c, with_len(id, 4096)).data.unwrap()[31], crate::reservation::RESCAP);
}

/// Per-host visibility: a namespace shown only to "nqn.h" is inactive for
/// any other host (absent from its lists, zeroed in Identify, refused for
/// admin features, I/O and reservations), and a change of its host list
/// reaches only the hosts it concerns, as the AEN config allows.
#[test]
fn a_namespace_hidden_from_a_host_is_inactive_for_it() {
    use crate::nvm_io::{self, Host};
    use crate::queue_entry::nvm;
    let v = Volume::open("v", &BackendSpec::ram(1 << 20)).unwrap();
    let mut hidden = Namespace::new("nqn.t:s", 2, v.clone(), false);
    hidden.visible_to = Some(vec!["nqn.h".into()]);
    let old = Arc::new(Subsystem { nqn: "nqn.t:s".into(), serial: "S".into(), model: "M".into(), namespaces: vec![Namespace::new("nqn.t:s", 1, v, false), hidden], allowed_hosts: vec![], ana: Default::default() });
    let ctrl_of = |host: &str| {
        let mut c = Controller::new(3, Role::Nvm(old.clone()), host.into(), [0; 16], 5000, Instant::now());
        enable(&mut c);
        c
    };
    let identify = |c: &mut Controller, cns: u8, nsid: u32| {
        let mut s = with_len(Sqe::new(admin::IDENTIFY, 4, nsid), 4096);
        s.set_cdw(10, cns as u32);
        run(c, s)
    };
    let active = |c: &mut Controller| -> Vec<u32> {
        let d = identify(c, cns::ACTIVE_NS_LIST, 0).data.unwrap();
        d.chunks(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).take_while(|n| *n != 0).collect()
    };
    let (mut mine, mut other) = (ctrl_of("nqn.h"), ctrl_of("nqn.other"));
    assert_eq!((active(&mut mine), active(&mut other)), (vec![1, 2], vec![1]));
    assert_eq!(identify::parse_namespace(&identify(&mut mine, cns::NAMESPACE, 2).data.unwrap()), Some((2048, 512, false)));
    assert_eq!(identify(&mut other, cns::NAMESPACE, 2).data.unwrap(), vec![0u8; 4096], "inactive: zeroed");
    for cns in [cns::NS_DESCRIPTORS, cns::CS_NAMESPACE] {
        assert_eq!(identify(&mut other, cns, 2).status, Status::INVALID_NS.dnr());
        assert!(identify(&mut mine, cns, 2).status.is_success());
    }
    let mut mask = Sqe::new(admin::SET_FEATURES, 5, 2);
    mask.set_cdw(10, feature::RESV_MASK as u32);
    assert_eq!(run(&mut other, mask).status, Status::INVALID_NS.dnr());
    // The ANA log names only the namespaces the host sees.
    let ana = |c: &mut Controller| run(c, with_len(LogRequest { lid: lid::ANA, rae: false, len: 4096, offset: 0 }.to_sqe(7, 0), 4096)).data.unwrap();
    assert_ne!(ana(&mut mine), ana(&mut other));

    // I/O and reservation commands: Invalid Namespace or Format, before
    // any data moves (precheck) and when run.
    let mut read = with_len(Sqe::new(nvm::READ, 1, 2), 512);
    read.set_cdw(12, 0);
    let mut report = with_len(Sqe::new(nvm::RESV_REPORT, 2, 2), 4096);
    report.set_cdw(10, 4096 / 4 - 1);
    report.set_cdw(11, 1); // extended data structure
    let (h, o) = (Host::new([1; 16], "nqn.h"), Host::new([2; 16], "nqn.other"));
    for s in [&read, &report] {
        assert_eq!(nvm_io::execute(&old, &o, s, &[]).status, Status::INVALID_NS.dnr());
        assert_eq!(nvm_io::precheck(&old, "nqn.other", s), Err(Status::INVALID_NS.dnr()));
        assert!(nvm_io::execute(&old, &h, s, &[]).status.is_success());
    }
    let mut flush_all = Sqe::new(nvm::FLUSH, 3, 0xFFFF_FFFF);
    flush_all.set_sgl(Sgl { addr: 0, length: 0, kind: sgl::TRANSPORT });
    assert!(nvm_io::execute(&old, &o, &flush_all, &[]).status.is_success());

    // "nqn.other" is added to the namespace: only it is told, and only
    // once it enabled the notice.
    let mut new = (*old).clone();
    new.namespaces[1].visible_to = Some(vec!["nqn.h".into(), "nqn.other".into()]);
    let new = Arc::new(new);
    let changed = crate::changed_namespaces(&old, &new);
    assert_eq!(changed, Vec::<u32>::new(), "no attribute changed");
    assert_eq!(crate::changed_for_host(&old, &new, &changed, "nqn.h"), Vec::<u32>::new());
    assert_eq!(crate::changed_for_host(&old, &new, &changed, "nqn.other"), vec![2]);
    let mut quiet = ctrl_of("nqn.other");
    assert_eq!(quiet.execute_admin(&Sqe::new(admin::ASYNC_EVENT, 10, 0), &[], Instant::now()), AdminOutcome::Held);
    assert_eq!(quiet.subsystem_changed(new.clone(), &[2]), None, "the notice is not enabled (Async Event Configuration bit 8)");
    let mut aec = Sqe::new(admin::SET_FEATURES, 5, 0);
    aec.set_cdw(10, feature::ASYNC_EVENT as u32);
    aec.set_cdw(11, 1 << 8);
    run(&mut other, aec);
    assert_eq!(other.execute_admin(&Sqe::new(admin::ASYNC_EVENT, 10, 0), &[], Instant::now()), AdminOutcome::Held);
    let done = other.subsystem_changed(new.clone(), &[2]).unwrap();
    assert_eq!((done.cid, done.result), (10, AEN_NS_CHANGED as u64));
    assert_eq!(active(&mut other), vec![1, 2]);
    let l = LogRequest { lid: lid::CHANGED_NS, rae: false, len: 4096, offset: 0 };
    assert_eq!(&run(&mut other, with_len(l.to_sqe(7, 0), 4096)).data.unwrap()[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
    assert!(nvm_io::execute(&new, &o, &read, &[]).status.is_success());
    // And removed again: it vanishes for that host alone.
    assert_eq!(crate::changed_for_host(&new, &old, &[], "nqn.other"), vec![2]);
    assert_eq!(crate::changed_for_host(&new, &old, &[], "nqn.h"), Vec::<u32>::new());
}
