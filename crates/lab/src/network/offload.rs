//! NIC offloads of the lab's links, set in one place for every suite: the
//! storage lab's default, the route suite's, and the offload study's two
//! (`--offload none,stateless`).
//!
//! On a veth an offload does not move work into hardware, it skips it: with
//! checksum offload the checksum is never computed (the frame never leaves
//! the machine), with TSO/GSO one 64 KiB super-frame crosses instead of ~45
//! MTU-sized ones. So `stateless` against `none` on veth bounds from above
//! what a stateless-offload NIC can save; a TOE or an iSCSI HBA, which take
//! the TCP or iSCSI state itself off the CPU, cannot be emulated here.

use crate::hosts::host::Host;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Offload {
    /// The storage lab's default: hosts with the kernel's own receive path
    /// behind a NIC that does not segment. TSO and GSO off, so frames on
    /// the veth have real MTU sizes and frames/op and MTU effects mean what
    /// they say (TCP still builds large packets and cuts them just before
    /// the device: the kernel turns GSO on for every TCP socket whatever the
    /// device says). GRO on, as every Linux host has it on a real NIC: the
    /// receiver merges the MTU-sized frames after the link, so frames on
    /// the wire do not change. With GRO off (the default until 2026-11-25)
    /// the lab modelled a receive path nobody runs, and on veth, which
    /// delivers in the sender's softirq, charged it to the sender: the
    /// target paid for the client's per-segment receive, 1 MiB reads ran
    /// at the speed of one CPU doing both ends' work, and NVMe/TCP, whose
    /// initiator waits for a payload to arrive before reading it, lost 1 MiB
    /// reads to iSCSI 0.69-0.72x at MTU 1500 where with GRO it leads
    /// 1.09-1.11x (docs/notes/2026-11-25-lab-link-gro.md).
    /// Checksums and scatter-gather as the device has them.
    #[default]
    MtuFrames,
    /// The route suite's: also transmit checksums off, since a software
    /// router relays frames as they are and needs finished checksums.
    Routed,
    /// `--offload none`: checksums (both ways), scatter-gather, TSO, GSO
    /// and GRO off on both ends: the CPU does everything.
    None,
    /// `--offload stateless`: all of them on.
    Stateless,
}

/// `--offload` values, in run order.
pub const STUDY: [Offload; 2] = [Offload::None, Offload::Stateless];

impl Offload {
    /// The name in `--offload`, results.json and the report; empty for the
    /// defaults, which results do not name.
    pub fn name(self) -> &'static str {
        match self {
            Offload::MtuFrames | Offload::Routed => "",
            Offload::None => "none",
            Offload::Stateless => "stateless",
        }
    }

    /// How a sample records it.
    pub fn factor(self) -> bw_lab_results::OffloadFactor {
        match self {
            Offload::MtuFrames | Offload::Routed => bw_lab_results::OffloadFactor::Default,
            Offload::None => bw_lab_results::OffloadFactor::None,
            Offload::Stateless => bw_lab_results::OffloadFactor::Stateless,
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Offload> {
        STUDY
            .into_iter()
            .find(|o| o.name() == s.trim())
            .ok_or_else(|| anyhow::anyhow!("--offload {s:?}: expected none or stateless"))
    }

    /// The `ethtool -K` features it sets (the others stay as they are).
    pub fn features(self) -> Vec<(&'static str, bool)> {
        let all = |on: bool| crate::hosts::host::OFFLOAD_FEATURES.iter().map(|(k, _)| (*k, on)).collect();
        match self {
            Offload::MtuFrames => vec![("tso", false), ("gso", false), ("gro", true)],
            Offload::Routed => vec![("tx", false), ("tso", false), ("gso", false), ("gro", false)],
            Offload::None => all(false),
            Offload::Stateless => all(true),
        }
    }

    /// Whether a veth pair set this way hands every frame to its receiving
    /// end through NAPI: GRO on there, and TSO off at the sender (with TSO
    /// on, the kernel's veth takes the NAPI path only for frames it could
    /// merge, not TCP's; veth_skb_is_eligible_for_gro).
    pub fn veth_rx_napi(self) -> bool {
        let f = self.features();
        f.contains(&("gro", true)) && f.contains(&("tso", false))
    }

    /// Set it on `dev` of `host`, and check that the device took it (a
    /// device may refuse a feature it has fixed).
    pub fn apply(self, host: &Host, dev: &str) -> anyhow::Result<()> {
        let want = self.features();
        host.set_offloads(dev, &want)?;
        let now = host.offloads(dev)?;
        let refused: Vec<&str> = want.iter().filter(|w| !now.contains(w)).map(|(k, _)| *k).collect();
        anyhow::ensure!(refused.is_empty(), "{dev} in {} kept {refused:?} as they were (fixed features?)", host.name());
        Ok(())
    }
}

/// iSCSI HeaderDigest/DataDigest and NVMe/TCP HDGST/DDGST (`--digest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Digest {
    #[default]
    None,
    /// CRC32C with the CPU's CRC instruction (both ends).
    Crc32c,
    /// CRC32C with portable tables on both ends (serve's `[tuning]
    /// digest_impl = "soft"`, bench's `--digest-impl soft`): a CPU or NIC
    /// without CRC help.
    Crc32cSoft,
}

