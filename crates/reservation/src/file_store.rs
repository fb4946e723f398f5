//! Reservations of a file volume, kept beside the file: `FILE.pr` holds the
//! state (JSON, replaced by rename), `FILE.pr.lock` is flock()ed around
//! each compare-and-swap, so several processes on one host that serve the
//! same file agree. Each process learns of the others' changes through
//! inotify on the directory.

use crate::{State, Store};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct FileStore {
    state: PathBuf,
    lock: PathBuf,
    /// Written to end the inotify thread.
    stop: std::sync::Mutex<Option<OwnedFd>>,
}

impl FileStore {
    /// The store beside `volume_file`.
    pub fn beside(volume_file: &Path) -> FileStore {
        let mut state = volume_file.as_os_str().to_owned();
        state.push(".pr");
        let state = PathBuf::from(state);
        let mut lock = state.as_os_str().to_owned();
        lock.push(".lock");
        FileStore { state, lock: PathBuf::from(lock), stop: Default::default() }
    }

    /// Remove the store beside `volume_file` (state and lock file), as the
    /// volume's deletion does: a new volume of the same name must not
    /// inherit the old one's registrations and holder. Missing is fine.
    pub fn remove_beside(volume_file: &Path) -> io::Result<()> {
        let s = FileStore::beside(volume_file);
        for p in [&s.state, &s.lock] {
            match std::fs::remove_file(p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.state
    }

    fn read(path: &Path) -> io::Result<Option<State>> {
        match std::fs::read(path) {
            Ok(b) => State::decode(&b).map(Some),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
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

impl Locked {
    fn take(path: &Path) -> io::Result<Locked> {
        let f = OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
        // SAFETY: flock on an open descriptor.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Locked(f))
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

impl Store for FileStore {
    fn load(&self) -> io::Result<Option<State>> {
        FileStore::read(&self.state)
    }

    fn replace(&self, expected: u64, new: &State) -> io::Result<bool> {
        let _l = Locked::take(&self.lock)?;
        if FileStore::read(&self.state)?.map_or(0, |s| s.seq) != expected {
            return Ok(false);
        }
        let mut tmp = self.state.as_os_str().to_owned();
        tmp.push(format!(".tmp{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let mut f = File::create(&tmp)?;
        f.write_all(&new.encode())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.state)?;
        if let Some(dir) = self.state.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        Ok(true)
    }

    fn watch(&self, on: Arc<dyn Fn(Option<State>) + Send + Sync>) -> io::Result<()> {
        let dir = match self.state.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(d) => d.to_path_buf(),
            None => PathBuf::from("."),
        };
        let name = self.state.file_name().map(|n| n.as_bytes().to_vec()).unwrap_or_default();
        // SAFETY: plain syscalls; the descriptors are owned right away.
        let ino = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        if ino < 0 {
            return Err(io::Error::last_os_error());
        }
        let ino = unsafe { OwnedFd::from_raw_fd(ino) };
        let cdir = CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::Error::other("NUL in path"))?;
        if unsafe { libc::inotify_add_watch(ino.as_raw_fd(), cdir.as_ptr(), libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE) } < 0 {
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
        let path = self.state.clone();
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
                let mut at = 0usize;
                let mut ours = false;
                while at + 16 <= n as usize {
                    let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().expect("4 bytes")) as usize;
                    let ev_name = &buf[at + 16..(at + 16 + len).min(n as usize)];
                    let ev_name = &ev_name[..ev_name.iter().position(|&b| b == 0).unwrap_or(ev_name.len())];
                    ours |= ev_name == name.as_slice();
                    at += 16 + len;
                }
                if ours {
                    match FileStore::read(&path) {
                        Ok(Some(s)) => on(Some(s)),
                        Ok(None) => {}
                        Err(e) => {
                            log::warn!("reservations in {}: {e}", path.display());
                            on(None)
                        }
                    }
                }
            }
        })?;
        Ok(())
    }

    fn describe(&self) -> String {
        self.state.display().to_string()
    }
}
