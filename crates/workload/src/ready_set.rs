//! A fixed set of futures polled inside one task, each only when its own
//! waker fired: the bench's workers of one job. `FuturesUnordered` did the
//! same at ~170 client instructions per 4 KiB QD32 I/O (its ready queue of
//! reference-counted task nodes, a poll guard per poll, `AtomicWaker`
//! wakes; callgrind, docs/notes/2026-11-27-h51w-client.md); a set whose
//! members never change needs only a bit per member.

use futures::task::AtomicWaker;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Which members were woken since the set last polled them, and the task
/// that polls the set.
struct Ready {
    bits: Vec<AtomicU64>,
    task: AtomicWaker,
}

/// One member's waker: sets its bit, then wakes the set's task.
struct MemberWaker {
    ready: Arc<Ready>,
    i: usize,
}

impl Wake for MemberWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.bits[self.i / 64].fetch_or(1 << (self.i % 64), Ordering::AcqRel);
        self.ready.task.wake();
    }
}

/// Members one pass polls at most before the set's task yields, unless
/// the bench is told otherwise (`BenchParams::submit_batch`).
///
/// Why yield at all: a member's poll submits its next request, and the
/// client sends what was submitted only when its own task runs, after
/// this one yields. Polled all at once, the 32 members a burst of
/// completions woke submitted 32 requests that left in one send after
/// ~30 µs of client work, and on the AMD Zen 3 machines of sessions 14-20
/// the target then slept while the client worked, and the client while the
/// target did: 40-50% idle at 4 KiB QD32 over NVMe/TCP and iSCSI at MTU
/// 9000. There four at a time was best (idle 7-22%, IOPS x1.3-2.0 against
/// all; eight left the machine 24-34% idle, docs/notes/2026-11-28-merges-18.md).
/// On the AMD Zen 2 machine of sessions 21-22 the pair does not fall into
/// turns: eight (which the scheduler turns into sends of ~16, two passes
/// per send) against four, `bench/tcp-floor` A/B, 3 interleaved rounds,
/// reads and writes at MTU 1500 and 9000: client CPU per request x0.81-0.90,
/// target x0.84-0.99, IOPS x1.00-1.24, under cubic and under BBR alike;
/// sixteen and all (32) the same as eight within noise
/// (docs/notes/2026-11-29-merges-22.md). Eight is the default as the
/// smallest pass with the whole gain here; `blockwire bench
/// --submit-batch 4` is session 18's choice, for machines like those.
/// fio too sends each request as it is queued unless told to batch
/// (`iodepth_batch_submit`, 1 by default).
pub const DEFAULT_SUBMIT_BATCH: usize = 8;

pub(crate) struct ReadySet<F: Future> {
    /// `None` once finished.
    members: Vec<Option<Pin<Box<F>>>>,
    wakers: Vec<Waker>,
    ready: Arc<Ready>,
    /// Members taken from `ready` and not yet polled: all of them are
    /// polled before any woken since, so no member waits behind others
    /// woken again and again.
    taken: Vec<u64>,
    live: usize,
    /// Members one pass polls at most.
    pass: usize,
}

impl<F: Future> ReadySet<F> {
    /// The set of `futures`, polled at most `pass` (at least 1) per pass.
    pub(crate) fn new(futures: impl IntoIterator<Item = F>, pass: usize) -> Self {
        let members: Vec<_> = futures.into_iter().map(|f| Some(Box::pin(f))).collect();
        let n = members.len();
        // Every member is polled once to start.
        let bits = (0..n.div_ceil(64)).map(|w| AtomicU64::new(if (w + 1) * 64 <= n { u64::MAX } else { (1 << (n % 64)) - 1 })).collect();
        let ready = Arc::new(Ready { bits, task: AtomicWaker::new() });
        let wakers = (0..n).map(|i| Waker::from(Arc::new(MemberWaker { ready: ready.clone(), i }))).collect();
        let taken = vec![0; n.div_ceil(64)];
        ReadySet { members, wakers, ready, taken, live: n, pass: pass.max(1) }
    }

