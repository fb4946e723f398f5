//! The options every command that connects to a target takes (`attach`,
//! `mount`, `bench`, `verify`, ...), and the initiator options they make.

use anyhow::Context;
use bw_initiator::ConnectOptions;
use clap::Args;
use std::time::Duration;

#[derive(Args, Clone)]
pub struct ClientArgs {
    /// Our iSCSI initiator IQN / NVMe host NQN.
    #[arg(long, value_name = "NAME")]
    pub initiator_name: Option<String>,
    /// NVMe/TCP: number of I/O queues (connections).
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Request CRC32C header digests (iSCSI, NVMe/TCP).
    #[arg(long)]
    pub header_digest: bool,
    /// Request CRC32C data digests (iSCSI, NVMe/TCP).
    #[arg(long)]
    pub data_digest: bool,
    /// Seconds to wait for the target before giving up on a request.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Client runtime threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// NVMe/TCP in-band authentication (DH-HMAC-CHAP): our host secret,
    /// DHHC-1:hh:BASE64: as `nvme gen-dhchap-key` prints it. Prefer the
    /// environment variable: arguments are visible to other users.
    #[arg(long, value_name = "DHHC-1:..", env = "BLOCKWIRE_DHCHAP_SECRET", hide_env_values = true)]
    pub dhchap_secret: Option<String>,
    /// The controller's secret: the controller must prove it holds it
    /// (bidirectional authentication). Needs --dhchap-secret.
    #[arg(long, value_name = "DHHC-1:..", env = "BLOCKWIRE_DHCHAP_CTRL_SECRET", hide_env_values = true)]
    pub dhchap_ctrl_secret: Option<String>,
    /// NVMe/TCP over TLS (`nvme+tcp://...?tls`): the configured PSK,
    /// NVMeTLSkey-1:hh:BASE64: as `nvme gen-tls-key` prints it. Prefer the
    /// environment variable or --tls-psk-file: arguments are visible to
    /// other users.
    #[arg(long, value_name = "NVMeTLSkey-1:..", env = "BLOCKWIRE_TLS_PSK", hide_env_values = true, conflicts_with = "tls_psk_file")]
    pub tls_psk: Option<String>,
    /// A file holding the PSK (its first line; keep it mode 600).
    #[arg(long, value_name = "FILE")]
    pub tls_psk_file: Option<std::path::PathBuf>,
    /// The TLS PSK identity's form: 0 (`NVMe0R01 HOSTNQN SUBNQN`, what
    /// Linux's host uses before 6.13 and `nvme gen-tls-key --insert`
    /// inserts by default) or 1 (with the PSK digest, TCP transport 1.1).
    #[arg(long, value_name = "0|1", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub tls_identity: u8,
    /// TCP congestion control (iSCSI, NVMe/TCP): auto (the system's, but
    /// not timer-paced BBR to a target on this machine), system, or an
    /// algorithm such as cubic.
    #[arg(long, value_name = "auto|system|NAME", default_value = "auto")]
    pub tcp_congestion: bw_net::tcp::Congestion,
    /// aoe://: sockets the frames move through: auto (AF_XDP where it can
    /// be set up on the interface, else AF_PACKET), xdp, mmap (AF_PACKET
    /// with PACKET_MMAP rings) or packet.
    #[arg(long, value_name = "auto|xdp|mmap|packet", default_value = "auto")]
    pub aoe_datapath: bw_net::Datapath,
    /// How CRC32C digests are computed: hw (the CPU's CRC instruction) or
    /// soft (portable tables: a CPU without CRC help).
    #[arg(long, value_name = "hw|soft", default_value = "hw")]
    pub digest_impl: bw_serve::tuning::DigestImpl,
}

impl ClientArgs {
    /// The PSK given inline or in --tls-psk-file (its first line).
    pub fn tls_psk(&self) -> anyhow::Result<Option<String>> {
        match &self.tls_psk_file {
            None => Ok(self.tls_psk.clone()),
            Some(p) => {
                let text = std::fs::read_to_string(p).with_context(|| format!("--tls-psk-file {}", p.display()))?;
                let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
                anyhow::ensure!(!line.is_empty(), "--tls-psk-file {}: empty", p.display());
                Ok(Some(line.to_string()))
            }
        }
    }

    pub fn options(&self, queue_depth: usize) -> ConnectOptions {
        // Process-wide, like serve's `[tuning] digest_impl`: every client
        // command builds its options before it connects.
        self.digest_impl.apply();
        // A file that cannot be read fails the connection with its reason.
        let tls_psk = self.tls_psk().unwrap_or_else(|e| Some(format!("({e:#})")));
        ConnectOptions {
            initiator_name: self.initiator_name.clone(),
            queues: self.queues.max(1),
            queue_depth: queue_depth.max(1),
            header_digest: self.header_digest,
            data_digest: self.data_digest,
            timeout: Duration::from_secs(self.timeout.max(1)),
            dhchap_secret: self.dhchap_secret.clone(),
            dhchap_ctrl_secret: self.dhchap_ctrl_secret.clone(),
            tls_psk,
            tls_identity: if self.tls_identity == 1 { bw_initiator::TlsIdentity::V1 } else { bw_initiator::TlsIdentity::V0 },
            tcp_congestion: self.tcp_congestion.clone(),
            aoe_datapath: self.aoe_datapath,
        }
    }
}
