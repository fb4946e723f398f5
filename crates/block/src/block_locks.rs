//! Locks that keep a read-modify-write of a partial O_DIRECT block from
//! losing a concurrent write to the same block.
//!
//! With O_DIRECT the backend can only write whole 4 KiB blocks, but
//! initiators address 512-byte sectors: two writes to different sectors of
//! one block are independent for them, and both must survive. So a write
//! that patches a block (read, modify, write back) holds that block
//! exclusively, and every other write holds the blocks it covers shared.
//! Blocks map onto a fixed set of stripes; locks are taken in stripe order,
//! so two writes never deadlock.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

const STRIPES: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    None,
    Shared,
    Exclusive,
}

pub(crate) struct BlockLocks {
    block: u64,
    stripes: Box<[RwLock<()>]>,
}

/// Held for the duration of one write.
pub(crate) struct WriteGuard<'a> {
    _held: [Option<Held<'a>>; STRIPES],
}

enum Held<'a> {
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

impl BlockLocks {
    pub(crate) fn new(block: usize) -> Self {
        BlockLocks { block: block as u64, stripes: (0..STRIPES).map(|_| RwLock::new(())).collect() }
    }

    /// Lock the blocks of `[offset, offset + len)` for a write; `patch`: the
    /// write reads and rewrites its first and last blocks.
    pub(crate) fn write(&self, offset: u64, len: usize, patch: bool) -> WriteGuard<'_> {
        let mut modes = [Mode::None; STRIPES];
        if len > 0 {
            let first = offset / self.block;
            let last = (offset + len as u64 - 1) / self.block;
            let covered = (last - first + 1).min(STRIPES as u64);
            for b in first..first + covered {
                modes[(b % STRIPES as u64) as usize] = Mode::Shared;
            }
            if patch {
                modes[(first % STRIPES as u64) as usize] = Mode::Exclusive;
                modes[(last % STRIPES as u64) as usize] = Mode::Exclusive;
            }
        }
        let mut i = 0;
        WriteGuard {
            _held: std::array::from_fn(|_| {
                let l = &self.stripes[i];
                let m = modes[i];
                i += 1;
                match m {
                    Mode::None => None,
                    Mode::Shared => Some(Held::Shared(l.read().unwrap_or_else(|e| e.into_inner()))),
                    Mode::Exclusive => Some(Held::Exclusive(l.write().unwrap_or_else(|e| e.into_inner()))),
                }
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;

    #[test]
    fn patches_of_one_block_exclude_each_other_but_plain_writes_share() {
        let l = Arc::new(BlockLocks::new(4096));
        {
            let _a = l.write(0, 8192, false);
            let _b = l.write(4096, 4096, false); // shared with shared: no wait
        }
        let inside = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (l, inside, max) = (l.clone(), inside.clone(), max.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        // Sector t of block 3 (and a stripe alias of it, block 67).
                        let _g = l.write(3 * 4096 + t as u64 * 512 + if t % 2 == 0 { 0 } else { 64 * 4096 }, 512, true);
                        let n = inside.fetch_add(1, SeqCst) + 1;
                        max.fetch_max(n, SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(max.load(SeqCst), 1, "two patches of one stripe ran at once");
    }
}