    /// Run every member to its end, handing each output to `done` as it
    /// comes.
    pub(crate) async fn run(mut self, mut done: impl FnMut(F::Output)) {
        std::future::poll_fn(|cx| self.poll_woken(cx, &mut done)).await
    }

    /// One pass: up to `pass` of the members woken and not yet
    /// polled, oldest wakes first: those taken are all polled before the
    /// set takes the wakes that came since. A pass that leaves members
    /// unpolled wakes the task itself, so the task yields between passes;
    /// a pass that polled them all takes the wakes again before it waits,
    /// so no wake is left behind in the bits: one that came while the
    /// task was already woken (for the rest of a pass) has no wake of its
    /// own to come back for.
    fn poll_woken(&mut self, cx: &mut Context<'_>, done: &mut impl FnMut(F::Output)) -> Poll<()> {
        self.ready.task.register(cx.waker());
        let mut polled = 0;
        loop {
            if self.taken.iter().all(|&b| b == 0) {
                let mut any = 0;
                for (t, r) in self.taken.iter_mut().zip(&self.ready.bits) {
                    *t = r.swap(0, Ordering::AcqRel);
                    any |= *t;
                }
                if any == 0 {
                    break;
                }
            }
            for w in 0..self.taken.len() {
                while self.taken[w] != 0 {
                    if polled == self.pass {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    let i = w * 64 + self.taken[w].trailing_zeros() as usize;
                    self.taken[w] &= self.taken[w] - 1;
                    let Some(f) = self.members[i].as_mut() else { continue };
                    polled += 1;
                    if let Poll::Ready(out) = f.as_mut().poll(&mut Context::from_waker(&self.wakers[i])) {
                        self.members[i] = None;
                        self.live -= 1;
                        done(out);
                    }
                }
            }
        }
        if self.live == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 70 members (two words of bits), finished in an order of the
    /// test's choosing by their own wakes, one with an error: every output
    /// is handed over once, and the set ends only after the last.
    #[tokio::test]
    async fn a_set_runs_every_member_to_its_end_whatever_the_order() {
        let mut txs = Vec::new();
        let set = ReadySet::new((0..70u32).map(|i| {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            txs.push(tx);
            async move {
                rx.await.unwrap();
                if i == 41 {
                    Err(format!("member {i} failed"))
                } else {
                    Ok(i)
                }
            }
        }), DEFAULT_SUBMIT_BATCH);
        let run = tokio::spawn(async move {
            let mut outs = Vec::new();
            set.run(|o| outs.push(o)).await;
            outs
        });
        tokio::task::yield_now().await;
        // Odd members first, from the end, then the even ones.
        let order: Vec<usize> = (0..70).rev().filter(|i| i % 2 == 1).chain((0..70).filter(|i| i % 2 == 0)).collect();
        let mut txs: Vec<Option<_>> = txs.into_iter().map(Some).collect();
        for i in order {
            txs[i].take().unwrap().send(()).unwrap();
            if i % 7 == 0 {
                tokio::task::yield_now().await;
            }
        }
        let outs = run.await.unwrap();
        assert_eq!(outs.len(), 70);
        let mut ok: Vec<u32> = outs.iter().filter_map(|o| o.as_ref().ok().copied()).collect();
        ok.sort();
        assert_eq!(ok, (0..70).filter(|&i| i != 41).collect::<Vec<_>>());
        assert_eq!(outs.iter().filter(|o| o.is_err()).count(), 1);
    }

    /// Logs each poll of member `i`; never ends.
    struct Probe {
        i: usize,
        log: Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl Future for Probe {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.log.lock().unwrap().push(self.i);
            Poll::Pending
        }
    }

    struct CountWakes(std::sync::atomic::AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A pass polls at most `pass` members and wakes its task to
    /// come back for the rest; members taken together are all polled
    /// before one woken since, however often it is woken again.
    #[test]
    fn a_pass_polls_a_few_and_the_oldest_wakes_go_first() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        const PASS: usize = 3;
        let n = 2 * PASS + 2;
        let mut set = ReadySet::new((0..n).map(|i| Probe { i, log: log.clone() }), PASS);
        let task = Arc::new(CountWakes(Default::default()));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let mut pass = |set: &mut ReadySet<Probe>| {
            log.lock().unwrap().clear();
            assert!(set.poll_woken(&mut cx, &mut |()| {}).is_pending());
            std::mem::take(&mut *log.lock().unwrap())
        };
        // Every member starts woken: the first pass takes the first few.
        assert_eq!(pass(&mut set), (0..PASS).collect::<Vec<_>>());
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "the pass woke its task for the rest");
        // Member 0 is woken again, twice: it waits for the rest of its
        // generation.
        set.wakers[0].wake_by_ref();
        set.wakers[0].wake_by_ref();
        assert_eq!(pass(&mut set), (PASS..2 * PASS).collect::<Vec<_>>());
        // The generation ends within this pass, which then takes member
        // 0's wake, once.
        assert_eq!(pass(&mut set), (2 * PASS..n).chain([0]).collect::<Vec<_>>());
        assert_eq!(pass(&mut set), Vec::<usize>::new(), "nothing woken, nothing polled");
    }

    /// Member `i` ends once `open[i]` is set.
    struct Gate {
        i: usize,
        open: Arc<[std::sync::atomic::AtomicBool; 3]>,
    }

    impl Future for Gate {
        type Output = usize;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<usize> {
            if self.open[self.i].load(Ordering::Relaxed) { Poll::Ready(self.i) } else { Poll::Pending }
        }
    }

    /// A task's wakes coalesce, as a runtime's do: woken again before it
    /// runs, it runs once.
    struct Flag(std::sync::atomic::AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// A member woken while its task was already woken to finish a pass
    /// is polled without another wake: the set takes the wakes again
    /// before it waits. (Before, the pass that finished the others
    /// returned with member 2's wake in the bits and no wake to come: the
    /// set never ended.)
    #[test]
    fn a_wake_that_comes_while_the_task_is_woken_is_not_left_behind() {
        let open: Arc<[std::sync::atomic::AtomicBool; 3]> = Arc::new(Default::default());
        let mut set = ReadySet::new((0..3).map(|i| Gate { i, open: open.clone() }), 1);
        let task = Arc::new(Flag(Default::default()));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let mut outs = Vec::new();
        // Poll as a runtime does: a wake is taken when the poll starts
        // (one that comes during the poll runs it again after).
        fn poll(set: &mut ReadySet<Gate>, cx: &mut Context<'_>, task: &Flag, outs: &mut Vec<usize>) -> Poll<()> {
            task.0.store(false, Ordering::Relaxed);
            set.poll_woken(cx, &mut |o| outs.push(o))
        }
        fn run(set: &mut ReadySet<Gate>, cx: &mut Context<'_>, task: &Flag, outs: &mut Vec<usize>) -> Poll<()> {
            let mut r = poll(set, cx, task, outs);
            while r.is_pending() && task.0.load(Ordering::Relaxed) {
                r = poll(set, cx, task, outs);
            }
            r
        }
        assert!(run(&mut set, &mut cx, &task, &mut outs).is_pending(), "every member waits");
        for i in [0, 1] {
            open[i].store(true, Ordering::Relaxed);
            set.wakers[i].wake_by_ref();
        }
        // One pass (of one): member 0 ends; the task wakes itself for 1.
        assert!(poll(&mut set, &mut cx, &task, &mut outs).is_pending());
        assert_eq!(outs, [0]);
        // Member 2's wake comes before the task runs again.
        open[2].store(true, Ordering::Relaxed);
        set.wakers[2].wake_by_ref();
        assert!(run(&mut set, &mut cx, &task, &mut outs).is_ready(), "the set ended; members ended: {outs:?}");
        assert_eq!(outs, [0, 1, 2]);
    }

    /// A set whose members end at once ends at its first poll; an empty
    /// set ends too.
    #[tokio::test]
    async fn members_that_end_at_once_and_an_empty_set_end() {
        let mut n = 0;
        ReadySet::new((0..3).map(|_| async {}), 1).run(|()| n += 1).await;
        assert_eq!(n, 3);
        ReadySet::new(std::iter::empty::<std::future::Ready<()>>(), 1).run(|()| n += 1).await;
        assert_eq!(n, 3);
    }
}
