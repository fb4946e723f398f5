//! The control plane of `blockwire serve`: what changes a running server.
//! Every change, from a method or from SIGHUP, is an edit of the
//! configuration (crate::edit, crate::pool) that [`live::Live`] validates,
//! persists and makes the front-ends serve (bw_serve's data plane, below
//! this crate). Two vocabularies of methods name the same operations:
//! blockwire's own (crate::methods) and SPDK's (crate::spdk), both rows of
//! [`rpc::Method`], answered over the control socket (crate::socket) and
//! HTTP (crate::rpc_http) through JSON-RPC (crate::jsonrpc). crate::run is
//! the server's run loop that puts it all together.
//!
//! Modules, from the bottom: edit, pool, live, rpc; methods,
//! spdk; jsonrpc; socket, rpc_http; run. None imports one above it.

pub mod edit;
pub mod jsonrpc;
pub mod live;
pub mod methods;
pub mod pool;
pub mod rpc;
pub mod rpc_http;
pub mod run;
pub mod socket;
pub mod spdk;
