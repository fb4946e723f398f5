//! The run's record: `OUT/record.jsonl`, one JSON entry per line, only ever
//! appended to. Each start of the run writes a [`Entry::Start`], then per
//! case a [`Entry::Begin`], every sample, failure and iperf3 run as it is
//! measured, and a [`Entry::Done`] once the case is whole; a start that ends
//! by itself writes an [`Entry::End`]. A kill can cut the last line short
//! (a write interrupted by SIGKILL comes back short): reading stops at the
//! last whole line, and the next start cuts the file there before it
//! appends. Each line is on the disk before the next one is measured
//! (fdatasync), so a power cut loses at most the line being written.

use bw_lab_results::fs::FsSample;
use bw_lab_results::net::NetSample;
use bw_lab_results::{Failure, HostInfo, MachineInfo, Sample, Software, Subject};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The record's file name in the output directory.
pub const FILE: &str = "record.jsonl";

/// A start of the run: who ran it, where, on what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartEntry {
    pub n: u32,
    pub utc: String,
    pub pid: u32,
    pub boot_id: String,
    pub machine: MachineInfo,
    pub software: Software,
    /// The hosts of a run across machines, and their boot ids.
    #[serde(default)]
    pub hosts: Vec<HostInfo>,
    #[serde(default)]
    pub host_boots: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Entry {
    Start(StartEntry),
    /// A case (or a link's targets starting) begins.
    Begin { case: String },
    Sample(Sample),
    Fs(FsSample),
    Net(NetSample),
    Failure(Failure),
    /// The case begun last is whole.
    Done { case: String },
    /// The subjects' records as they are now (what the targets said of
    /// themselves, what was unavailable).
    Subjects(Vec<Subject>),
    /// The start ended by itself: `completed`, or why it stopped.
    End { how: String, ssh_commands: u64 },
}

/// The record file, open for appending.
pub struct Record {
    path: PathBuf,
    file: std::fs::File,
}

/// What reading a record found.
pub struct Read {
    pub entries: Vec<Entry>,
    /// Bytes after the last whole line (a line a kill cut short).
    pub torn_bytes: usize,
}

impl Record {
    /// A new record in `dir` (an earlier one there is replaced, unless a
    /// live run is writing it).
    pub fn create(dir: &Path) -> anyhow::Result<Record> {
        let path = dir.join(FILE);
        let file = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(&path).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        lock(&file, dir)?;
        file.set_len(0)?;
        Ok(Record { path, file })
    }

    /// The record in `dir`, read, and opened to append after its last
    /// whole line.
    pub fn reopen(dir: &Path) -> anyhow::Result<(Record, Read)> {
        let path = dir.join(FILE);
        let bytes = std::fs::read(&path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let read = parse(&bytes, &path)?;
        let whole = bytes.len() - read.torn_bytes;
        let file = std::fs::OpenOptions::new().write(true).open(&path)?;
        lock(&file, dir)?;
        file.set_len(whole as u64)?;
        let mut r = Record { path, file };
        r.file.sync_data()?;
        use std::io::Seek;
        r.file.seek(std::io::SeekFrom::End(0))?;
        Ok((r, read))
    }

    /// Append one entry, on the disk before this returns.
    pub fn append(&mut self, e: &Entry) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(e)?;
        line.push(b'\n');
        // One write: what a kill can leave is a shorter last line, never a
        // line with another's bytes in it.
        self.file.write_all(&line).map_err(|err| anyhow::anyhow!("writing {}: {err}", self.path.display()))?;
        self.file.sync_data().map_err(|err| anyhow::anyhow!("syncing {}: {err}", self.path.display()))?;
        Ok(())
    }
}

/// Hold the record's lock for as long as this run lives (the lock goes
/// with the process, however it ends): a second run writing the same
/// directory is refused.
fn lock(file: &std::fs::File, dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        anyhow::bail!("a lab run is writing to {} now: let it finish or stop it first", dir.display());
    }
    Ok(())
}

/// The entries of a record's bytes. The last line may be cut short (no
/// newline, or not whole JSON): it is left out and counted. A damaged line
/// before it is an error (that is not what a kill does).
pub fn parse(bytes: &[u8], path: &Path) -> anyhow::Result<Read> {
    let mut entries = vec![];
    let mut at = 0;
    let mut n = 0;
    while at < bytes.len() {
        n += 1;
        let Some(len) = bytes[at..].iter().position(|b| *b == b'\n') else {
            return Ok(Read { entries, torn_bytes: bytes.len() - at });
        };
        let line = &bytes[at..at + len];
        match serde_json::from_slice::<Entry>(line) {
            Ok(e) => entries.push(e),
            Err(e) if at + len + 1 == bytes.len() => {
                // The last line, whole in length but not in content: a write
                // cut short inside it. (Not expected: lines are one write.)
                log::warn!("{} line {n}: {e}: set aside", path.display());
                return Ok(Read { entries, torn_bytes: len + 1 });
            }
            Err(e) => anyhow::bail!("{} line {n} is damaged ({e}); the record cannot be read past it", path.display()),
        }
        at += len + 1;
    }
    Ok(Read { entries, torn_bytes: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("bwlab-record-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn failure(n: u32) -> Entry {
        Entry::Failure(Failure { subject: format!("s{n}-p").parse::<bw_lab_results::SubjectKey>().unwrap().into(), mtu: Some(1500), workload: "w".into(), reason: "r".into() })
    }

    /// A kill in the middle of a line's write: every whole line is read,
    /// the cut one is left out, and the next start appends after the last
    /// whole line, so the record reads whole again.
    #[test]
    fn a_line_cut_short_by_a_kill_is_set_aside_and_written_past() {
        let d = dir("torn");
        let mut r = Record::create(&d).unwrap();
        for n in 0..3 {
            r.append(&failure(n)).unwrap();
        }
        drop(r);
        let full = serde_json::to_vec(&failure(3)).unwrap();
        for cut in [1, full.len() / 2, full.len()] {
            let path = d.join(FILE);
            let mut bytes = std::fs::read(&path).unwrap();
            let keep = bytes.len();
            bytes.extend_from_slice(&full[..cut]);
            std::fs::write(&path, &bytes).unwrap();
            let (mut r, read) = Record::reopen(&d).unwrap();
            assert_eq!(read.entries.len(), 3, "cut at {cut}");
            assert_eq!(read.torn_bytes, cut);
            assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, keep, "not cut back to the last whole line");
            r.append(&failure(9)).unwrap();
            drop(r);
            let read = parse(&std::fs::read(&path).unwrap(), &path).unwrap();
            assert_eq!((read.entries.len(), read.torn_bytes), (4, 0));
            assert_eq!(read.entries[3], failure(9));
            // Back to three whole lines for the next cut.
            let (r, _) = Record::reopen(&d).unwrap();
            drop(r);
            let bytes = std::fs::read(&path).unwrap();
            std::fs::write(&path, &bytes[..keep]).unwrap();
        }
        // While one run writes it, no other may.
        let (held, _) = Record::reopen(&d).unwrap();
        assert!(Record::reopen(&d).is_err() && Record::create(&d).is_err(), "a second writer");
        drop(held);
        // A damaged line with whole lines after it is no kill's doing.
        let path = d.join(FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[3] = b'#';
        std::fs::write(&path, &bytes).unwrap();
        assert!(Record::reopen(&d).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
