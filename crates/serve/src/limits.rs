//! Admission limits of the front-ends (iSCSI, NVMe/TCP, NVMe/RDMA): how many
//! connections may be logging in at once, how many sessions a front-end
//! holds (normal and discovery sessions in pools of their own), how many
//! connections one initiator address may keep open, and how long a new
//! connection may take to log in. Each front-end counts on its own.
//!
//! A connection that has not logged in holds a pending-login place only,
//! so that clients without credentials cannot fill the session pools; it
//! takes a session place when its login completes (iSCSI), or its Connect
//! is accepted (NVMe/TCP, where the fabric counts controllers), and gives
//! the pending place back then. Discovery sessions, open to anyone, take
//! a place in the small discovery pool, never one a host's session needs.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `[limits]` in the config file; `--max-sessions`,
/// `--max-discovery-sessions`, `--discovery-idle-timeout`,
/// `--max-pending-logins`, `--max-connections-per-address`,
/// `--login-timeout` on the command line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Normal sessions one front-end holds at once: iSCSI sessions to a
    /// target (counted when the login completes; more are refused with
    /// "out of resources"), NVMe/TCP controllers of a subsystem (more are
    /// refused with "controller busy").
    pub max_sessions: usize,
    /// Discovery sessions one front-end holds at once (iSCSI SendTargets
    /// sessions, NVMe/TCP discovery controllers), refused the same way.
    /// Anyone may open one, so they have a pool of their own.
    pub max_discovery_sessions: usize,
    /// Seconds an iSCSI discovery session may go without a request before
    /// it is closed (answers to our NOP-In pings are not requests); an
    /// NVMe/TCP discovery controller that asked for no keep-alive (KATO 0)
    /// gets this as its keep-alive timeout.
    pub discovery_idle_timeout_s: u64,
    /// Connections one front-end holds that have not logged in yet (no
    /// completed iSCSI login, no accepted NVMe/TCP Connect); more are
    /// closed as soon as they are accepted.
    pub max_pending_logins: usize,
    /// TCP connections one initiator IP address may have open on one
    /// front-end; more are closed as soon as they are accepted.
    pub max_connections_per_address: usize,
    /// Seconds from accept to a completed iSCSI login or NVMe/TCP Connect;
    /// connections that are silent, send half a PDU or dawdle are dropped.
    pub login_timeout_s: u64,
}

impl Default for Limits {
    fn default() -> Self {
        // Bounds against floods, far above what a SAN of hosts with many
        // queues opens (an NVMe host opens one connection per CPU and
        // subsystem); a host's discovery session lasts one request.
        Limits {
            max_sessions: 4096,
            max_discovery_sessions: 64,
            discovery_idle_timeout_s: 60,
            max_pending_logins: 1024,
            max_connections_per_address: 1024,
            login_timeout_s: 15,
        }
    }
}

impl Limits {
    pub fn login_timeout(&self) -> Duration {
        Duration::from_secs(self.login_timeout_s)
    }

    pub fn discovery_idle_timeout(&self) -> Duration {
        Duration::from_secs(self.discovery_idle_timeout_s)
    }

    pub fn validate(&self) -> Result<(), String> {
        let all = [
            self.max_sessions,
            self.max_discovery_sessions,
            self.max_pending_logins,
            self.max_connections_per_address,
            self.login_timeout_s as usize,
            self.discovery_idle_timeout_s as usize,
        ];
        if all.contains(&0) {
            return Err("limits: max_sessions, max_discovery_sessions, max_pending_logins, max_connections_per_address, \
                        login_timeout_s and discovery_idle_timeout_s must be above zero"
                .into());
        }
        Ok(())
    }
}

/// Which pool a session takes its place from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKind {
    /// A session to a target or subsystem (`max_sessions`).
    Normal,
    /// A discovery session (`max_discovery_sessions`).
    Discovery,
}

impl SessionKind {
    /// The knob that bounds this pool, for log lines.
    pub fn knob(self) -> &'static str {
        match self {
            SessionKind::Normal => "max_sessions",
            SessionKind::Discovery => "max_discovery_sessions",
        }
    }
}

/// The live connections and sessions of one front-end.
pub struct Admission {
    limits: Limits,
    per_address: Mutex<HashMap<IpAddr, usize>>,
    sessions: AtomicUsize,
    discovery_sessions: AtomicUsize,
    pending_logins: AtomicUsize,
}

/// Take one of `max` places counted by `n`; false if all are taken.
fn take(n: &AtomicUsize, max: usize) -> bool {
    n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |k| (k < max).then_some(k + 1)).is_ok()
}

/// One admitted connection; gives its places back when dropped.
pub struct Ticket {
    adm: Arc<Admission>,
    ip: IpAddr,
    /// Holds a place in `max_pending_logins` (until logged in).
    pending: bool,
    session: Option<SessionKind>,
    /// Moves the connection to a thread of its own once logged in (the
    /// accept loop's thread-per-connection mode); `None` when it stays
    /// where it runs.
    pub(crate) mover: Option<Mover>,
}

