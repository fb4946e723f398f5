//! How callers of the TCP initiators (iSCSI, NVMe/TCP) wait for their
//! commands: a mailbox per command in flight, reused, that the reader task
//! fills and wakes, and one timer per session or queue armed for the
//! earliest deadline. Per command this allocates nothing and registers no
//! timer: a oneshot channel and a `tokio::time::timeout` per command (the
//! NVMe/TCP initiator's before) cost an allocation, a free and a timer
//! wheel entry each (docs/notes/2026-11-26-floor-3.md).

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;

/// Where one command's result waits for its caller.
struct Mailbox<R> {
    result: Option<R>,
    waker: Option<Waker>,
}

/// The mailboxes of a session's (or queue's) commands, kept under the
/// same lock as its protocol state.
pub(crate) struct Mailboxes<R> {
    boxes: Vec<Mailbox<R>>,
    /// Mailboxes no command uses.
    free: Vec<usize>,
}

impl<R> Default for Mailboxes<R> {
    fn default() -> Self {
        Mailboxes { boxes: Vec::new(), free: Vec::new() }
    }
}

impl<R> Mailboxes<R> {
    /// A mailbox for a new command.
    pub fn open(&mut self) -> usize {
        self.free.pop().unwrap_or_else(|| {
            self.boxes.push(Mailbox { result: None, waker: None });
            self.boxes.len() - 1
        })
    }

    /// A mailbox for a new command whose caller `waker` wakes (see
    /// [`InFlight::wait`]).
    pub fn open_for(&mut self, waker: Waker) -> usize {
        let m = self.open();
        self.boxes[m].waker = Some(waker);
        m
    }

    /// The command of mailbox `m` is over (or its caller gave up).
    pub fn release(&mut self, m: usize) {
        let b = &mut self.boxes[m];
        b.result = None;
        b.waker = None;
        self.free.push(m);
    }

    /// The command of mailbox `m` finished: keep its result and wake its
    /// caller.
    pub fn post(&mut self, m: usize, r: R) {
        let b = &mut self.boxes[m];
        b.result = Some(r);
        if let Some(k) = b.waker.take() {
            k.wake();
        }
    }

    /// The result, once there (the mailbox is then released), else the
    /// caller's waker is kept for [`Mailboxes::post`].
    pub fn poll(&mut self, m: usize, cx: &mut Context<'_>) -> Poll<R> {
        let b = &mut self.boxes[m];
        if let Some(r) = b.result.take() {
            self.release(m);
            return Poll::Ready(r);
        }
        if !b.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            b.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// A session (or queue) whose callers wait in [`Mailboxes`] kept under
/// its lock with its protocol state.
pub(crate) trait Waits {
    type Result;
    /// What its state machine names a command by.
    type Ticket: Copy;
    /// Poll mailbox `m` under the lock (see [`Mailboxes::poll`]).
    fn poll_mailbox(&self, m: usize, cx: &mut Context<'_>) -> Poll<Self::Result>;
    /// The caller of `t` gave up: take its command (and the buffer it
    /// would write to) out of the state machine and release mailbox `m`,
    /// both under the lock.
    fn cancel(&self, t: Self::Ticket, m: usize);
}

/// One command between its submission and its result. Dropped early (its
/// caller gave up), it takes the command out of the session first: a
/// buffer that is going away is never written again.
pub(crate) struct InFlight<'a, S: Waits> {
    sh: &'a S,
    ticket: S::Ticket,
    mailbox: usize,
    finished: bool,
}

impl<'a, S: Waits> InFlight<'a, S> {
    pub fn new(sh: &'a S, ticket: S::Ticket, mailbox: usize) -> Self {
        InFlight { sh, ticket, mailbox, finished: false }
    }

    /// The command's result. The caller's waker is already in the mailbox
    /// ([`Mailboxes::open_for`], in the critical section that submitted
    /// the command), so the first poll, in the same poll of the caller's
    /// task as the submission, returns at once without the lock: the
    /// result cannot be there unless the reader posted it since, and then
    /// it woke that waker. Polling the fresh mailbox took the lock a second
    /// time per command (~90 instructions of ~3,900 per 4 KiB QD32 read,
    /// docs/notes/2026-11-26-floor-6.md).
    pub async fn wait(mut self) -> S::Result {
        let mut first = true;
        std::future::poll_fn(|cx| {
            if std::mem::take(&mut first) {
                return Poll::Pending;
            }
            let r = self.sh.poll_mailbox(self.mailbox, cx);
            self.finished = r.is_ready();
            r
        })
        .await
    }
}

/// The waker of the task that awaits this: for [`Mailboxes::open_for`].
pub(crate) async fn own_waker() -> Waker {
    std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await
}

impl<S: Waits> Drop for InFlight<'_, S> {
    fn drop(&mut self) {
        if !self.finished {
            self.sh.cancel(self.ticket, self.mailbox);
        }
    }
}

/// The commands a session or queue may have in flight: a count of free
/// slots, and a [`Notify`] that only callers who found none wait on. A
/// tokio `Semaphore` releases a permit under its waiters' lock even when no
/// one waits: ~84 instructions per command of the ~3,900 the NVMe/TCP
/// initiator spent per 4 KiB QD32 read (callgrind,
/// docs/notes/2026-11-26-floor-6.md); here a release with no one waiting is
/// two atomic operations.
pub(crate) struct Slots {
    free: AtomicUsize,
    /// Callers registered on `freed` (or about to look again).
    waiting: AtomicUsize,
    freed: Notify,
}

/// One slot of [`Slots`], given back when dropped.
pub(crate) struct Slot<'a>(&'a Slots);

