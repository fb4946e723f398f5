//! One volume's reservations in one process: the cached state every
//! command checks, and changes made through the [`Store`].

use crate::{Access, Event, Refusal, State, Store, EVENTS_KEPT};
use arc_swap::ArcSwap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

type ListenFn = Arc<dyn Fn(&Event) + Send + Sync>;

/// Epochs a cache remembers having left: a watch delivers at most a few
/// states late.
const EPOCHS_REMEMBERED: usize = 16;

/// A random epoch, never 0.
fn new_epoch() -> u64 {
    loop {
        let mut b = [0u8; 8];
        // SAFETY: getrandom fills the buffer we own.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        let e = u64::from_ne_bytes(b);
        if n == 8 && e != 0 {
            return e;
        }
    }
}

pub struct Shared {
    store: Box<dyn Store>,
    /// The newest state this process knows; replaced whole.
    cache: ArcSwap<State>,
    /// True while a reservation is held: the one load a command makes
    /// when there is none.
    held: AtomicBool,
    /// The store cannot promise to tell us of others' changes (a lost
    /// watch): every check reads the store until it can again.
    stale: AtomicBool,
    /// Serialises this process's changes.
    changing: Mutex<()>,
    /// Serialises the cache's updates; holds the epochs this cache has
    /// left behind (see [`Shared::adopt`]).
    adopting: Mutex<VecDeque<u64>>,
    listeners: Mutex<Vec<(u64, ListenFn)>>,
    next_listener: AtomicU64,
}

/// A registered listener; dropping it unregisters.
pub struct Listener {
    shared: Weak<Shared>,
    token: u64,
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(s) = self.shared.upgrade() {
            s.listeners.lock().unwrap_or_else(|p| p.into_inner()).retain(|(t, _)| *t != self.token);
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shared({}, seq {})", self.store.describe(), self.cache.load().seq)
    }
}

impl Shared {
    /// Read the stored state and start watching for others' changes.
    pub fn open(store: Box<dyn Store>) -> io::Result<Arc<Shared>> {
        let first = store.load()?.unwrap_or_default();
        let shared = Arc::new(Shared {
            held: AtomicBool::new(first.holder.is_some()),
            cache: ArcSwap::from_pointee(first),
            store,
            stale: AtomicBool::new(false),
            changing: Mutex::new(()),
            adopting: Mutex::new(VecDeque::new()),
            listeners: Mutex::new(Vec::new()),
            next_listener: AtomicU64::new(1),
        });
        let weak = Arc::downgrade(&shared);
        shared.store.watch(Arc::new(move |s: Option<State>| {
            let Some(me) = weak.upgrade() else { return };
            match s {
                Some(s) => {
                    me.adopt(s);
                    me.stale.store(false, Ordering::Release);
                }
                None => me.stale.store(true, Ordering::Release),
            }
        }))?;
        Ok(shared)
    }

    /// In memory only.
    pub fn in_memory() -> Arc<Shared> {
        Shared::open(Box::<crate::MemoryStore>::default()).expect("a memory store cannot fail")
    }

    pub fn describe(&self) -> String {
        self.store.describe()
    }

    /// Whether a reservation is held (as far as this process knows).
    #[inline]
    pub fn held(&self) -> bool {
        self.stale.load(Ordering::Acquire) || self.held.load(Ordering::Acquire)
    }

    /// Whether registrant `id` may `access` the medium now. Without a
    /// reservation this is one atomic load; with one, a look at the cached
    /// state; only while the store cannot tell us of changes does it read
    /// the store (and if that fails, it refuses: a gateway that cannot
    /// know must not let a fenced host write).
    pub fn allows(&self, id: u64, access: Access) -> bool {
        if self.stale.load(Ordering::Acquire) {
            match self.read() {
                Ok(s) => return s.allows(id, access),
                Err(e) => {
                    log::warn!("reservations of {}: cannot read them: {e}; refusing access", self.describe());
                    return false;
                }
            }
        }
        if !self.held.load(Ordering::Acquire) {
            return true;
        }
        self.cache.load().allows(id, access)
    }

