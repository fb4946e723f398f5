//! Every integration test of the `blockwire` binary, in one test binary:
//! one link instead of one per file. Each module is one area; `common` holds
//! the fixtures (namespaces, `serve` processes, the kernel VM, Ceph).

#[allow(dead_code)]
mod common;

mod admission;
mod aoe_kernel;
mod aoe_mmap;
mod aoe_net;
mod aoe_xdp;
mod attach;
mod blktests;
mod cli_basics;
mod conformance_kernel;
mod control;
mod csi;
mod csi_kernel;
mod digests;
mod durability;
mod fn_length;
mod hostile;
mod iscsi_hostile;
mod iscsi_interop;
mod iscsi_kernel;
mod iscsi_libiscsi;
mod lab_e2e;
mod lab_endings;
mod lab_external;
mod lab_ssh;
mod load;
mod metrics;
mod module_cycles;
mod mpls;
mod nvme_auth;
mod nvme_hostile;
mod nvme_initiator;
mod nvme_kernel;
mod nfs;
mod nvme_nvmet;
mod nvme_rdma;
mod nvme_tls;
mod ns_visibility;
mod packaging;
mod readme_layout;
mod rbd;
mod rbd_gateways;
mod rbd_ha;
mod secrets;
mod socket_fuzz;
mod standalone;
mod tcp_congestion;
mod volumes;