impl Slots {
    pub fn new(n: usize) -> Slots {
        Slots { free: AtomicUsize::new(n), waiting: AtomicUsize::new(0), freed: Notify::new() }
    }

    fn try_take(&self) -> Option<Slot<'_>> {
        let mut n = self.free.load(Ordering::SeqCst);
        while n > 0 {
            match self.free.compare_exchange_weak(n, n - 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some(Slot(self)),
                Err(now) => n = now,
            }
        }
        None
    }

    /// A free slot, once there is one. Cancel-safe: a caller that gives up
    /// while waiting holds no slot, and a wake it had been given goes on to
    /// another waiter (tokio's `Notified` passes a `notify_one` it did not
    /// consume on when dropped).
    pub async fn take(&self) -> Slot<'_> {
        if let Some(s) = self.try_take() {
            return s;
        }
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            // Registered before it is counted: a release that sees the
            // count wakes it. Counted before the second look: a release
            // that did not see the count made its slot free before that
            // look (both SeqCst), so the look finds it.
            notified.as_mut().enable();
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let _counted = Uncount(&self.waiting);
            if let Some(s) = self.try_take() {
                return s;
            }
            notified.await;
            if let Some(s) = self.try_take() {
                return s;
            }
            // Another caller took the freed slot first: wait again.
        }
    }

    fn give_back(&self) {
        self.free.fetch_add(1, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.freed.notify_one();
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

/// Takes one off a waiting count when dropped (the wait ended or was
/// cancelled).
struct Uncount<'a>(&'a AtomicUsize);

impl Drop for Uncount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where a command's deadline counts from: the kernel's coarse monotonic
/// clock (the time of the last tick, read without the TSC), moved onto
/// `Instant`'s scale and rounded up, so that a deadline is never early and
/// at most a few ticks (a few ms against seconds of timeout) late. The
/// precise clock read per command was 1.5% of the NVMe/TCP initiator's CPU
/// at 4 KiB QD32 (`perf`, docs/notes/2026-11-26-floor-4.md). Kept under
/// the session's lock: the coarse clock moves once a tick (1-4 ms), and
/// every command of that tick gets the `Instant` worked out for its first
/// (moving the reading onto `Instant`'s scale cost ~60 of the ~110
/// instructions per command, docs/notes/2026-11-27-h51k-client.md).
pub(crate) struct SubmitClock {
    /// An `Instant` read just after `base_coarse`.
    base: Instant,
    base_coarse: Duration,
    /// Whole ticks added to every reading (see [`SubmitClock::now_or_later`]).
    margin: Duration,
    /// The last coarse reading (seconds, nanoseconds) and what
    /// [`SubmitClock::now_or_later`] made of it.
    last: Option<((i64, i64), Instant)>,
}

/// The coarse clock as (seconds, nanoseconds).
fn coarse_raw() -> Option<(i64, i64)> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a timespec to write.
    (unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } == 0).then_some((ts.tv_sec, ts.tv_nsec))
}

