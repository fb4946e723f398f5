use super::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn a() -> Who {
    Who::scsi("iqn.a,i,0x1", 1)
}
fn b() -> Who {
    Who::scsi("iqn.b,i,0x2", 2)
}
fn host() -> Who {
    Who::nvme(&[0x11; 16])
}

#[test]
fn identities_round_trip() {
    assert_eq!(Who::scsi("IQN.A,i,0x1", 7).scsi_parts(), Some(("iqn.a,i,0x1", 7)));
    assert_eq!(host().nvme_hostid(), Some([0x11; 16]));
    assert_ne!(Who::scsi("iqn.a,i,0x1", 1).id(), Who::scsi("iqn.a,i,0x1", 2).id(), "an I_T nexus includes the target port");
}

#[test]
fn write_exclusive_lets_others_read_only() {
    let mut s = State::default();
    s.register(&a(), 0xA);
    s.reserve(&a(), pr_type::WRITE_EXCLUSIVE).unwrap();
    assert!(s.allows(a().id(), Access::Write));
    assert!(s.allows(b().id(), Access::Read));
    assert!(!s.allows(b().id(), Access::Write));
    assert!(!s.allows(host().id(), Access::Write));
    assert_eq!(s.reserve(&b(), pr_type::WRITE_EXCLUSIVE), Err(Refusal::Conflict));
    assert_eq!(s.holder_key(), 0xA);
    assert_eq!(s.generation, 1, "RESERVE does not count");
}

#[test]
fn preempt_removes_the_holder_and_tells_it() {
    let mut s = State::default();
    s.register(&a(), 0xA);
    s.reserve(&a(), pr_type::EXCLUSIVE_ACCESS).unwrap();
    s.register(&host(), 0xB);
    assert!(!s.allows(host().id(), Access::Read));
    s.preempt(&host(), pr_type::WRITE_EXCLUSIVE, 0xA).unwrap();
    assert!(s.is_holder(&host()) && s.key_of(&a()).is_none());
    assert_eq!(s.events, vec![Event { seq: 0, who: a().as_str().into(), notice: Notice::RegistrationPreempted }]);
    assert_eq!(s.preempt(&host(), 1, 0), Err(Refusal::ZeroKey));
    assert_eq!(s.preempt(&host(), 1, 0x77), Err(Refusal::Conflict));
    s.release(&host(), pr_type::WRITE_EXCLUSIVE).unwrap();
    assert!(s.holder.is_none());
}

#[test]
fn all_registrants_and_registrants_only() {
    let mut s = State::default();
    s.register(&a(), 1);
    s.register(&b(), 2);
    s.reserve(&a(), pr_type::WRITE_EXCLUSIVE_ALL_REGISTRANTS).unwrap();
    assert!(s.is_holder(&b()) && s.allows(b().id(), Access::Write));
    assert_eq!(s.holder_key(), 0);
    s.unregister(&a());
    assert!(s.holder.is_some(), "held while a registrant is left");
    s.unregister(&b());
    assert!(s.holder.is_none());
    s.register(&a(), 1);
    s.register(&b(), 2);
    s.reserve(&a(), pr_type::WRITE_EXCLUSIVE_REGISTRANTS_ONLY).unwrap();
    s.events.clear();
    assert_eq!(s.release(&a(), pr_type::WRITE_EXCLUSIVE), Err(Refusal::WrongType));
    s.release(&a(), pr_type::WRITE_EXCLUSIVE_REGISTRANTS_ONLY).unwrap();
    assert_eq!(s.events, vec![Event { seq: 0, who: b().as_str().into(), notice: Notice::ReservationReleased }]);
    s.clear(&b());
    assert!(s.registrants.is_empty());
    assert_eq!(s.events.last().map(|e| (e.who.clone(), e.notice)), Some((a().as_str().into(), Notice::ReservationPreempted)));
}

#[test]
fn state_round_trips_with_ids() {
    let mut s = State::default();
    s.register(&a(), 5);
    s.reserve(&a(), 1).unwrap();
    s.aptpl = true;
    let back = State::decode(&s.encode()).unwrap();
    assert_eq!(back, s);
    assert!(back.is_holder(&a()));
    assert!(State::decode(b"{not json").is_err());
}

/// Two processes' views of one store (two gateways).
struct Both(Arc<MemoryStore>);
impl Store for Both {
    fn load(&self) -> io::Result<Option<State>> {
        self.0.load()
    }
    fn replace(&self, expected: u64, new: &State) -> io::Result<bool> {
        self.0.replace(expected, new)
    }
    fn describe(&self) -> String {
        "both".into()
    }
}

#[test]
fn changes_are_compare_and_swap_on_the_store() {
    let store = Arc::new(MemoryStore::default());
    let g1 = Shared::open(Box::new(Both(store.clone()))).unwrap();
    let g2 = Shared::open(Box::new(Both(store.clone()))).unwrap();
    g1.change(|s| {
        s.register(&a(), 0xA);
        s.reserve(&a(), pr_type::WRITE_EXCLUSIVE)
    })
    .unwrap()
    .unwrap();
    // g2 has not heard (this store does not publish), but a change made
    // through it works on the stored state, not its stale cache.
    assert!(!g2.held());
    let r = g2.change(|s| s.reserve(&b(), pr_type::WRITE_EXCLUSIVE)).unwrap();
    assert_eq!(r, Err(Refusal::Conflict));
    assert!(g2.held(), "a refused change still refreshes the cache");
    assert!(!g2.allows(b().id(), Access::Write));
    let notices = Arc::new(Mutex::new(Vec::new()));
    let n2 = notices.clone();
    let _l = g1.listen(move |e| n2.lock().unwrap().push(e.clone()));
    g2.change(|s| {
        s.register(&b(), 0xB);
        s.preempt(&b(), pr_type::WRITE_EXCLUSIVE, 0xA)
    })
    .unwrap()
    .unwrap();
    assert_eq!(store.load().unwrap().unwrap().seq, 2);
    assert!(notices.lock().unwrap().is_empty(), "g1 only hears when it looks");
    g1.read().unwrap();
    assert_eq!(notices.lock().unwrap().iter().map(|e| (e.seq, e.notice)).collect::<Vec<_>>(), vec![(2, Notice::RegistrationPreempted)]);
    // A change with nothing to change stores nothing.
    g1.change(|s| s.release(&a(), 1)).unwrap().unwrap();
    assert_eq!(store.load().unwrap().unwrap().seq, 2);
}

#[test]
fn file_store_is_shared_by_two_openers_and_read_back() {
    let dir = std::env::temp_dir().join(format!("bw-pr-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let vol = dir.join("disk.img");
    let g1 = Shared::open(Box::new(FileStore::beside(&vol))).unwrap();
    let g2 = Shared::open(Box::new(FileStore::beside(&vol))).unwrap();
    g1.change(|s| {
        s.register(&a(), 0xA);
        s.reserve(&a(), pr_type::EXCLUSIVE_ACCESS)
    })
    .unwrap()
    .unwrap();
    // g2 hears through inotify.
    let t = Instant::now();
    while !g2.held() {
        assert!(t.elapsed() < Duration::from_secs(30), "the other opener never heard of the reservation");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!g2.allows(b().id(), Access::Read));
    drop((g1, g2));
    // Opened again ("a restarted gateway"): read back.
    let g3 = Shared::open(Box::new(FileStore::beside(&vol))).unwrap();
    assert!(g3.held() && g3.cached().is_holder(&a()));
    std::fs::remove_dir_all(&dir).unwrap();
}
