//! The state file an attach daemon keeps in `STATE_DIR/attach-PID.json`:
//! what `blockwire umount` must undo (file system, loop device, FUSE
//! directory, daemon) and whether the daemon can still reach its target.
//! The lab reads it too, to find the daemon behind a mount.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where attach daemons keep their state files (`attach-PID.json`), their
/// logs, and the FUSE directories of `blockwire mount`.
pub const STATE_DIR: &str = "/run/blockwire";

/// One attach daemon, as its state file records it. Files written by
/// earlier versions lack `start` (and `target` until the target was first
/// found unreachable); both read as `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachState {
    /// The daemon's PID.
    pub pid: u32,
    /// When the daemon started, in clock ticks after boot (/proc/PID/stat
    /// field 22): with `pid` it names one process, so a PID reused after the
    /// daemon was killed is never taken for it.
    #[serde(default)]
    pub start: Option<u64>,
    /// The target URL with any secret hidden (`redact`).
    #[serde(default)]
    pub url: String,
    /// The FUSE directory (absolute, no symlinks).
    pub dir: PathBuf,
    /// The volume's file inside `dir`.
    #[serde(default)]
    pub file: PathBuf,
    /// The loop device on `file`, if one was made (`/dev/loopN`).
    #[serde(default, rename = "loop")]
    pub loop_dev: Option<String>,
    /// Where `blockwire mount` mounted the file system on the loop device.
    #[serde(default)]
    pub mountpoint: Option<PathBuf>,
    /// Written when reachability changes, so `umount` knows when waiting
    /// for the target is pointless.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetHealth>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetHealth {
    Reachable,
    Unreachable,
}

/// The state file of the daemon with PID `pid`.
pub fn state_path(pid: u32) -> PathBuf {
    Path::new(STATE_DIR).join(format!("attach-{pid}.json"))
}

/// The log of the daemon with PID `pid` (its stderr when started in the
/// background).
pub fn log_path(pid: u32) -> PathBuf {
    Path::new(STATE_DIR).join(format!("attach-{pid}.log"))
}

impl AttachState {
    pub fn path(&self) -> PathBuf {
        state_path(self.pid)
    }

    pub fn read(path: &Path) -> std::io::Result<AttachState> {
        let text = std::fs::read_to_string(path)?;
        serde_json::from_str(&text).map_err(std::io::Error::other)
    }

    /// Write (or rewrite) this daemon's state file.
    pub fn write(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(STATE_DIR)?;
        let text = serde_json::to_string(self).map_err(std::io::Error::other)?;
        std::fs::write(self.path(), text)
    }

    /// Every readable state file in `STATE_DIR` (unreadable ones are skipped:
    /// a file being written, or not ours).
    pub fn all() -> Vec<AttachState> {
        let Ok(rd) = std::fs::read_dir(STATE_DIR) else {
            return vec![];
        };
        rd.flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("attach-") && name.ends_with(".json")
            })
            .filter_map(|e| AttachState::read(&e.path()).ok())
            .collect()
    }

    /// The attach whose mount point or FUSE directory is `path` (absolute).
    pub fn at(path: &Path) -> Option<AttachState> {
        AttachState::all()
            .into_iter()
            .find(|s| s.mountpoint.as_deref() == Some(path) || s.dir == path)
    }

    /// The attach whose file system `blockwire mount` mounted at `mountpoint`.
    pub fn of_mountpoint(mountpoint: &Path) -> Option<AttachState> {
        AttachState::all()
            .into_iter()
            .find(|s| s.mountpoint.as_deref() == Some(mountpoint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_state_files_of_every_version() {
        // Written before start times were recorded (2026-11-22).
        let first = r#"{"dir":"/tmp/a","file":"/tmp/a/disk","loop":null,"mountpoint":null,"pid":412,"url":"null://64M"}"#;
        let s: AttachState = serde_json::from_str(first).unwrap();
        assert_eq!(
            s,
            AttachState {
                pid: 412,
                start: None,
                url: "null://64M".into(),
                dir: "/tmp/a".into(),
                file: "/tmp/a/disk".into(),
                loop_dev: None,
                mountpoint: None,
                target: None,
            }
        );
        // As `json!` wrote it until 2026-11-24: a start time (null if
        // /proc could not be read) and the target's health once it changed.
        let mount = r#"{"dir":"/run/blockwire/fuse/_tmp_x","file":"/run/blockwire/fuse/_tmp_x/disk","loop":"/dev/loop3","mountpoint":"/tmp/x","pid":9,"start":12345,"target":"unreachable","url":"iscsi://u%***@198.18.0.1/iqn.x"}"#;
        let s: AttachState = serde_json::from_str(mount).unwrap();
        assert_eq!(s.start, Some(12345));
        assert_eq!(s.loop_dev.as_deref(), Some("/dev/loop3"));
        assert_eq!(s.mountpoint.as_deref(), Some(Path::new("/tmp/x")));
        assert_eq!(s.target, Some(TargetHealth::Unreachable));
        let null_start = r#"{"dir":"/d","file":"/d/disk","loop":null,"mountpoint":null,"pid":7,"start":null,"url":"null://1M"}"#;
        assert_eq!(
            serde_json::from_str::<AttachState>(null_start)
                .unwrap()
                .start,
            None
        );
    }

    #[test]
    fn writes_the_fields_earlier_readers_look_up() {
        let s = AttachState {
            pid: 9,
            start: Some(5),
            url: "null://1M".into(),
            dir: "/d".into(),
            file: "/d/disk".into(),
            loop_dev: Some("/dev/loop1".into()),
            mountpoint: None,
            target: None,
        };
        let v: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(v["pid"], 9);
        assert_eq!(v["start"], 5);
        assert_eq!(v["dir"], "/d");
        assert_eq!(v["loop"], "/dev/loop1");
        assert!(v["mountpoint"].is_null());
        assert!(v.get("target").is_none());
        let down = AttachState {
            target: Some(TargetHealth::Unreachable),
            ..s.clone()
        };
        assert_eq!(
            serde_json::to_value(&down).unwrap()["target"],
            "unreachable"
        );
        assert_eq!(serde_json::from_value::<AttachState>(v).unwrap(), s);
    }
}