    /// The state as the store has it now.
    pub fn read(&self) -> io::Result<Arc<State>> {
        let s = self.store.load()?.unwrap_or_default();
        self.adopt(s);
        Ok(self.cache.load_full())
    }

    /// The cached state (no I/O).
    pub fn cached(&self) -> Arc<State> {
        self.cache.load_full()
    }

    /// Make a change: `op` runs on the stored state (again, if another
    /// gateway changed it in between); what it changed is stored, published
    /// to the other gateways and taken into the cache before this returns,
    /// and its notices go to the listeners. `op`'s refusal changes nothing.
    pub fn change<R>(&self, op: impl Fn(&mut State) -> Result<R, Refusal>) -> io::Result<Result<R, Refusal>> {
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..1000 {
            let cur = self.store.load()?.unwrap_or_default();
            let mut next = cur.clone();
            let r = match op(&mut next) {
                Ok(r) => r,
                Err(refused) => {
                    self.adopt(cur);
                    return Ok(Err(refused));
                }
            };
            if next == cur {
                self.adopt(cur);
                return Ok(Ok(r));
            }
            match cur.seq.checked_add(1) {
                Some(seq) if cur.epoch != 0 => next.seq = seq,
                // A first change, or one past the counter's maximum: a new
                // epoch, which every cache adopts whatever its seq, with
                // only this change's notices.
                _ => {
                    next.epoch = new_epoch();
                    next.seq = 1;
                    next.events.retain(|e| e.seq == 0);
                }
            }
            for e in next.events.iter_mut().filter(|e| e.seq == 0) {
                e.seq = next.seq;
            }
            let extra = next.events.len().saturating_sub(EVENTS_KEPT);
            next.events.drain(..extra);
            if !self.store.replace(cur.seq, &next)? {
                continue; // another gateway changed it first: again, on theirs
            }
            if let Err(e) = self.store.publish(&next) {
                log::warn!("reservations of {}: change {} stored, but not every gateway acknowledged it: {e}", self.describe(), next.seq);
            }
            self.adopt(next);
            return Ok(Ok(r));
        }
        Err(io::Error::other(format!("reservations of {}: the state kept changing under 1000 attempts", self.describe())))
    }

    /// Take `s` into the cache unless it is one the cache has moved past,
    /// and hand its new notices to the listeners. Within an epoch a larger
    /// seq is newer (a watch may deliver an older state after this process
    /// stored a newer one); a state of another epoch is adopted whatever
    /// its seq (the store was started again, or the counter passed its
    /// maximum), unless it is of an epoch this cache left (a late delivery).
    /// Epoch 0 (nothing stored) is never left behind: a store emptied
    /// under a cache empties it.
    fn adopt(&self, s: State) {
        let fresh = {
            let mut left = self.adopting.lock().unwrap_or_else(|p| p.into_inner());
            let old = self.cache.load();
            let same_epoch = s.epoch == old.epoch;
            if (same_epoch && s.seq <= old.seq) || (!same_epoch && left.contains(&s.epoch)) {
                return;
            }
            if !same_epoch && old.epoch != 0 {
                left.push_back(old.epoch);
                if left.len() > EPOCHS_REMEMBERED {
                    left.pop_front();
                }
            }
            let fresh: Vec<Event> = s.events.iter().filter(|e| !same_epoch || e.seq > old.seq).cloned().collect();
            self.held.store(s.holder.is_some(), Ordering::Release);
            self.cache.store(Arc::new(s));
            fresh
        };
        if fresh.is_empty() {
            return;
        }
        let listeners: Vec<ListenFn> = self.listeners.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(_, f)| f.clone()).collect();
        for e in &fresh {
            for f in &listeners {
                f(e);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn adopt_for_test(&self, s: State) {
        self.adopt(s)
    }

    /// Call `f` with every notice from now on (changes made here and
    /// elsewhere), until the returned guard drops.
    pub fn listen(self: &Arc<Self>, f: impl Fn(&Event) + Send + Sync + 'static) -> Listener {
        let token = self.next_listener.fetch_add(1, Ordering::Relaxed);
        self.listeners.lock().unwrap_or_else(|p| p.into_inner()).push((token, Arc::new(f)));
        Listener { shared: Arc::downgrade(self), token }
    }
}
