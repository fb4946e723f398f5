//! The CSI v1.13 messages and services, generated from the vendored csi.proto.

#![allow(clippy::all, clippy::pedantic, missing_docs)]
tonic::include_proto!("csi.v1");
