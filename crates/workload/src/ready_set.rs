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

pub(crate) struct ReadySet<F: Future> {
    /// `None` once finished.
    members: Vec<Option<Pin<Box<F>>>>,
    wakers: Vec<Waker>,
    ready: Arc<Ready>,
    live: usize,
}

impl<F: Future> ReadySet<F> {
    pub(crate) fn new(futures: impl IntoIterator<Item = F>) -> Self {
        let members: Vec<_> = futures.into_iter().map(|f| Some(Box::pin(f))).collect();
        let n = members.len();
        // Every member is polled once to start.
        let bits = (0..n.div_ceil(64)).map(|w| AtomicU64::new(if (w + 1) * 64 <= n { u64::MAX } else { (1 << (n % 64)) - 1 })).collect();
        let ready = Arc::new(Ready { bits, task: AtomicWaker::new() });
        let wakers = (0..n).map(|i| Waker::from(Arc::new(MemberWaker { ready: ready.clone(), i }))).collect();
        ReadySet { members, wakers, ready, live: n }
    }

    /// Run every member to its end, handing each output to `done` as it
    /// comes.
    pub(crate) async fn run(mut self, mut done: impl FnMut(F::Output)) {
        std::future::poll_fn(|cx| self.poll_woken(cx, &mut done)).await
    }

    /// One pass over the members woken since the last: a member woken
    /// again meanwhile wakes this task again (its waker was registered
    /// first), so the task yields between passes as it did under
    /// `FuturesUnordered`, and never misses a wake.
    fn poll_woken(&mut self, cx: &mut Context<'_>, done: &mut impl FnMut(F::Output)) -> Poll<()> {
        self.ready.task.register(cx.waker());
        for w in 0..self.ready.bits.len() {
            let mut bits = self.ready.bits[w].swap(0, Ordering::AcqRel);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let Some(f) = self.members[i].as_mut() else { continue };
                if let Poll::Ready(out) = f.as_mut().poll(&mut Context::from_waker(&self.wakers[i])) {
                    self.members[i] = None;
                    self.live -= 1;
                    done(out);
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
        }));
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

    /// A set whose members end at once ends at its first poll; an empty
    /// set ends too.
    #[tokio::test]
    async fn members_that_end_at_once_and_an_empty_set_end() {
        let mut n = 0;
        ReadySet::new((0..3).map(|_| async {})).run(|()| n += 1).await;
        assert_eq!(n, 3);
        ReadySet::new(std::iter::empty::<std::future::Ready<()>>()).run(|()| n += 1).await;
        assert_eq!(n, 3);
    }
}