impl Digest {
    pub const ALL: [Digest; 3] = [Digest::None, Digest::Crc32c, Digest::Crc32cSoft];

    /// The name in `--digest`.
    pub fn name(self) -> &'static str {
        match self {
            Digest::None => "none",
            Digest::Crc32c => "crc32c",
            Digest::Crc32cSoft => "crc32c-soft",
        }
    }

    /// The name a sample's factors record (empty: the default, none).
    /// How a sample records it.
    pub fn factor(self) -> bw_lab_results::DigestFactor {
        match self {
            Digest::None => bw_lab_results::DigestFactor::Off,
            Digest::Crc32c => bw_lab_results::DigestFactor::Crc32c,
            Digest::Crc32cSoft => bw_lab_results::DigestFactor::Crc32cSoft,
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Digest> {
        Digest::ALL
            .into_iter()
            .find(|d| d.name() == s.trim())
            .ok_or_else(|| anyhow::anyhow!("--digest {s:?}: expected none, crc32c or crc32c-soft"))
    }

    /// `blockwire bench` options that ask for it.
    pub fn bench_args(self) -> &'static [&'static str] {
        match self {
            Digest::None => &[],
            Digest::Crc32c => &["--header-digest", "--data-digest"],
            Digest::Crc32cSoft => &["--header-digest", "--data-digest", "--digest-impl", "soft"],
        }
    }
}

/// NVMe/TCP over TLS 1.3 (`--tls`): blockwire's NVMe/TCP target requires
/// it (a PSK the lab makes for the run) and `blockwire bench` connects with
/// `?tls`. Which record layer a connection used (the kernel's, kTLS, or
/// the user-space one) is the bench's to say, and the report shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tls {
    #[default]
    Off,
    On,
}

impl Tls {
    pub const ALL: [Tls; 2] = [Tls::Off, Tls::On];

    /// The name in `--tls`.
    pub fn name(self) -> &'static str {
        match self {
            Tls::Off => "off",
            Tls::On => "on",
        }
    }

    /// The name a sample's factors record (empty: the default, off).
    /// How a sample records it.
    pub fn factor(self) -> bw_lab_results::TlsFactor {
        match self {
            Tls::Off => bw_lab_results::TlsFactor::Off,
            Tls::On => bw_lab_results::TlsFactor::On,
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Tls> {
        Tls::ALL.into_iter().find(|t| t.name() == s.trim()).ok_or_else(|| anyhow::anyhow!("--tls {s:?}: expected off or on"))
    }
}

/// What the offloads of one device were before the lab changed them.
/// The factors a sample at `(offload, digest, tls)` records.
pub fn recorded(offload: Offload, digest: Digest, tls: Tls) -> bw_lab_results::Factors {
    bw_lab_results::Factors { offload: offload.factor(), digest: digest.factor(), tls: tls.factor() }
}

#[derive(Debug, Clone)]
pub struct Saved {
    pub host: Host,
    pub dev: String,
    pub features: Vec<(&'static str, bool)>,
}

impl Saved {
    pub fn take(host: &Host, dev: &str) -> anyhow::Result<Saved> {
        Ok(Saved { host: host.clone(), dev: dev.to_string(), features: host.offloads(dev)? })
    }

    /// The features as `ethtool -K DEV` takes them: `tx on rx off ...`.
    pub fn ethtool_args(&self) -> String {
        self.features.iter().map(|(k, on)| format!("{k} {}", if *on { "on" } else { "off" })).collect::<Vec<_>>().join(" ")
    }

    /// Put them back, and check they are back.
    pub fn restore(&self) -> anyhow::Result<()> {
        self.host.set_offloads(&self.dev, &self.features)?;
        let now = self.host.offloads(&self.dev)?;
        anyhow::ensure!(now == self.features, "offloads of {} in {} are {now:?} after restoring {:?}", self.dev, self.host.name(), self.features);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_features() {
        assert_eq!(Offload::parse("none").unwrap(), Offload::None);
        assert_eq!(Offload::parse(" stateless").unwrap(), Offload::Stateless);
        assert!(Offload::parse("toe").is_err());
        assert!(Offload::parse("").is_err(), "the default is not chosen by name");
        assert_eq!(Offload::None.features().len(), 6);
        assert!(Offload::None.features().iter().all(|(_, on)| !on));
        assert!(Offload::Stateless.features().iter().all(|(_, on)| *on));
        assert_eq!(Digest::parse("crc32c-soft").unwrap(), Digest::Crc32cSoft);
        assert!(Digest::parse("md5").is_err());
        assert_eq!((Digest::None.factor().name(), Digest::Crc32c.factor().name()), ("", "crc32c"));
        for d in Digest::ALL {
            // The recorded name is the flag's, but for the default.
            assert_eq!(d.factor().name(), if d == Digest::None { "" } else { d.name() });
        }
        for o in [Offload::MtuFrames, Offload::Routed, Offload::None, Offload::Stateless] {
            assert_eq!(o.factor().name(), o.name());
        }
        assert!(Offload::MtuFrames.features().iter().all(|(k, _)| ["tso", "gso", "gro"].contains(k)));
        let saved = Saved { host: Host::Local, dev: "eth0".into(), features: vec![("tx", true), ("gro", false)] };
        assert_eq!(saved.ethtool_args(), "tx on gro off");
    }
}
