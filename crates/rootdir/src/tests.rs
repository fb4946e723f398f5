//! These run as root (as `make test` does): they make directories of
//! other owners and modes, and links where an attacker would plant them.

use super::*;
use std::os::unix::fs::{symlink, PermissionsExt};

const NOBODY: u32 = 65534;

fn require_root() {
    assert_eq!(euid(), 0, "these tests make files of other users: run them as root (make test does)");
}

/// A fresh directory under /tmp (root's, mode 700), removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!("bw-rootdir-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), None).unwrap();
}

fn refusal(dir: &Path) -> String {
    let e = RootDir::open(dir).unwrap_err();
    assert!(is_untrusted(&e), "{e}");
    e.to_string()
}

#[test]
fn only_directories_no_other_user_may_write_are_trusted() {
    require_root();
    let s = Scratch::new("trust");
    RootDir::open(&s.0).unwrap();
    chmod(&s.0, 0o1777);
    assert!(refusal(&s.0).contains("may be written by every user (mode 1777)"));
    chmod(&s.0, 0o775);
    assert!(refusal(&s.0).contains("may be written by its group (mode 0775)"));
    chmod(&s.0, 0o755);
    chown(&s.0, NOBODY);
    assert!(refusal(&s.0).contains("is owned by uid 65534"));
    chown(&s.0, 0);
    // A private directory under one others may write (not sticky): they
    // could rename it away and put theirs there.
    let inner = s.0.join("inner");
    std::fs::create_dir(&inner).unwrap();
    chmod(&s.0, 0o777);
    assert!(refusal(&inner).contains("who could put another directory at"), "{}", refusal(&inner));
    // Sticky (as /tmp): they cannot rename root's directory.
    chmod(&s.0, 0o1777);
    RootDir::open(&inner).unwrap();
    chmod(&s.0, 0o700);
    // A link to a trusted directory leads there: the check is of where
    // it leads.
    let via = s.0.join("via");
    symlink(&inner, &via).unwrap();
    assert_eq!(RootDir::open(&via).unwrap().path(), inner.canonicalize().unwrap());
    // create makes what is missing private.
    let made = RootDir::create(&s.0.join("a/b")).unwrap();
    assert_eq!(std::fs::metadata(made.path()).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(std::fs::metadata(s.0.join("a")).unwrap().permissions().mode() & 0o777, 0o700);
}

#[test]
fn links_at_a_name_are_never_followed() {
    require_root();
    let s = Scratch::new("links");
    let victim = s.0.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let d = RootDir::open(&s.0).unwrap();
    symlink(&victim, s.0.join("x.lock")).unwrap();
    let e = d.open_lock(OsStr::new("x.lock")).unwrap_err();
    assert!(e.to_string().contains("symbolic link; not following it"), "{e}");
    assert!(d.read(OsStr::new("x.lock")).is_err());
    assert_eq!(d.create_new(OsStr::new("x.lock"), 0o600).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
    // A dangling link: nothing is created where it points.
    let nowhere = s.0.join("nowhere");
    symlink(&nowhere, s.0.join("y")).unwrap();
    assert!(d.open_lock(OsStr::new("y")).is_err() && d.create_new(OsStr::new("y"), 0o600).is_err());
    assert!(!nowhere.exists());
    // A hard link is another name of the victim: not used either.
    std::fs::hard_link(&victim, s.0.join("h")).unwrap();
    assert!(d.open_lock(OsStr::new("h")).unwrap_err().to_string().contains("2 names"));
    assert!(d.read(OsStr::new("h")).is_err());
    // A file of another user's: not read as root's.
    std::fs::write(s.0.join("theirs"), "{}").unwrap();
    chown(&s.0.join("theirs"), NOBODY);
    assert!(d.read(OsStr::new("theirs")).unwrap_err().to_string().contains("uid 65534"));
    // Replacing a link or another user's file replaces the name, not what
    // it led to; the new file is root's and private.
    d.replace(OsStr::new("x.lock"), b"new", 0o600).unwrap();
    d.replace(OsStr::new("theirs"), b"mine", 0o600).unwrap();
    for (n, want) in [("x.lock", "new"), ("theirs", "mine")] {
        let m = std::fs::symlink_metadata(s.0.join(n)).unwrap();
        assert!(m.is_file() && m.uid() == 0 && m.mode() & 0o777 == 0o600, "{n}: {m:?}");
        assert_eq!(std::fs::read_to_string(s.0.join(n)).unwrap(), want);
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(d.remove(OsStr::new("y")).unwrap() && !d.remove(OsStr::new("y")).unwrap());
    assert!(c_name(OsStr::new("../x")).is_err() && c_name(OsStr::new("..")).is_err() && c_name(OsStr::new("a\0b")).is_err());
}

#[test]
fn replacing_leaves_no_temporaries_and_dead_writers_are_cleaned_up() {
    require_root();
    let s = Scratch::new("tmp");
    let d = RootDir::open(&s.0).unwrap();
    let name = OsStr::new("serve.toml");
    d.replace(name, b"a = 1\n", 0o600).unwrap();
    d.replace(name, b"a = 2\n", 0o600).unwrap();
    let entries = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&s.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(entries(), ["serve.toml"]);
    // A killed writer's temporary, and a live one's (this test's parent).
    let dead = {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        c.id()
    };
    // SAFETY: getppid has no preconditions.
    let live = unsafe { libc::getppid() };
    std::fs::write(s.0.join(format!(".serve.toml.new-{dead}")), "torn").unwrap();
    std::fs::write(s.0.join(format!(".serve.toml.new-{live}")), "in progress").unwrap();
    std::fs::write(s.0.join(format!(".other.new-{dead}")), "not ours").unwrap();
    let gone = d.remove_temporaries(name).unwrap();
    assert_eq!(gone, [OsString::from(format!(".serve.toml.new-{dead}"))]);
    assert_eq!(entries(), [format!(".other.new-{dead}"), format!(".serve.toml.new-{live}"), "serve.toml".into()]);
    assert_eq!(std::fs::read_to_string(s.0.join("serve.toml")).unwrap(), "a = 2\n");
}
