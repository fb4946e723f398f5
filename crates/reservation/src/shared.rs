//! One volume's reservations in one process: the cached state every
//! command checks, and changes made through the [`Store`].

use crate::{Access, Event, Refusal, State, Store, EVENTS_KEPT};
use arc_swap::ArcSwap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

type ListenFn = Arc<dyn Fn(&Event) + Send + Sync>;

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
    /// Serialises this process's changes, and the cache's updates.
    changing: Mutex<()>,
    adopting: Mutex<()>,
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
            adopting: Mutex::new(()),
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
            next.seq = cur.seq + 1;
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

    /// Take `s` into the cache if it is newer, and hand its new notices to
    /// the listeners.
    fn adopt(&self, s: State) {
        let fresh = {
            let _one = self.adopting.lock().unwrap_or_else(|p| p.into_inner());
            let old = self.cache.load();
            if s.seq <= old.seq {
                return;
            }
            let fresh: Vec<Event> = s.events.iter().filter(|e| e.seq > old.seq).cloned().collect();
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

    /// Call `f` with every notice from now on (changes made here and
    /// elsewhere), until the returned guard drops.
    pub fn listen(self: &Arc<Self>, f: impl Fn(&Event) + Send + Sync + 'static) -> Listener {
        let token = self.next_listener.fetch_add(1, Ordering::Relaxed);
        self.listeners.lock().unwrap_or_else(|p| p.into_inner()).push((token, Arc::new(f)));
        Listener { shared: Arc::downgrade(self), token }
    }
}
