//! `[tuning]` in the config file, `--aoe-workers` and friends on the
//! command line: how the front-ends spend threads and copies. The defaults
//! are what measured best on a 2-core machine; the knobs exist to measure
//! alternatives (the scripts in `bench/` set them).

use bw_net::tcp::Congestion;
use bw_net::Datapath;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Tuning {
    /// AoE receive threads per interface; 0 picks by what the interface
    /// exports: one per two cores when every export is memory-backed (or
    /// goes through the I/O pool), two per core (4..=16) otherwise.
    pub aoe_workers: usize,
    /// Threads of the opt-in I/O pool for device-backed AoE exports
    /// (0: off; see `aoe.rs` for why it is off by default).
    pub aoe_io_threads: usize,
    /// How the kernel spreads AoE frames over the workers.
    pub aoe_fanout: AoeFanout,
    /// The sockets AoE frames move through: AF_XDP ("xdp"), AF_PACKET
    /// ("packet"), or AF_XDP where it can be set up, else AF_PACKET ("auto").
    pub aoe_datapath: Datapath,
    /// One thread (with its own single-threaded runtime) per iSCSI
    /// connection; `false`: tasks on the shared runtime.
    pub iscsi_connection_threads: bool,
    /// Smallest READ, in bytes, that iSCSI and NVMe/TCP send with
    /// `sendfile` from the page cache (memory-backed volumes, no data
    /// digest); smaller ones are copied, which lets many replies share one
    /// socket write. A huge value turns zero-copy off. Also read under its
    /// former name, `iscsi_zero_copy_min`.
    #[serde(alias = "iscsi_zero_copy_min")]
    pub zero_copy_min: usize,
    /// Shorter iSCSI and NVMe/TCP READs of memory-backed volumes (no data digest)
    /// are sent from the volume's mapped backing file, gathered with their
    /// headers into one `sendmsg`, instead of being copied into the send
    /// buffer first (`bw_block::Volume::mapped_read`); `false`: copied.
    pub mapped_reads: bool,
    /// Largest READ/WRITE copy, in bytes, that iSCSI and NVMe/TCP run on
    /// the connection's thread; bigger ones go to the blocking pool (reads
    /// sent with sendfile copy nothing and always run there). Also read
    /// under its former name, `iscsi_inline_max`.
    #[serde(alias = "iscsi_inline_max")]
    pub inline_max: usize,
    /// Commands iSCSI and NVMe/TCP take from a connection's receive buffer
    /// before the answers so far are sent (0: every command already
    /// received first); see `crate::driver`. Also read under its former
    /// name, `iscsi_flush_every`, which counted iSCSI PDUs.
    #[serde(alias = "iscsi_flush_every")]
    pub commands_per_send: usize,
    /// TCP congestion control of iSCSI and NVMe/TCP connections: "auto"
    /// (the system's, but no timer-paced BBR towards a host on this
    /// machine; see `bw_net::tcp`), "system", or an algorithm's name.
    pub tcp_congestion: Congestion,
    /// How iSCSI and NVMe/TCP CRC32C digests are computed, for the whole
    /// process (the initiator's too when it runs in it): "hw", the CPU's
    /// CRC instruction, or "soft", portable tables (a CPU or NIC without
    /// CRC help; the lab's `--digest crc32c-soft`).
    pub digest_impl: DigestImpl,
    /// Who keeps the records of NVMe/TCP connections over TLS: "auto" (the
    /// kernel, kTLS, where it has TLS; else this process), "kernel" (a
    /// connection fails without kTLS) or "user" (this process).
    pub tls_records: TlsRecords,
    /// Where a user-space TLS connection seals a large read's records:
    /// "inline", all on the connection's thread; "thread", three quarters
    /// of each window on a helper thread of the connection's own, beside
    /// the connection's sends (docs/notes/2026-11-27-h53l-sealing.md).
    pub tls_sealing: TlsSealing,
}

/// [`Tuning::tls_sealing`].
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum TlsSealing {
    /// On the connection's thread. The default: where client and target
    /// share two cores, the helper thread cost the target more CPU per
    /// MiB at MTU 9000 and over loopback (hand-offs, wake-ups, record
    /// buffers written on one core and sent from another) for no more
    /// throughput; it won only at MTU 1500 (1.24-1.27x)
    /// (docs/notes/2026-11-27-h53l-sealing.md,
    /// docs/lab-runs/2026-11-27-session-9).
    #[default]
    Inline,
    /// A quarter on the connection's thread, the rest on a helper thread
    /// (nvme-tls-9): for a target with cores to spare beyond its busy
    /// connections'.
    Thread,
}

/// [`Tuning::tls_records`].
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum TlsRecords {
    #[default]
    Auto,
    Kernel,
    User,
}

impl From<TlsRecords> for bw_tls::RecordChoice {
    fn from(t: TlsRecords) -> Self {
        match t {
            TlsRecords::Auto => bw_tls::RecordChoice::Auto,
            TlsRecords::Kernel => bw_tls::RecordChoice::Kernel,
            TlsRecords::User => bw_tls::RecordChoice::User,
        }
    }
}

/// [`Tuning::digest_impl`].
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum DigestImpl {
    #[default]
    Hw,
    Soft,
}

impl std::str::FromStr for DigestImpl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hw" => Ok(DigestImpl::Hw),
            "soft" => Ok(DigestImpl::Soft),
            _ => Err(format!("{s:?}: expected hw or soft")),
        }
    }
}

