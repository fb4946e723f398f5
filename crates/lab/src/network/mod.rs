//! The links the lab measures over: the namespaces and veth pairs between
//! the client and target sides ([`topology`]), their NIC offloads
//! ([`offload`]), and whether NVMe over RDMA can run on one ([`rdma`]).

pub mod offload;
pub mod rdma;
pub mod topology;
