//! The gRPC codes CSI requires, from what went wrong: one mapping of
//! the control API's errors, and the argument checks every call shares.

use crate::rpc::RpcError;
use tonic::Status;

/// SPDK's errno codes, which the control API's SPDK-compatible methods
/// answer (docs/control.md), and the native methods' JSON-RPC codes.
const ENODEV: i64 = -19;
const EEXIST: i64 = -17;
const EBUSY: i64 = -16;
const INVALID_PARAMS: i64 = -32602;
const REFUSED: i64 = -32000;

/// A control API error as a CSI status: an unknown object is NOT_FOUND,
/// a name in use ALREADY_EXISTS, a volume in use or a refused change
/// FAILED_PRECONDITION (the change was refused whole: nothing changed),
/// bad parameters INVALID_ARGUMENT, a gateway that cannot be reached or
/// refuses our credentials UNAVAILABLE (the CO retries).
pub fn from_rpc(e: RpcError) -> Status {
    let msg = e.to_string();
    match e.code() {
        Some(ENODEV) => Status::not_found(msg),
        Some(EEXIST) => Status::already_exists(msg),
        Some(EBUSY) | Some(REFUSED) => Status::failed_precondition(msg),
        Some(INVALID_PARAMS) => Status::invalid_argument(msg),
        Some(_) => Status::internal(msg),
        None => Status::unavailable(msg),
    }
}

/// A required string field.
pub fn required<'a>(field: &str, v: &'a str) -> Result<&'a str, Status> {
    if v.is_empty() {
        Err(Status::invalid_argument(format!("{field} is required")))
    } else {
        Ok(v)
    }
}

/// A required message field.
pub fn required_msg<'a, T>(field: &str, v: &'a Option<T>) -> Result<&'a T, Status> {
    v.as_ref().ok_or_else(|| Status::invalid_argument(format!("{field} is required")))
}
