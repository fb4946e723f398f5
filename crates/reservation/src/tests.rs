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

/// A directory under /tmp only root may write, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        use std::os::unix::fs::PermissionsExt;
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("bw-pr-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scratch(p)
    }
    /// A volume file in it, open as a gateway has it.
    fn volume(&self, name: &str) -> (std::path::PathBuf, std::fs::File) {
        let p = self.0.join(name);
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p).unwrap();
        (p, f)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn file_store(vol: &std::path::Path, f: &std::fs::File) -> Box<FileStore> {
    Box::new(FileStore::beside(vol, f, false).unwrap())
}

#[test]
fn file_store_is_shared_by_two_openers_and_read_back() {
    let dir = Scratch::new("share");
    let (vol, f) = dir.volume("disk.img");
    let g1 = Shared::open(file_store(&vol, &f)).unwrap();
    let g2 = Shared::open(file_store(&vol, &f)).unwrap();
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
    let g3 = Shared::open(file_store(&vol, &f)).unwrap();
    assert!(g3.held() && g3.cached().is_holder(&a()));
    // Nothing beside the volume but its state and lock.
    let mut names: Vec<String> = std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["disk.img", "disk.img.pr", "disk.img.pr.lock"]);
}

/// A state at the counter's maximum (a damaged or crafted file): the next
/// change starts a new epoch, and a gateway that cached the old state
/// adopts it, so a preempted host is fenced there too. Before epochs, the
/// counter wrapped to 0, which the other gateway took for an old state
/// and ignored, letting the preempted host write.
#[test]
fn a_state_at_the_counter_maximum_keeps_fencing() {
    let store = Arc::new(MemoryStore::default());
    let mut s = State { seq: u64::MAX, epoch: 7, ..Default::default() };
    s.register(&a(), 0xA);
    s.reserve(&a(), pr_type::WRITE_EXCLUSIVE_REGISTRANTS_ONLY).unwrap();
    s.register(&host(), 0xC);
    store.replace(0, &s).unwrap();
    let g1 = Shared::open(Box::new(Both(store.clone()))).unwrap();
    let g2 = Shared::open(Box::new(Both(store.clone()))).unwrap();
    assert!(g2.allows(host().id(), Access::Write), "a registrant may write under registrants-only");
    // b preempts the host through g1.
    g1.change(|s| {
        s.register(&b(), 0xB);
        Ok(())
    })
    .unwrap()
    .unwrap();
    g1.change(|s| s.preempt(&b(), pr_type::WRITE_EXCLUSIVE_REGISTRANTS_ONLY, 0xC)).unwrap().unwrap();
    let stored = store.load().unwrap().unwrap();
    assert!(stored.epoch != 7 && stored.seq == 2, "a new epoch from the maximum on: {stored:?}");
    g2.read().unwrap();
    assert!(!g2.allows(host().id(), Access::Write), "the preempted host still writes through the other gateway");
    // Later changes are adopted as usual; an old state is not.
    g1.change(|s| s.release(&a(), pr_type::WRITE_EXCLUSIVE_REGISTRANTS_ONLY)).unwrap().unwrap();
    g2.read().unwrap();
    assert!(!g2.held());
    g2.adopt_for_test(s);
    assert!(!g2.held() && g2.cached().epoch == stored.epoch, "a late delivery of the epoch left behind was adopted");
}

#[test]
fn a_deleted_volumes_state_is_discarded_not_inherited() {
    let dir = Scratch::new("stale");
    let mut held = State::default();
    held.register(&a(), 0xA);
    held.reserve(&a(), pr_type::EXCLUSIVE_ACCESS).unwrap();
    held.seq = 9;
    held.epoch = 3;
    let plant = |name: &str, volume: Option<&str>| {
        let mut v: serde_json::Value = serde_json::from_slice(&held.encode()).unwrap();
        if let Some(id) = volume {
            v["volume"] = serde_json::json!(id);
        }
        std::fs::write(dir.0.join(format!("{name}.pr")), v.to_string()).unwrap();
    };
    // Another file's state (the volume before, deleted; this file may even
    // have its inode number).
    let (vol, f) = dir.volume("a.img");
    plant("a.img", Some("inode 1 born 1.000000000"));
    let g = Shared::open(file_store(&vol, &f)).unwrap();
    assert!(!g.held() && !dir.0.join("a.img.pr").exists());
    // An older blockwire's (no identity), written before the file was made.
    plant("b.img", None);
    std::thread::sleep(Duration::from_millis(20));
    let (vol, f) = dir.volume("b.img");
    assert!(!Shared::open(file_store(&vol, &f)).unwrap().held());
    // ... and after: the file's own, adopted (and bound at the next change).
    plant("b.img", None);
    let g = Shared::open(file_store(&vol, &f)).unwrap();
    assert!(g.held());
    g.change(|s| {
        s.register(&b(), 0xB);
        Ok(())
    })
    .unwrap()
    .unwrap();
    assert!(std::fs::read_to_string(dir.0.join("b.img.pr")).unwrap().contains("\"volume\":\"inode "));
    // A file the open created has nothing beside it of its own.
    let (vol, f) = dir.volume("c.img");
    plant("c.img", None);
    let g = Shared::open(Box::new(FileStore::beside(&vol, &f, true).unwrap())).unwrap();
    assert!(!g.held());
    // Another file's state appearing while serving is refused, not taken.
    let (vol, f) = dir.volume("d.img");
    let g = Shared::open(file_store(&vol, &f)).unwrap();
    plant("d.img", Some("inode 1"));
    let e = g.change(|s| s.reserve(&a(), 1)).unwrap_err();
    assert!(e.to_string().contains("the reservations of another file"), "{e}");
}

/// Only in a directory only root may write, and never through a link.
#[test]
fn files_beside_a_volume_are_made_where_only_root_writes_and_never_through_links() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let dir = Scratch::new("links");
    let victim = dir.0.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let (vol, f) = dir.volume("v.img");
    symlink(&victim, dir.0.join("v.img.pr.lock")).unwrap();
    let e = FileStore::beside(&vol, &f, false).err().expect("a link at the lock file was followed");
    assert!(e.to_string().contains("symbolic link; not following it"), "{e}");
    std::fs::remove_file(dir.0.join("v.img.pr.lock")).unwrap();
    symlink(&victim, dir.0.join("v.img.pr")).unwrap();
    let e = FileStore::beside(&vol, &f, false).err().expect("a link at the state was followed");
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let e = FileStore::beside(&vol, &f, false).err().expect("a world-writable directory was trusted");
    assert!(bw_rootdir::is_untrusted(&e), "{e}");
}
