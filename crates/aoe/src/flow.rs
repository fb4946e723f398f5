//! Initiator flow control without sockets: the congestion window, the
//! retransmit timer of each request and tag allocation. Time is passed in;
//! the socket driver (`bw-initiator`) only sends, receives and sleeps.
//!
//! The window follows the Linux aoe driver: start at half the target's
//! buffer count, grow by one after a window's worth of clean replies, halve
//! on a timeout, at most once per retransmit timeout (one loss event times
//! out many frames at once). The retransmit timeout comes from
//! [`RttEstimator`], sampled only on first attempts (Karn's rule), doubled
//! per retransmit.

use crate::initiator::RttEstimator;
use std::time::{Duration, Instant};

/// The congestion window and round-trip estimate shared by all requests.
#[derive(Debug, Clone)]
pub struct Window {
    rtt: RttEstimator,
    size: usize,
    max: usize,
    /// Requests that may still be in flight beyond `size` after a cut: as
    /// they finish, their places are not given back.
    debt: usize,
    clean: usize,
    last_cut: Option<Instant>,
    max_rto: Duration,
}

impl Window {
    /// A window for a target with `max` buffers (at least 1).
    pub fn new(max: usize, min_rto: Duration, max_rto: Duration) -> Self {
        let max = max.max(1);
        Window { rtt: RttEstimator::new(min_rto, max_rto), size: (max / 2).max(1), max, debt: 0, clean: 0, last_cut: None, max_rto }
    }

    /// Requests allowed in flight now.
    pub fn size(&self) -> usize {
        self.size
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    /// Retransmit timeout for a request's `attempt` (0 = first send).
    pub fn rto(&self, attempt: u32) -> Duration {
        self.rtt.timeout().saturating_mul(1 << attempt.min(6)).min(self.max_rto)
    }

    /// A reply arrived; `rtt` only for requests sent once. Returns how many
    /// new places in flight to open (0 or 1).
    pub fn on_reply(&mut self, rtt: Option<Duration>) -> usize {
        if let Some(r) = rtt {
            self.rtt.sample(r);
        }
        self.clean += 1;
        if self.clean >= self.size && self.size < self.max {
            self.size += 1;
            self.clean = 0;
            if self.debt > 0 {
                self.debt -= 1;
            } else {
                return 1;
            }
        }
        0
    }

    /// A request timed out at `now`: halve the window, once per timeout period.
    pub fn on_timeout(&mut self, now: Instant) {
        if self.last_cut.is_some_and(|t| now.duration_since(t) < self.rtt.timeout()) {
            return;
        }
        self.last_cut = Some(now);
        let new = (self.size / 2).max(1);
        self.debt += self.size - new;
        self.size = new;
        self.clean = 0;
    }

    /// A request finished and gives back its place: `false` if the place
    /// is to be forgotten instead (the window shrank meanwhile).
    pub fn on_release(&mut self) -> bool {
        if self.debt > 0 {
            self.debt -= 1;
            false
        } else {
            true
        }
    }
}

/// Tags: the low byte names the request's slot (so a reply finds its slot
/// without a search), the bits above it a sequence number that changes with
/// every send, so a late reply to an earlier attempt is told apart.
///
/// Replies go to every initiator on the interface (one MAC): initiators
/// sharing it must not share tags, or one takes another's reply (and its
/// read data). [`Tags::for_initiator`] puts an id in the top 12 bits.
#[derive(Debug, Clone)]
pub struct Tags {
    seq: u32,
    /// Fixed high bits (the initiator id, if any).
    prefix: u32,
    /// Bits of `seq` that fit below the prefix.
    seq_mask: u32,
}

impl Default for Tags {
    fn default() -> Self {
        Tags { seq: 1, prefix: 0, seq_mask: 0x00FF_FFFF }
    }
}

impl Tags {
    /// Tags of one of up to 4096 initiators sharing an interface; `id`
    /// must differ between them (it is taken modulo 4096).
    pub fn for_initiator(id: u32) -> Self {
        Tags { seq: 1, prefix: (id & 0xFFF) << 20, seq_mask: 0x0FFF }
    }

    /// The bits of a tag that carry the initiator id.
    pub const ID_MASK: u32 = 0xFFF0_0000;

    /// This initiator's id bits (0 without one): every tag it sends has them.
    pub fn prefix(&self) -> u32 {
        self.prefix
    }

    pub fn next(&mut self, slot: u8) -> u32 {
        let seq = self.seq & self.seq_mask;
        self.seq = self.seq.wrapping_add(1);
        self.prefix | (seq << 8) | slot as u32
    }

    /// The slot a tag belongs to.
    pub fn slot(tag: u32) -> usize {
        (tag & 0xFF) as usize
    }
}

/// What to do when a request's timer fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Send the request again under this new tag.
    Retransmit { tag: u32 },
    /// The overall deadline passed after this many retransmits.
    GiveUp { retransmits: u32 },
}

/// One request's life: its current tag, attempt count and timers.
#[derive(Debug, Clone)]
pub struct Exchange {
    slot: u8,
    tag: u32,
    attempt: u32,
    sent_at: Instant,
    expiry: Instant,
    deadline: Instant,
}

impl Exchange {
    /// The first send at `now`, to give up at `now + timeout`.
    pub fn start(slot: u8, tags: &mut Tags, window: &Window, now: Instant, timeout: Duration) -> Self {
        let deadline = now + timeout;
        let tag = tags.next(slot);
        Exchange { slot, tag, attempt: 0, sent_at: now, expiry: (now + window.rto(0)).min(deadline), deadline }
    }

    /// The tag the reply must carry.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// When [`Exchange::on_expiry`] is due.
    pub fn expiry(&self) -> Instant {
        self.expiry
    }

    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether a reply with `tag` answers this request (not a duplicate or
    /// a late reply to an earlier attempt, not another slot's).
    pub fn accepts(&self, tag: u32) -> bool {
        tag == self.tag
    }

    /// The reply came at `received_at`: the round-trip sample it gives
    /// (none after a retransmit, as one cannot tell which send it answers).
    pub fn rtt_sample(&self, received_at: Instant) -> Option<Duration> {
        (self.attempt == 0).then(|| received_at.saturating_duration_since(self.sent_at))
    }

    /// The timer fired at `now` without an accepted reply.
    pub fn on_expiry(&mut self, now: Instant, tags: &mut Tags, window: &mut Window) -> Expired {
        window.on_timeout(now);
        if now >= self.deadline {
            return Expired::GiveUp { retransmits: self.attempt };
        }
        self.attempt += 1;
        self.tag = tags.next(self.slot);
        self.sent_at = now;
        self.expiry = (now + window.rto(self.attempt)).min(self.deadline);
        Expired::Retransmit { tag: self.tag }
    }
}

#[cfg(test)]
#[path = "flow/tests.rs"]
mod tests;
