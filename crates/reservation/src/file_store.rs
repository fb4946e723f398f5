//! Reservations of a file volume, kept beside the file: `FILE.pr` holds the
//! state (JSON, replaced whole: written to `.FILE.pr.new-PID`, synced,
//! renamed; older blockwires wrote `FILE.pr.tmpPID`; a killed writer's
//! temporary of either name is removed when the store is opened),
//! `FILE.pr.lock` is flock()ed around each compare-and-swap, so several
//! processes on one host that serve the same file agree. Each process
//! learns of the others' changes through inotify on the directory.
//!
//! The directory must be one only root may write ([`RootDir`]): the files
//! are made, read and replaced there by root, relative to the directory
//! held open and never through a link, and a state there can only have
//! been written by root. The state names the file it belongs to (its inode
//! and birth time: `volume`), so a state left beside a file by a volume
//! that was deleted (a crash between removing the file and its state, or
//! files of an older blockwire that did not remove it) is recognised when
//! a new file of that name is opened, and discarded, never inherited.

use crate::{State, Store};
use bw_rootdir::RootDir;
use serde::{Deserialize, Serialize};
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub struct FileStore {
    at: Arc<Beside>,
    /// Written to end the inotify thread.
    stop: std::sync::Mutex<Option<OwnedFd>>,
}

/// Where the state is, and whose it is.
struct Beside {
    dir: RootDir,
    /// `FILE.pr`.
    state: OsString,
    /// `FILE.pr.lock`.
    lock: OsString,
    /// The volume file's identity, as the state records it.
    volume: String,
}

/// The state as the file holds it: the state and the file it is of
/// (absent in files written before identities were recorded). Readers
/// that do not know `volume` ignore it.
#[derive(Serialize, Deserialize)]
struct OnDisk {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    volume: Option<String>,
    #[serde(flatten)]
    state: State,
}

/// The names of the files beside `volume_file` (named `name`).
fn names(name: &OsStr) -> (OsString, OsString) {
    let mut state = name.to_owned();
    state.push(".pr");
    let mut lock = state.clone();
    lock.push(".lock");
    (state, lock)
}

/// A file's identity within its directory: its inode, and its birth time
/// where the file system keeps one (a new file may get a deleted one's
/// inode number; not its birth time); and that birth time.
fn identity(file: &File) -> io::Result<(String, Option<SystemTime>)> {
    // SAFETY: statx fills a plain struct for a valid descriptor and an
    // empty path (AT_EMPTY_PATH).
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let empty = CString::default();
    if unsafe { libc::statx(file.as_raw_fd(), empty.as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_INO | libc::STATX_BTIME, &mut stx) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (sec, nsec) = (stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec);
    Ok(if stx.stx_mask & libc::STATX_BTIME != 0 {
        let born = u64::try_from(sec).ok().map(|s| SystemTime::UNIX_EPOCH + Duration::new(s, nsec));
        (format!("inode {} born {sec}.{nsec:09}", stx.stx_ino), born)
    } else {
        (format!("inode {}", stx.stx_ino), None)
    })
}

impl Beside {
    fn describe(&self) -> String {
        self.dir.join(&self.state).display().to_string()
    }

    /// The stored state, with the identity it records.
    fn read_raw(&self) -> io::Result<Option<OnDisk>> {
        let Some(b) = self.dir.read(&self.state)? else { return Ok(None) };
        let d: OnDisk = serde_json::from_slice(&b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", self.describe())))?;
        let mut d = d;
        d.state.fill_ids();
        Ok(Some(d))
    }

    /// The stored state, refused if it records another file.
    fn read(&self) -> io::Result<Option<State>> {
        match self.read_raw()? {
            Some(OnDisk { volume: Some(v), .. }) if v != self.volume => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is the reservations of another file ({v}), not of this one ({})", self.describe(), self.volume),
            )),
            d => Ok(d.map(|d| d.state)),
        }
    }

    fn lock(&self) -> io::Result<Locked> {
        let f = self.dir.open_lock(&self.lock)?;
        // SAFETY: flock on an open descriptor.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Locked(f))
    }
}

impl FileStore {
    /// The store beside `volume_file`, which is open as `file`; `created`
    /// if opening it made it (so whatever state is beside it is a deleted
    /// volume's). Fails with a [`bw_rootdir::is_untrusted`] error if the
    /// directory is one that other users may write: the caller keeps the
    /// reservations elsewhere. A state of another file, or one left by an
    /// interrupted change, is removed here, under the lock.
    pub fn beside(volume_file: &Path, file: &File, created: bool) -> io::Result<FileStore> {
        let (dir, name) = RootDir::of(volume_file)?;
        let (state, lock) = names(&name);
        let (volume, born) = identity(file)?;
        let at = Beside { dir, state, lock, volume };
        {
            let _l = at.lock()?;
            let mut older = at.state.clone();
            older.push(".tmp");
            for t in at.dir.remove_temporaries(&at.state)?.into_iter().chain(at.dir.remove_left_by_dead(&older)?) {
                log::info!("reservations of {}: removed {}, left by a writer that was killed", volume_file.display(), at.dir.join(t).display());
            }
            let written = at.dir.modified(&at.state)?;
            let stale = match at.read_raw()? {
                Some(_) if created => Some("the file was just created".to_string()),
                // An older blockwire's state names no file: one last
                // written before the file was made cannot be its (a
                // state that names its file is judged by that alone).
                Some(OnDisk { volume: None, .. }) if born.zip(written).is_some_and(|(b, w)| w < b) => {
                    Some("they name no file and were last written before the file was made".to_string())
                }
                Some(OnDisk { volume: Some(v), .. }) if v != at.volume => Some(format!("they are of another file ({v}), not of this one ({})", at.volume)),
                Some(OnDisk { volume: None, .. }) => {
                    log::info!("reservations in {} name no file (an older blockwire wrote them): taken as {}'s", at.describe(), volume_file.display());
                    None
                }
                _ => None,
            };
            if let Some(why) = stale {
                log::warn!("reservations in {}: discarded, since {why}: a volume that was deleted left them", at.describe());
                at.dir.remove(&at.state)?;
                at.dir.sync()?;
            }
        }
        Ok(FileStore { at: Arc::new(at), stop: Default::default() })
    }

