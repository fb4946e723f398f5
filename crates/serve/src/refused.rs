//! Why a request to change the running server (or to act on it) changed
//! nothing: what went wrong, as a variant, and the message for a person
//! beside it. The front-ends and the configuration's checks refuse in
//! these terms, and the control plane (bw-control) answers them; each
//! vocabulary numbers the variants its own way from one table (JSON-RPC's
//! `data.reason`, SPDK's negative errno, later gRPC status codes for CSI),
//! never from the message.

/// A refused change: nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// What the request names does not exist (a volume, pool, target,
    /// subsystem, LUN, namespace, session...).
    #[error("{0}")]
    NotFound(String),
    /// What the request would make exists already, or exists with other
    /// parameters than asked.
    #[error("{0}")]
    AlreadyExists(String),
    /// What the request would remove or change is in use: exported, or
    /// holding other objects (a pool's volumes, a snapshot's clones), or
    /// still busy (requests in flight).
    #[error("{0}")]
    Busy(String),
    /// The request, or the configuration it would make, is wrong in
    /// itself: a bad name, size, option or combination.
    #[error("{0}")]
    Invalid(String),
    /// Right, but not while serving: a setting fixed at start.
    #[error("{0}")]
    NeedsRestart(String),
    /// Something this server does not do: a protocol it does not serve,
    /// or an option of another target it does not have.
    #[error("{0}")]
    Unsupported(String),
    /// The storage under a pool or volume is full.
    #[error("{0}")]
    NoSpace(String),
    /// A service the request needs did not answer (a Ceph cluster).
    #[error("{0}")]
    Unavailable(String),
    /// An operation of the system failed (a file, a device, a socket).
    #[error("{0}")]
    Io(String),
}

impl Refused {
    /// The message, for a person.
    pub fn message(&self) -> &str {
        match self {
            Refused::NotFound(m)
            | Refused::AlreadyExists(m)
            | Refused::Busy(m)
            | Refused::Invalid(m)
            | Refused::NeedsRestart(m)
            | Refused::Unsupported(m)
            | Refused::NoSpace(m)
            | Refused::Unavailable(m)
            | Refused::Io(m) => m,
        }
    }

    /// A failed system operation, `context: error`, by what the error
    /// says (its kind, not its text): a missing file is not found, a full
    /// disk no space, an unreachable cluster unavailable.
    pub fn io(context: impl std::fmt::Display, e: &std::io::Error) -> Refused {
        Refused::by_kind(format!("{context}: {e}"), e)
    }

    /// `message` (which says what failed) as the variant `e`'s kind means.
    pub fn by_kind(m: String, e: &std::io::Error) -> Refused {
        use std::io::ErrorKind::*;
        match e.kind() {
            NotFound => Refused::NotFound(m),
            AlreadyExists => Refused::AlreadyExists(m),
            ResourceBusy => Refused::Busy(m),
            StorageFull | QuotaExceeded => Refused::NoSpace(m),
            TimedOut | ConnectionRefused | ConnectionReset | ConnectionAborted | NotConnected | HostUnreachable | NetworkUnreachable => Refused::Unavailable(m),
            InvalidInput => Refused::Invalid(m),
            _ => Refused::Io(m),
        }
    }

    /// As [`Refused::io`], for a volume's error.
    pub fn block(context: impl std::fmt::Display, e: &bw_block::BlockError) -> Refused {
        match e {
            bw_block::BlockError::Io(io) => Refused::io(context, io),
            other => Refused::Invalid(format!("{context}: {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// System errors are sorted by their kind, whatever their text.
    #[test]
    fn io_errors_are_sorted_by_kind() {
        let e = |k| std::io::Error::new(k, "x");
        assert!(matches!(Refused::io("a", &e(std::io::ErrorKind::NotFound)), Refused::NotFound(m) if m == "a: x"));
        assert!(matches!(Refused::io("a", &std::io::Error::from_raw_os_error(libc::ENOSPC)), Refused::NoSpace(_)));
        assert!(matches!(Refused::io("a", &std::io::Error::from_raw_os_error(libc::EDQUOT)), Refused::NoSpace(_)));
        assert!(matches!(Refused::io("a", &std::io::Error::from_raw_os_error(libc::ETIMEDOUT)), Refused::Unavailable(_)));
        assert!(matches!(Refused::io("a", &std::io::Error::from_raw_os_error(libc::EBUSY)), Refused::Busy(_)));
        assert!(matches!(Refused::io("a", &std::io::Error::from_raw_os_error(libc::EIO)), Refused::Io(_)));
        assert_eq!(Refused::Busy("in use".into()).to_string(), "in use");
    }
}