fn coarse() -> Option<Duration> {
    coarse_raw().map(|(s, ns)| Duration::new(s as u64, ns as u32))
}

impl SubmitClock {
    pub fn new() -> SubmitClock {
        let mut res = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid clock id and a timespec to write.
        let tick = if unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut res) } == 0 {
            Duration::new(res.tv_sec as u64, res.tv_nsec as u32)
        } else {
            Duration::ZERO
        };
        let base_coarse = coarse().unwrap_or_default();
        SubmitClock { base: Instant::now(), base_coarse, margin: 2 * tick, last: None }
    }

    /// An instant no earlier than now. The coarse clock lags the precise
    /// one by less than a tick, at `base_coarse` as at every reading, and
    /// `base` was read after `base_coarse`: so `base + (coarse - base_coarse)`
    /// is less than a tick early at worst, and one tick of margin makes it
    /// never early (two are kept). Without the coarse clock (clock_getres
    /// or clock_gettime failing), the precise one. The same coarse reading
    /// gives the same instant, worked out once.
    pub fn now_or_later(&mut self) -> Instant {
        match coarse_raw() {
            Some(raw) if !self.margin.is_zero() => match self.last {
                Some((at, then)) if at == raw => then,
                _ => {
                    let c = Duration::new(raw.0 as u64, raw.1 as u32);
                    let then = self.base + c.saturating_sub(self.base_coarse) + self.margin;
                    self.last = Some((raw, then));
                    then
                }
            },
            _ => Instant::now(),
        }
    }
}

/// A session's (or queue's) deadlines, for [`timer_loop`].
pub(crate) trait Deadlines: Send + Sync + 'static {
    /// The earliest deadline of a command in flight; `Err(())` once the
    /// session is dead (the timer ends).
    fn next_deadline(&self) -> Result<Option<Instant>, ()>;
    /// Time passed: fail what is late and hand it to its callers.
    fn expire(&self, now: Instant);
}