    /// Remove the store beside `volume_file` (state, lock file and
    /// temporaries), as the volume's deletion does. Missing is fine; so is
    /// a directory others may write (nothing is kept there).
    pub fn remove_beside(volume_file: &Path) -> io::Result<()> {
        let (dir, name) = match RootDir::of(volume_file) {
            Ok(d) => d,
            Err(e) if bw_rootdir::is_untrusted(&e) || e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let (state, lock) = names(&name);
        dir.remove(&state)?;
        dir.remove(&lock)?;
        dir.remove(&bw_rootdir::temporary_name(&state))?;
        dir.remove_temporaries(&state)?;
        let mut older = state.clone();
        older.push(".tmp");
        dir.remove_left_by_dead(&older)?;
        Ok(())
    }

    /// Where the state is.
    pub fn path(&self) -> std::path::PathBuf {
        self.at.dir.join(&self.at.state)
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        if let Some(fd) = &*self.stop.lock().unwrap_or_else(|p| p.into_inner()) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writing 8 bytes to an eventfd we own.
            unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }
}

/// flock() held until dropped.
struct Locked(File);

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

impl Store for FileStore {
    fn load(&self) -> io::Result<Option<State>> {
        self.at.read()
    }

    fn replace(&self, expected: u64, new: &State) -> io::Result<bool> {
        let _l = self.at.lock()?;
        if self.at.read()?.map_or(0, |s| s.seq) != expected {
            return Ok(false);
        }
        let body = serde_json::to_vec(&OnDisk { volume: Some(self.at.volume.clone()), state: new.clone() }).expect("a state serialises");
        self.at.dir.replace(&self.at.state, &body, 0o600)?;
        Ok(true)
    }

    fn watch(&self, on: Arc<dyn Fn(Option<State>) + Send + Sync>) -> io::Result<()> {
        let name = self.at.state.as_bytes().to_vec();
        // SAFETY: plain syscalls; the descriptors are owned right away.
        let ino = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        if ino < 0 {
            return Err(io::Error::last_os_error());
        }
        let ino = unsafe { OwnedFd::from_raw_fd(ino) };
        // The directory held open, by its /proc name: the watch is on it
        // even if its path now leads elsewhere.
        let cdir = CString::new(self.at.dir.proc_path().as_os_str().as_bytes()).map_err(|_| io::Error::other("NUL in path"))?;
        if unsafe { libc::inotify_add_watch(ino.as_raw_fd(), cdir.as_ptr(), libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE | libc::IN_DELETE) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if stop < 0 {
            return Err(io::Error::last_os_error());
        }
        let stop = unsafe { OwnedFd::from_raw_fd(stop) };
        let stop_here = stop.try_clone()?;
        // The store writes its copy of `stop` when it drops.
        *self.stop.lock().unwrap_or_else(|p| p.into_inner()) = Some(stop_here);
        let at = self.at.clone();
        std::thread::Builder::new().name("bw-pr-watch".into()).spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let mut fds = [
                    libc::pollfd { fd: ino.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                    libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                ];
                // SAFETY: two valid pollfds.
                if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
                    continue;
                }
                if fds[1].revents != 0 {
                    return;
                }
                // SAFETY: reading into our buffer.
                let n = unsafe { libc::read(ino.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    continue;
                }
                let mut at_ev = 0usize;
                let mut ours = false;
                while at_ev + 16 <= n as usize {
                    let len = u32::from_ne_bytes(buf[at_ev + 12..at_ev + 16].try_into().expect("4 bytes")) as usize;
                    let ev_name = &buf[at_ev + 16..(at_ev + 16 + len).min(n as usize)];
                    let ev_name = &ev_name[..ev_name.iter().position(|&b| b == 0).unwrap_or(ev_name.len())];
                    ours |= ev_name == name.as_slice();
                    at_ev += 16 + len;
                }
                if ours {
                    match at.read() {
                        Ok(s) => on(Some(s.unwrap_or_default())),
                        Err(e) => {
                            log::warn!("reservations in {}: {e}", at.describe());
                            on(None)
                        }
                    }
                }
            }
        })?;
        Ok(())
    }

    fn describe(&self) -> String {
        self.at.describe()
    }
}