impl DigestImpl {
    /// Make every digest of this process use it.
    pub fn apply(self) {
        bw_iscsi::pdu::set_digest_impl(match self {
            DigestImpl::Hw => bw_iscsi::pdu::DigestImpl::Hardware,
            DigestImpl::Soft => bw_iscsi::pdu::DigestImpl::Soft,
        });
    }
}

impl TlsSealing {
    /// As the config says it.
    pub fn name(self) -> &'static str {
        match self {
            TlsSealing::Inline => "inline",
            TlsSealing::Thread => "thread",
        }
    }
}

/// AoE fanout: how frames are spread over an interface's workers.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum AoeFanout {
    /// Round robin (PACKET_FANOUT_LB).
    #[default]
    RoundRobin,
    /// By the CPU that received the frame, workers pinned to their CPU.
    Cpu,
}

impl std::str::FromStr for AoeFanout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "round-robin" => Ok(AoeFanout::RoundRobin),
            "cpu" => Ok(AoeFanout::Cpu),
            _ => Err(format!("{s:?}: expected round-robin or cpu")),
        }
    }
}

/// Upper bounds: beyond these a knob only wastes threads.
pub const MAX_AOE_WORKERS: usize = 64;
pub const MAX_AOE_IO_THREADS: usize = 256;

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            aoe_workers: 0,
            aoe_io_threads: 0,
            aoe_fanout: AoeFanout::RoundRobin,
            aoe_datapath: Datapath::Auto,
            iscsi_connection_threads: true,
            zero_copy_min: 32 * 1024,
            mapped_reads: true,
            inline_max: 64 * 1024,
            commands_per_send: 0,
            tcp_congestion: Congestion::Auto,
            digest_impl: DigestImpl::Hw,
            tls_records: TlsRecords::Auto,
            tls_sealing: TlsSealing::Inline,
        }
    }
}

impl Tuning {
    pub fn validate(&self) -> Result<(), String> {
        if self.aoe_workers > MAX_AOE_WORKERS {
            return Err(format!(
                "tuning.aoe_workers {} is above {MAX_AOE_WORKERS}",
                self.aoe_workers
            ));
        }
        if self.aoe_io_threads > MAX_AOE_IO_THREADS {
            return Err(format!(
                "tuning.aoe_io_threads {} is above {MAX_AOE_IO_THREADS}",
                self.aoe_io_threads
            ));
        }
        Ok(())
    }

    /// [`Tuning::commands_per_send`] as a count (0: never in the middle).
    pub fn commands_per_send(&self) -> usize {
        match self.commands_per_send {
            0 => usize::MAX,
            n => n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bounds() {
        let t = Tuning::default();
        assert!(t.validate().is_ok());
        assert_eq!(t.commands_per_send(), usize::MAX);
        assert_eq!(Tuning { commands_per_send: 8, ..t.clone() }.commands_per_send(), 8);
        assert!(Tuning {
            aoe_workers: 65,
            ..t.clone()
        }
        .validate()
        .is_err());
        assert!(Tuning {
            aoe_io_threads: 257,
            ..t.clone()
        }
        .validate()
        .is_err());
        let toml: Tuning = toml::from_str("aoe_fanout = \"cpu\"\niscsi_inline_max = 4096").unwrap();
        assert_eq!(
            (
                toml.aoe_fanout,
                toml.inline_max,
                toml.zero_copy_min
            ),
            (AoeFanout::Cpu, 4096, 32 * 1024)
        );
        assert_eq!(toml.tcp_congestion, Congestion::Auto);
        assert_eq!(toml.digest_impl, DigestImpl::Hw);
        let soft: Tuning = toml::from_str("digest_impl = \"soft\"").unwrap();
        assert_eq!(soft.digest_impl, DigestImpl::Soft);
        assert!(toml::from_str::<Tuning>("digest_impl = \"fast\"").is_err());
        let t: Tuning = toml::from_str("tls_records = \"user\"").unwrap();
        assert_eq!(bw_tls::RecordChoice::from(t.tls_records), bw_tls::RecordChoice::User);
        assert!(toml::from_str::<Tuning>("tls_records = \"openssl\"").is_err());
        assert_eq!(Tuning::default().tls_sealing, TlsSealing::Inline);
        let t: Tuning = toml::from_str("tls_sealing = \"thread\"").unwrap();
        assert_eq!(t.tls_sealing, TlsSealing::Thread);
        assert!(toml::from_str::<Tuning>("tls_sealing = \"helper\"").is_err());
        let cc: Tuning = toml::from_str("tcp_congestion = \"cubic\"").unwrap();
        assert_eq!(cc.tcp_congestion, Congestion::Named("cubic".into()));
        let old: Tuning = toml::from_str("iscsi_zero_copy_min = 4096").unwrap();
        assert_eq!(old.zero_copy_min, 4096, "the former name still works");
        let old: Tuning = toml::from_str("iscsi_flush_every = 1").unwrap();
        assert_eq!(old.commands_per_send(), 1, "the former name still works");
        let new: Tuning = toml::from_str("inline_max = 8192").unwrap();
        assert_eq!(new.inline_max, 8192);
        assert!(toml::from_str::<Tuning>("tcp_congestion = \"no such\"").is_err());
        assert!(
            toml::from_str::<Tuning>("aoe_wrokers = 2").is_err(),
            "unknown keys are refused"
        );
        assert_eq!("cpu".parse::<AoeFanout>(), Ok(AoeFanout::Cpu));
        assert!("rr".parse::<AoeFanout>().is_err());
    }
}
