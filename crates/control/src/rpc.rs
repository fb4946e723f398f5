//! What the control methods are made of, at the bottom of the control
//! plane: a method row (name, parameters, handler), the JSON-RPC error a
//! handler answers, and how a [`Refused`] change becomes one (re-exported
//! here for the control plane's clients). The native
//! methods (crate::methods) and the SPDK-compatible ones (crate::spdk) are
//! two tables of these rows over the same operations.

use crate::live::Live;
pub use bw_serve::refused::Refused;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// JSON-RPC 2.0 error codes (the spec's, and ours in its server range).
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    /// The change was refused (invalid, or impossible while serving): nothing changed.
    pub const REFUSED: i64 = -32000;
    /// The client is not root.
    pub const PERMISSION_DENIED: i64 = -32001;
    /// The change was made, but what it then waits for did not finish in
    /// time (`drain`): unlike REFUSED, things changed.
    pub const INCOMPLETE: i64 = -32002;
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    /// The error object's `data` member, if any.
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into(), data: None }
    }
}

/// What went wrong, as `data.reason` of a refusal names it for programs
/// (the code stays [`code::REFUSED`]: nothing changed, whatever the
/// reason).
pub fn reason(r: &Refused) -> &'static str {
    match r {
        Refused::NotFound(_) => "not_found",
        Refused::AlreadyExists(_) => "already_exists",
        Refused::Busy(_) => "busy",
        Refused::Invalid(_) => "invalid",
        Refused::NeedsRestart(_) => "needs_restart",
        Refused::Unsupported(_) => "unsupported",
        Refused::NoSpace(_) => "no_space",
        Refused::Unavailable(_) => "unavailable",
        Refused::Io(_) => "io",
    }
}

/// A refusal in blockwire's own vocabulary: [`code::REFUSED`], the
/// message, and `data: {"reason": ...}` ([`reason`]). (The
/// SPDK-compatible methods number refusals their own way: crate::spdk.)
impl From<Refused> for RpcError {
    fn from(r: Refused) -> RpcError {
        RpcError { code: code::REFUSED, data: Some(json!({ "reason": reason(&r) })), message: r.message().to_string() }
    }
}

pub type Handler = fn(&Live, Value) -> Result<Value, RpcError>;

/// One control method.
pub struct Method {
    pub name: &'static str,
    /// The parameters, as docs/control.md and `rpc_get_methods` show them.
    pub params: &'static str,
    pub call: Handler,
}

/// Parameters of a method, or INVALID_PARAMS saying what is wrong.
pub fn params<T: DeserializeOwned>(v: Value) -> Result<T, RpcError> {
    let v = if v.is_null() { json!({}) } else { v };
    serde_json::from_value(v).map_err(|e| RpcError::new(code::INVALID_PARAMS, format!("invalid params: {e}")))
}
