//! Which connections an endpoint keeps: the part of [`crate::serve`] that
//! decides, without sockets or clocks (connections are told apart and
//! aged by the order they came in).
//!
//! A connection is *pending* from its accept until its request's head
//! shows credentials that hold; then it is *authenticated*. Requests that
//! need none (a metrics scrape) are answered from the pending slots.
//! Pending connections cost an attacker nothing but a socket, so:
//! - one peer (an IPv4 address, an IPv6 /64: what one host holds) may have
//!   at most `per_peer` of them; more are refused at once;
//! - when `pending` are open, a new connection pushes out the oldest
//!   pending one: a client that sends its request as it connects (as
//!   every HTTP client does) is never kept out by connections that send
//!   nothing, from however many addresses;
//! - authenticated connections have slots of their own that pending ones
//!   never take, so a client that authenticates finds one even while the
//!   pending slots are full.

use std::collections::BTreeMap;
use std::net::IpAddr;

/// Bounds of [`Admission`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Connections whose sender has not authenticated (yet); past this,
    /// the oldest of them goes for a new one.
    pub pending: usize,
    /// Pending connections one peer may hold; more are refused.
    pub per_peer: usize,
    /// Connections of clients that authenticated; past this, 503.
    pub authenticated: usize,
}

/// A connection, numbered in the order they came.
pub type ConnId = u64;

#[derive(Debug, PartialEq, Eq)]
pub enum Accept {
    /// Keep it as `id`; close `evict` (the oldest pending one) to make room.
    Admitted { id: ConnId, evict: Option<ConnId> },
    /// Its peer holds `per_peer` pending connections already: close it.
    Refused,
}

#[derive(Debug)]
struct Conn {
    peer: IpAddr,
    authenticated: bool,
}

#[derive(Debug)]
pub struct Admission {
    limits: AdmissionLimits,
    next: ConnId,
    /// By id: oldest first.
    conns: BTreeMap<ConnId, Conn>,
}

/// What one host holds: its IPv4 address (also when mapped into IPv6),
/// or the /64 of its IPv6 address (a host is given a whole /64).
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
        v4 => v4,
    }
}

impl Admission {
    pub fn new(limits: AdmissionLimits) -> Admission {
        Admission { limits, next: 0, conns: BTreeMap::new() }
    }

    fn pending(&self) -> impl Iterator<Item = (&ConnId, &Conn)> {
        self.conns.iter().filter(|(_, c)| !c.authenticated)
    }

    /// A connection from `peer` came in.
    pub fn accept(&mut self, peer: IpAddr) -> Accept {
        let peer = peer_key(peer);
        if self.pending().filter(|(_, c)| c.peer == peer).count() >= self.limits.per_peer {
            return Accept::Refused;
        }
        let evict = if self.pending().count() >= self.limits.pending { self.pending().next().map(|(id, _)| *id) } else { None };
        if let Some(old) = evict {
            self.conns.remove(&old);
        }
        let id = self.next;
        self.next += 1;
        self.conns.insert(id, Conn { peer, authenticated: false });
        Accept::Admitted { id, evict }
    }

    /// Connection `id`'s request showed credentials that hold: give it an
    /// authenticated slot. `false`: there is none free, or the connection
    /// was pushed out meanwhile.
    pub fn authenticate(&mut self, id: ConnId) -> bool {
        let busy = self.conns.values().filter(|c| c.authenticated).count();
        match self.conns.get_mut(&id) {
            Some(c) if c.authenticated => true,
            Some(c) if busy < self.limits.authenticated => {
                c.authenticated = true;
                true
            }
            _ => false,
        }
    }

    /// Connection `id` is closed (or was pushed out).
    pub fn close(&mut self, id: ConnId) {
        self.conns.remove(&id);
    }

    /// Pending and authenticated connections now.
    pub fn counts(&self) -> (usize, usize) {
        let pending = self.pending().count();
        (pending, self.conns.len() - pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: AdmissionLimits = AdmissionLimits { pending: 4, per_peer: 2, authenticated: 2 };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn admitted(a: Accept) -> (ConnId, Option<ConnId>) {
        match a {
            Accept::Admitted { id, evict } => (id, evict),
            Accept::Refused => panic!("refused"),
        }
    }

    #[test]
    fn one_peer_holds_at_most_per_peer_pending_connections() {
        let mut a = Admission::new(LIMITS);
        let (first, _) = admitted(a.accept(ip("10.0.0.1")));
        admitted(a.accept(ip("10.0.0.1")));
        assert_eq!(a.accept(ip("10.0.0.1")), Accept::Refused);
        // The same host over IPv6-mapped IPv4, and another in its /64.
        assert_eq!(a.accept(ip("::ffff:10.0.0.1")), Accept::Refused);
        admitted(a.accept(ip("2001:db8::1")));
        admitted(a.accept(ip("2001:db8::2")));
        assert_eq!(a.accept(ip("2001:db8::ffff:3")), Accept::Refused);
        // Once one authenticates or closes, the peer may open another.
        assert!(a.authenticate(first));
        admitted(a.accept(ip("10.0.0.1")));
        assert_eq!(a.counts(), (4, 1));
    }

    #[test]
    fn a_new_connection_pushes_out_the_oldest_pending_one_never_an_authenticated_one() {
        let mut a = Admission::new(LIMITS);
        let ids: Vec<ConnId> = (1..=4).map(|i| admitted(a.accept(ip(&format!("10.0.0.{i}")))).0).collect();
        assert!(a.authenticate(ids[0]));
        let (n, _) = admitted(a.accept(ip("10.0.0.5")));
        assert_eq!(a.counts(), (4, 1));
        let (_, evict) = admitted(a.accept(ip("10.0.0.6")));
        assert_eq!(evict, Some(ids[1]), "the oldest pending one goes, not the older authenticated one");
        assert!(!a.authenticate(ids[1]), "pushed out: it cannot come back");
        assert!(a.authenticate(n));
        // Authenticated slots are full: a third is refused (503), and the
        // pending slots do not lend it one.
        let (m, _) = admitted(a.accept(ip("10.0.0.7")));
        assert!(!a.authenticate(m));
        a.close(ids[0]);
        assert!(a.authenticate(m));
    }
}
