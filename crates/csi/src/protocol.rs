//! The protocols a node attaches volumes with.

/// How a volume reaches its nodes (StorageClass parameter `protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    NvmeTcp,
    NvmeRdma,
    Iscsi,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Protocol, String> {
        match s {
            "nvme-tcp" => Ok(Protocol::NvmeTcp),
            "nvme-rdma" => Ok(Protocol::NvmeRdma),
            "iscsi" => Ok(Protocol::Iscsi),
            _ => Err(format!("protocol {s:?}: one of nvme-tcp, nvme-rdma, iscsi")),
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::NvmeTcp => "nvme-tcp",
            Protocol::NvmeRdma => "nvme-rdma",
            Protocol::Iscsi => "iscsi",
        })
    }
}