/// A connection's way to a thread of its own (`Ticket::own_thread`, in the
/// accept loop, which gives it out and does the moving).
#[derive(Default)]
pub(crate) struct Mover {
    /// Set by the connection's future when it wants to move; the task
    /// running it sees it when that poll returns.
    pub(crate) asked: Arc<AtomicBool>,
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            per_address: Mutex::new(HashMap::new()),
            sessions: AtomicUsize::new(0),
            discovery_sessions: AtomicUsize::new(0),
            pending_logins: AtomicUsize::new(0),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A connection from `ip` was accepted: admit it, or say why not.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Ticket, String> {
        let mut m = self.per_address.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.get(&ip).copied().unwrap_or(0);
        if n >= self.limits.max_connections_per_address {
            return Err(format!("{ip} already has {n} connections (max_connections_per_address)"));
        }
        if !take(&self.pending_logins, self.limits.max_pending_logins) {
            let n = self.pending_logins.load(Ordering::Relaxed);
            return Err(format!("{n} connections are logging in already (max_pending_logins)"));
        }
        *m.entry(ip).or_insert(0) += 1;
        Ok(Ticket { adm: self.clone(), ip, pending: true, session: None, mover: None })
    }

    fn pool(&self, kind: SessionKind) -> (&AtomicUsize, usize) {
        match kind {
            SessionKind::Normal => (&self.sessions, self.limits.max_sessions),
            SessionKind::Discovery => (&self.discovery_sessions, self.limits.max_discovery_sessions),
        }
    }
}

impl Ticket {
    /// This connection's login completed and starts a session of `kind`:
    /// take a place in that pool (and give the pending-login place back),
    /// or false if the front-end holds as many as it may.
    pub fn begin_session(&mut self, kind: SessionKind) -> bool {
        if let Some(k) = self.session {
            return k == kind;
        }
        let (n, max) = self.adm.pool(kind);
        if !take(n, max) {
            return false;
        }
        self.session = Some(kind);
        self.logged_in();
        true
    }

    /// This connection has logged in (its sessions are counted elsewhere,
    /// as NVMe/TCP controllers are): give the pending-login place back.
    pub fn logged_in(&mut self) {
        if std::mem::take(&mut self.pending) {
            self.adm.pending_logins.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.logged_in();
        if let Some(kind) = self.session {
            self.adm.pool(kind).0.fetch_sub(1, Ordering::AcqRel);
        }
        let mut m = self.adm.per_address.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_sessions: usize, per_address: usize) -> Limits {
        Limits { max_sessions, max_connections_per_address: per_address, login_timeout_s: 1, ..Limits::default() }
    }

    #[test]
    fn places_are_taken_and_given_back() {
        let adm = Admission::new(limits(2, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut t1 = adm.admit(a).unwrap();
        let mut t2 = adm.admit(a).unwrap();
        assert!(adm.admit(a).is_err(), "third connection from one address");
        let mut t3 = adm.admit(b).unwrap();
        use SessionKind::Normal;
        assert!(t1.begin_session(Normal) && t1.begin_session(Normal), "a second call keeps the one place");
        assert!(t2.begin_session(Normal));
        assert!(!t3.begin_session(Normal), "max_sessions reached");
        drop(t1);
        assert!(t3.begin_session(Normal), "a place came back");
        let t4 = adm.admit(a).unwrap();
        drop((t2, t3, t4));
        assert!(adm.per_address.lock().unwrap().is_empty());
        assert_eq!(adm.sessions.load(Ordering::Relaxed), 0);
        assert_eq!(adm.pending_logins.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn discovery_sessions_have_their_own_pool() {
        let adm = Admission::new(Limits { max_discovery_sessions: 2, ..limits(1, 100) });
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut d: Vec<Ticket> = (0..3).map(|_| adm.admit(ip).unwrap()).collect();
        assert!(d[0].begin_session(SessionKind::Discovery) && d[1].begin_session(SessionKind::Discovery));
        assert!(!d[2].begin_session(SessionKind::Discovery), "max_discovery_sessions reached");
        let mut host = adm.admit(ip).unwrap();
        assert!(host.begin_session(SessionKind::Normal), "discovery sessions took a host's place");
        assert!(!host.begin_session(SessionKind::Discovery), "a session has one kind");
        d.clear();
        drop(host);
        assert_eq!(adm.discovery_sessions.load(Ordering::Relaxed), 0);
        assert_eq!(adm.sessions.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn pending_logins_are_capped_across_addresses() {
        let adm = Admission::new(Limits { max_pending_logins: 2, ..limits(10, 10) });
        let ips: Vec<IpAddr> = (1..=3).map(|i| format!("10.0.0.{i}").parse().unwrap()).collect();
        let mut t1 = adm.admit(ips[0]).unwrap();
        let _t2 = adm.admit(ips[1]).unwrap();
        let refused = adm.admit(ips[2]).err().expect("a third pending login");
        assert!(refused.contains("max_pending_logins"), "{refused}");
        assert!(!adm.per_address.lock().unwrap().contains_key(&ips[2]), "a refused address keeps no count");
        t1.logged_in();
        let _t3 = adm.admit(ips[2]).expect("a logged-in connection gave its pending place back");
        assert!(adm.admit(ips[0]).is_err(), "still two pending");
        assert!(t1.begin_session(SessionKind::Normal));
        assert_eq!(adm.pending_logins.load(Ordering::Relaxed), 2, "begin_session after logged_in gives nothing back twice");
    }

    #[test]
    fn zero_limits_are_refused() {
        assert!(Limits::default().validate().is_ok());
        assert!(Limits { login_timeout_s: 0, ..Limits::default() }.validate().is_err());
        assert!(Limits { max_sessions: 0, ..Limits::default() }.validate().is_err());
        assert!(Limits { max_discovery_sessions: 0, ..Limits::default() }.validate().is_err());
        assert!(Limits { max_pending_logins: 0, ..Limits::default() }.validate().is_err());
        assert!(Limits { discovery_idle_timeout_s: 0, ..Limits::default() }.validate().is_err());
    }
}
