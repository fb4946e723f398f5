//! What can go wrong talking to an NFS server (the RPC transport's errors
//! included: `rpc.rs` and the client both return them).

use nfs3_types::nfs3::nfsstat3;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("XDR: {0}")]
    Xdr(String),
    #[error("RPC: {0}")]
    Rpc(String),
    /// The server answered an NFS call with an error status.
    #[error("{op}: {status:?}")]
    Nfs { op: &'static str, status: nfsstat3 },
    /// The MOUNT service refused the export.
    #[error("mount {export}: {status}")]
    Mount { export: String, status: String },
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("not connected: {0}")]
    Disconnected(String),
    #[error("{0}")]
    Invalid(String),
}

impl From<nfs3_types::xdr_codec::Error> for Error {
    fn from(e: nfs3_types::xdr_codec::Error) -> Self {
        Error::Xdr(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
