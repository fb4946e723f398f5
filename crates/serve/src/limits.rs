//! Admission limits of the TCP front-ends (iSCSI, NVMe/TCP): how many
//! sessions a front-end holds, how many connections one initiator address
//! may keep open, and how long a new connection may take to log in. Each
//! front-end counts on its own; every connection costs a thread, so these
//! are what keeps a flood of connections from exhausting the process.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `[limits]` in the config file; `--max-sessions`,
/// `--max-connections-per-address`, `--login-timeout` on the command line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Sessions one front-end holds at once: iSCSI sessions (counted from
    /// the first login request; more are refused with "out of resources"),
    /// NVMe/TCP controllers (more are refused with "controller busy").
    pub max_sessions: usize,
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
        // queues opens (an NVMe host opens one connection per CPU and subsystem).
        Limits { max_sessions: 4096, max_connections_per_address: 1024, login_timeout_s: 15 }
    }
}

impl Limits {
    pub fn login_timeout(&self) -> Duration {
        Duration::from_secs(self.login_timeout_s)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.max_sessions == 0 || self.max_connections_per_address == 0 || self.login_timeout_s == 0 {
            return Err("limits: max_sessions, max_connections_per_address and login_timeout_s must be above zero".into());
        }
        Ok(())
    }
}

/// The live connections and sessions of one front-end.
pub struct Admission {
    limits: Limits,
    per_address: Mutex<HashMap<IpAddr, usize>>,
    sessions: AtomicUsize,
}

/// One admitted connection; gives its place back when dropped.
pub struct Ticket {
    adm: Arc<Admission>,
    ip: IpAddr,
    session: bool,
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Admission> {
        Arc::new(Admission { limits, per_address: Mutex::new(HashMap::new()), sessions: AtomicUsize::new(0) })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A connection from `ip` was accepted: admit it, or say why not.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Ticket, String> {
        let mut m = self.per_address.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= self.limits.max_connections_per_address {
            return Err(format!("{ip} already has {n} connections (max_connections_per_address)"));
        }
        *n += 1;
        Ok(Ticket { adm: self.clone(), ip, session: false })
    }
}

impl Ticket {
    /// This connection starts a session: take a place, or false if the
    /// front-end holds `max_sessions` already.
    pub fn begin_session(&mut self) -> bool {
        if self.session {
            return true;
        }
        let max = self.adm.limits.max_sessions;
        let taken = self.adm.sessions.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
        self.session = taken.is_ok();
        self.session
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.session {
            self.adm.sessions.fetch_sub(1, Ordering::AcqRel);
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

    #[test]
    fn places_are_taken_and_given_back() {
        let adm = Admission::new(Limits { max_sessions: 2, max_connections_per_address: 2, login_timeout_s: 1 });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut t1 = adm.admit(a).unwrap();
        let mut t2 = adm.admit(a).unwrap();
        assert!(adm.admit(a).is_err(), "third connection from one address");
        let mut t3 = adm.admit(b).unwrap();
        assert!(t1.begin_session() && t1.begin_session(), "a second call keeps the one place");
        assert!(t2.begin_session());
        assert!(!t3.begin_session(), "max_sessions reached");
        drop(t1);
        assert!(t3.begin_session(), "a place came back");
        let t4 = adm.admit(a).unwrap();
        drop((t2, t3, t4));
        assert!(adm.per_address.lock().unwrap().is_empty());
        assert_eq!(adm.sessions.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn zero_limits_are_refused() {
        assert!(Limits::default().validate().is_ok());
        assert!(Limits { login_timeout_s: 0, ..Limits::default() }.validate().is_err());
        assert!(Limits { max_sessions: 0, ..Limits::default() }.validate().is_err());
    }
}