/// Fail commands whose time is up: one timer for the whole session, armed
/// for its earliest deadline.
pub(crate) async fn timer_loop<S: Deadlines>(sh: Arc<S>, timeout: Duration) {
    loop {
        let Ok(next) = sh.next_deadline() else { return };
        // With nothing in flight, a command submitted from now on is due
        // after this.
        let next = next.unwrap_or_else(|| Instant::now() + timeout);
        tokio::time::sleep_until(next.into()).await;
        sh.expire(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A deadline counted from the coarse clock is never early: every
    /// reading is at or after a precise reading taken before it.
    #[test]
    fn the_submit_clock_is_never_behind_the_precise_one() {
        let mut c = SubmitClock::new();
        assert!(!c.margin.is_zero(), "this kernel has a coarse monotonic clock");
        let end = Instant::now() + Duration::from_millis(50);
        let mut n = 0u64;
        loop {
            let before = Instant::now();
            let ours = c.now_or_later();
            assert!(ours >= before, "{:?} early", before - ours);
            n += 1;
            if before > end {
                break;
            }
        }
        assert!(n > 1000);
    }

    /// A full queue: a caller waiting for a slot is woken when one frees;
    /// one that gives up after its wake passes the wake on, and no slot is
    /// lost either way.
    #[test]
    fn a_freed_slot_wakes_a_waiter_and_a_cancelled_waiter_loses_none() {
        use std::future::Future;
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let slots = Slots::new(2);
        let take = || Box::pin(slots.take());
        let (Poll::Ready(a), Poll::Ready(b)) = (take().as_mut().poll(&mut cx), take().as_mut().poll(&mut cx)) else {
            panic!("two free slots")
        };
        let (mut w1, mut w2, mut w3) = (take(), take(), take());
        assert!(w1.as_mut().poll(&mut cx).is_pending(), "the queue is full");
        assert!(w2.as_mut().poll(&mut cx).is_pending());
        assert!(w3.as_mut().poll(&mut cx).is_pending());
        // A waiter that gives up before any slot frees.
        drop(w3);
        assert_eq!(slots.waiting.load(Ordering::SeqCst), 2);
        drop(a);
        assert_eq!(woken.0.load(Ordering::Relaxed), 1, "a freed slot wakes a waiter");
        // The woken waiter gives up: its wake goes to the next one.
        drop(w1);
        assert_eq!(woken.0.load(Ordering::Relaxed), 2, "the wake was passed on");
        let Poll::Ready(c) = w2.as_mut().poll(&mut cx) else { panic!("the freed slot was lost") };
        drop((b, c, w2));
        assert_eq!(slots.free.load(Ordering::SeqCst), 2, "every slot is back");
        assert_eq!(slots.waiting.load(Ordering::SeqCst), 0);
    }

    /// A session for [`InFlight`]: its mailboxes, the lock's takes and the
    /// tickets cancelled.
    #[derive(Default)]
    struct Fake {
        m: std::sync::Mutex<Mailboxes<u32>>,
        locks: AtomicUsize,
        cancelled: std::sync::Mutex<Vec<u32>>,
    }
    impl Waits for Fake {
        type Result = u32;
        type Ticket = u32;
        fn poll_mailbox(&self, m: usize, cx: &mut Context<'_>) -> Poll<u32> {
            self.locks.fetch_add(1, Ordering::Relaxed);
            self.m.lock().unwrap().poll(m, cx)
        }
        fn cancel(&self, t: u32, m: usize) {
            self.cancelled.lock().unwrap().push(t);
            self.m.lock().unwrap().release(m);
        }
    }

    /// The waker goes in with the submission: the wait's first poll takes
    /// no lock, a posted result wakes the caller and reaches it, and a
    /// caller that gives up after its first poll cancels its command and
    /// frees its mailbox.
    #[test]
    fn a_waiter_registered_at_submission_is_woken_and_a_dropped_one_cancels() {
        use std::future::Future;
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let fake = Fake::default();
        let submit = |ticket: u32| {
            let fake = &fake;
            Box::pin(async move {
                let waker = own_waker().await;
                let mailbox = fake.m.lock().unwrap().open_for(waker);
                (mailbox, InFlight::new(fake, ticket, mailbox).wait().await)
            })
        };
        let mut a = submit(1);
        assert!(a.as_mut().poll(&mut cx).is_pending());
        assert_eq!(fake.locks.load(Ordering::Relaxed), 0, "the first poll took the lock");
        fake.m.lock().unwrap().post(0, 7);
        assert_eq!(woken.0.load(Ordering::Relaxed), 1, "the posted result woke its caller");
        assert_eq!(a.as_mut().poll(&mut cx), Poll::Ready((0, 7)));
        let mut b = submit(2);
        assert!(b.as_mut().poll(&mut cx).is_pending());
        drop(b);
        assert_eq!(*fake.cancelled.lock().unwrap(), vec![2], "the dropped command was cancelled");
        assert_eq!(fake.m.lock().unwrap().open(), 0, "its mailbox is free again");
    }

    #[test]
    fn a_result_reaches_its_caller_once_and_the_mailbox_is_reused() {
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut m = Mailboxes::<u32>::default();
        let (a, b) = (m.open(), m.open());
        assert_ne!(a, b);
        assert!(m.poll(a, &mut cx).is_pending());
        m.post(a, 7);
        assert_eq!(woken.0.load(Ordering::Relaxed), 1);
        assert_eq!(m.poll(a, &mut cx), Poll::Ready(7));
        // Released on delivery: the next command gets it, empty.
        let c = m.open();
        assert_eq!(c, a);
        assert!(m.poll(c, &mut cx).is_pending());
        // A caller that gave up: its result is gone with it.
        m.post(b, 9);
        m.release(b);
        let d = m.open();
        assert_eq!(d, b);
        assert!(m.poll(d, &mut cx).is_pending());
    }
}
