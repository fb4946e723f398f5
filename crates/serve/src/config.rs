//! `blockwire serve` configuration: a TOML file, quick flags, or both (flags
//! add to the file). The same structure is printed (`--print-config`) and
//! saved (`--save-config`) as JSON, with every [`Secret`] shown as
//! `<redacted>` unless `--show-secrets` is given.
//!
//! ```toml
//! [[volume]]
//! name = "disk0"
//! backend = "file:/srv/disk0.img,size=10G,sync"
//!
//! [[aoe.export]]
//! interface = "eth1"
//! volume = "disk0"
//! shelf = 1
//! slot = 0
//! allow = ["02:00:00:00:00:01"]      # stations that may use it; empty: any (fixed: the wire cannot edit it)
//! broadcast_writes = false           # true: execute ATA writes sent to shelf 0xffff or slot 0xff
//!
//! [iscsi]
//! listen = ["0.0.0.0:3260"]
//! discovery_chap = { user = "scan", secret = "0a1b2c3d4e5f" }  # optional
//! [[iscsi.target]]
//! iqn = "iqn.2026-11.org.example:disk0"
//! luns = [{ lun = 0, volume = "disk0" }]
//! allowed_initiators = ["iqn.1993-08.org.debian:01:abc"]   # empty: anyone
//! chap = { user = "bob", secret = "0123456789ab" }
//! mutual_chap = { user = "target", secret = "ba9876543210" }
//! target_port_group = 1              # ALUA group id (default 1)
//! alua_state = "active-optimized"    # or active-non-optimized, standby, unavailable
//! relative_target_port = 1           # default: target_port_group; distinct per gateway
//!
//! [nvme]
//! listen = ["0.0.0.0:4420"]
//! discovery_listen = "0.0.0.0:8009"
//! tls = "none"                       # TLS 1.3 on the TCP ports: "none", "allowed" or "required"
//! # tls_ports = { "0.0.0.0:4421" = "required" }   # ports that differ from `tls`
//! # [[nvme.key]]                     # a named PSK file (SPDK's keyring_file_add_key), mode 600
//! # name = "key0"
//! # path = "/etc/blockwire/key0.psk"
//! # NVMe/RDMA on an RDMA device's address (RoCE, iWARP, IPoIB), same subsystems
//! # rdma_listen = ["192.168.50.1:4420"]
//! [[nvme.subsystem]]
//! nqn = "nqn.2026-11.org.example:disk0"
//! namespaces = [{ nsid = 1, volume = "disk0" }]         # ana_group = 1 by default
//! # A namespace only some hosts see (SPDK's no_auto_visible + nvmf_ns_add_host):
//! # namespaces = [{ nsid = 2, volume = "disk1", no_auto_visible = true, hosts = ["nqn.2014-08.org.nvmexpress:uuid:..."] }]
//! allowed_hosts = []                                        # empty: any host
//! ana_state = "optimized"   # this gateway's ANA state: or non-optimized, inaccessible, persistent-loss
//! # Gateways exporting one subsystem need distinct controller ids:
//! # [nvme] cntlid_range = [1, 999] on one, [1000, 1999] on the next.
//! [[nvme.subsystem.host]]    # in-band authentication (DH-HMAC-CHAP); listed hosts are allowed
//! nqn = "nqn.2014-08.org.nvmexpress:uuid:..."
//! dhchap_secret = "DHHC-1:00:...:"        # the host's key (`nvme gen-dhchap-key`)
//! dhchap_ctrl_secret = "DHHC-1:00:...:"   # optional: the controller proves itself too
//! dhchap_hashes = ["sha256", "sha384", "sha512"]              # optional, preference order
//! dhchap_dhgroups = ["ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192", "null"]
//! tls_psk = "NVMeTLSkey-1:01:...:"        # the host's TLS PSK (`nvme gen-tls-key`), or:
//! # tls_key = "key0"                      # one of [[nvme.key]]
//!
//! [limits]                           # per front-end (iSCSI, NVMe/TCP, NVMe/RDMA); these are the defaults
//! max_sessions = 4096                # iSCSI sessions / NVMe controllers, once logged in
//! max_discovery_sessions = 64        # iSCSI discovery sessions / NVMe discovery controllers
//! discovery_idle_timeout_s = 60      # an idle iSCSI discovery session, NVMe discovery controller (KATO 0) is closed
//! max_pending_logins = 1024          # connections not logged in yet, from all addresses
//! max_connections_per_address = 1024
//! login_timeout_s = 15               # accept to completed login / Connect
//!
//! [tuning]                           # measuring knobs; these are the defaults
//! aoe_workers = 0                    # receive threads per interface; 0: by export kind
//! aoe_io_threads = 0                 # I/O pool for device-backed AoE exports; 0: off (64 for rbd volumes)
//! aoe_fanout = "round-robin"         # or "cpu"
//! aoe_datapath = "auto"              # "xdp" (AF_XDP), "packet" (AF_PACKET); auto: AF_XDP where it works
//! iscsi_connection_threads = true    # false: connections as tasks on the shared runtime
//! zero_copy_min = 32768              # smallest READ sent with sendfile
//! mapped_reads = true                # shorter iSCSI and NVMe/TCP READs of memory-backed volumes sent from their mapping
//! inline_max = 65536                 # largest iSCSI/NVMe-TCP READ/WRITE copy run on the connection's thread
//! commands_per_send = 0              # commands taken before the answers so far are sent; 0: all buffered first
//! tcp_congestion = "auto"            # "system", or an algorithm ("cubic"); auto: no BBR to this machine
//! digest_impl = "hw"                 # CRC32C digests: "hw" (CPU instruction) or "soft" (portable tables)
//! tls_sealing = "inline"            # large reads' TLS records sealed on the connection's thread, or "thread" (a helper)
//!
//! [metrics]                          # Prometheus metrics at http://ADDR:PORT/metrics (docs/metrics.md)
//! listen = "127.0.0.1:9433"
//! ```

use std::collections::HashSet;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// Name prefixes used for the default target/subsystem of quick flags.
pub const DEFAULT_IQN_PREFIX: &str = "iqn.2026-11.org.blockwire";
/// Why a server without a control socket does not start empty.
pub const NO_VOLUMES: &str = "no volumes: give --volume NAME=BACKEND or [[volume]] in the config (or a control socket or --rpc-http, to add them with blockwire ctl, or a [[pool]] to create them in)";

pub const DEFAULT_NQN_PREFIX: &str = "nqn.2026-11.org.blockwire";

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// Directories serve owns, where `volume_create` makes volumes by name.
    #[serde(default, rename = "pool", skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolConfig>,
    #[serde(default, rename = "volume")]
    pub volumes: Vec<VolumeConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aoe: Option<AoeConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<IscsiConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvme: Option<NvmeConfig>,
    /// Admission limits of the iSCSI and NVMe/TCP front-ends (each counts on its own).
    #[serde(default)]
    pub limits: crate::limits::Limits,
    /// Threads and copies of the front-ends (see [`crate::tuning::Tuning`]).
    #[serde(default)]
    pub tuning: crate::tuning::Tuning,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsConfig>,
    /// What the control methods (the socket and `--rpc-http`) may reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<ControlConfig>,
}

/// `[control]`: whoever may call the control methods may otherwise name
/// any file on the host as a volume's backing file (and so read and
/// write it through an initiator) and any path as `save_config`'s target
/// (and so replace that file); docs/control.md says so.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// Directories that backing files added through the control methods
    /// (`volume_add`, `bdev_aio_create`), `save_config` targets and new
    /// pools' directories must lie in, after every link is followed. Each
    /// must be one only root may write (else a local user could swap a
    /// checked name for a link); pools' volumes are always allowed. Unset:
    /// anywhere; empty: nowhere but the pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_paths: Option<Vec<String>>,
}

/// `path` as it will be reached: every link followed, `.` and `..`
/// resolved; a missing tail (a file or directory to be made) is appended
/// to its nearest existing ancestor, and may not hold `.` or `..`.
fn resolve(path: &std::path::Path) -> Result<std::path::PathBuf, String> {
    match std::fs::canonicalize(path) {
        Ok(p) => Ok(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (Some(parent), Some(name)) = (path.parent().filter(|p| !p.as_os_str().is_empty()), path.file_name()) else {
                return Err(format!("{}: {e}", path.display()));
            };
            Ok(resolve(parent)?.join(name))
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

impl ServeConfig {
    /// Whether the control methods may name `path` (`what` it is, for the
    /// message): see [`ControlConfig::allowed_paths`]. Checked where each
    /// method names a path, so a change of `[control]` (SIGHUP) applies to
    /// the next call.
    pub fn check_allowed(&self, path: &std::path::Path, what: &str) -> Result<(), String> {
        let Some(allowed) = self.control.as_ref().and_then(|c| c.allowed_paths.as_ref()) else {
            return Ok(());
        };
        let real = resolve(path)?;
        if self.pools.iter().filter(|p| p.rbd.is_none()).any(|p| resolve(std::path::Path::new(&p.path)).is_ok_and(|d| real.starts_with(d))) {
            return Ok(());
        }
        for dir in allowed {
            let Ok(d) = std::fs::canonicalize(dir) else { continue };
            if real.starts_with(&d) {
                // Others may not write it: a name checked here could not
                // be swapped for a link before serve opens it.
                return bw_rootdir::RootDir::open(&d).map(drop).map_err(|e| format!("{what} {}: allowed path {dir}: {e}", path.display()));
            }
        }
        let listed = if allowed.is_empty() { "none is listed".to_string() } else { allowed.join(", ") };
        Err(format!("{what} {} (as resolved: {}) is outside [control] allowed_paths ({listed}) and outside every pool", path.display(), real.display()))
    }
}

/// `[metrics]`: where the Prometheus exposition is served (`--metrics`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    pub listen: SocketAddr,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VolumeConfig {
    pub name: String,
    /// Where the data is: written and read as the spec's text
    /// (`ram:1G`, `file:/srv/d.img,size=10G`, see
    /// `bw_block::BackendSpec::parse`).
    pub backend: bw_block::BackendSpec,
    /// The pool whose directory holds the volume's file: the volume was
    /// made by `volume_create`, `volume_snapshot` or `volume_clone`, and
    /// `volume_delete` removes its file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Stable identity (a UUID), reported as the SPDK bdev name and the
    /// NVMe namespace's UUID source; set for pool volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// A read-only point-in-time copy of this volume (a snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_of: Option<String>,
    /// A writable volume made from this snapshot (a clone), until it is
    /// inflated or the snapshot deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_of: Option<String>,
    /// Every block allocated at creation (not thin).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub thick: bool,
    /// QoS limits on the volume's I/O, every front-end alike
    /// (`bdev_set_qos_limit`, `volume_set_qos`); none: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<bw_block::QosLimits>,
    /// When a pool made the volume (seconds since the epoch): a CSI
    /// snapshot's creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_unix: Option<i64>,
}

impl VolumeConfig {
    /// A volume that is only its name and backend (not in a pool).
    pub fn new(name: impl Into<String>, backend: bw_block::BackendSpec) -> VolumeConfig {
        VolumeConfig { name: name.into(), backend, pool: None, uuid: None, snapshot_of: None, clone_of: None, thick: false, created_unix: None, qos: None }
    }
}

/// `[[pool]]`: a directory serve owns, or an RBD pool. In a directory
/// volumes are sparse files; snapshots and clones are reflinks (FICLONE:
/// xfs with reflink=1, btrfs), and a file system without reflinks is
/// refused for them unless `copy`. In an RBD pool volumes are images,
/// snapshots protected RBD snapshots, clones RBD clones of them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    /// An absolute path to a directory (created, mode 700, if missing);
    /// empty for an RBD pool.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// The Ceph pool whose images the volumes are (instead of `path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbd: Option<String>,
    /// With `rbd`: ceph.conf to read (librados' default search path
    /// otherwise) and the client id (`admin` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conf: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Snapshots and clones copy the data where reflinks are not
    /// supported: not instant, and a snapshot of an exported writable
    /// volume is then refused (writes during the copy would tear it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub copy: bool,
    /// Stable identity (the SPDK lvol store UUID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AoeConfig {
    #[serde(default, rename = "export")]
    pub exports: Vec<AoeExport>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AoeExport {
    pub interface: String,
    pub volume: String,
    pub shelf: u16,
    pub slot: u8,
    /// Initial Query Config string (empty by default; initiators may set it).
    #[serde(default)]
    pub config_string: String,
    /// Outstanding-request buffer count advertised in Query Config replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers: Option<u16>,
    /// MAC addresses of the stations that may use this export (empty: any).
    /// Others get no reply, and AoE's MAC Mask List command cannot edit it.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "mac_list")]
    pub allow: Vec<bw_aoe::Mac>,
    /// Execute ATA writes addressed to the broadcast shelf or slot; by
    /// default they are ignored (one frame would write every export).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub broadcast_writes: bool,
}

/// MAC addresses as `"aa:bb:cc:dd:ee:ff"` strings in the configuration.
mod mac_list {
    use bw_aoe::frame::{format_mac, parse_mac};
    use bw_aoe::Mac;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(macs: &[Mac], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(macs.iter().map(format_mac))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Mac>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|m| parse_mac(m).ok_or_else(|| D::Error::custom(format!("{m:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"))))
            .collect()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IscsiConfig {
    #[serde(default)]
    pub listen: Vec<SocketAddr>,
    #[serde(default, rename = "target")]
    pub targets: Vec<IscsiTarget>,
    /// Discovery sessions (SendTargets) must authenticate with these (CHAP);
    /// without them discovery is open (it still lists only the targets an
    /// initiator's ACLs allow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_chap: Option<Credentials>,
    /// The portal authenticates itself with these in discovery sessions
    /// (mutual CHAP); needs `discovery_chap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_mutual_chap: Option<Credentials>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IscsiTarget {
    pub iqn: String,
    #[serde(default = "one")]
    pub portal_group_tag: u16,
    pub luns: Vec<IscsiLun>,
    /// Initiator IQNs allowed to log in; empty means anyone.
    #[serde(default)]
    pub allowed_initiators: Vec<String>,
    /// Initiator must authenticate with these credentials (CHAP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<Credentials>,
    /// Target authenticates itself to the initiator with these (mutual CHAP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap: Option<Credentials>,
    /// ALUA target port group of this target's portals (REPORT TARGET PORT
    /// GROUPS, VPD 0x83); gateways exporting one volume use distinct ids.
    #[serde(default = "one")]
    pub target_port_group: u16,
    /// The group's asymmetric access state, as initiators should see it.
    #[serde(default)]
    pub alua_state: AluaStateConfig,
    /// Relative target port identifier of this gateway's portals (VPD 0x83,
    /// REPORT TARGET PORT GROUPS); distinct on every gateway of one LU.
    /// Default: the same number as `target_port_group`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relative_target_port: Option<u16>,
}

/// ALUA states a target port group can be configured in.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum AluaStateConfig {
    #[default]
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IscsiLun {
    pub lun: u64,
    pub volume: String,
    #[serde(default)]
    pub readonly: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    pub user: String,
    pub secret: Secret,
}

/// Shortest CHAP secret accepted: RFC 7143 section 12.1.3 asks for at
/// least 96 bits (12 bytes) so a captured exchange is not cracked offline.
pub const MIN_CHAP_SECRET_LEN: usize = 12;

/// The checks on one CHAP pair (one-way and mutual, each with its key's
/// name, in `scope`):
/// secrets of at least [`MIN_CHAP_SECRET_LEN`] bytes, and two different
/// secrets, since the RFC forbids one secret for both directions (a peer
/// could answer our challenge with our own response). Errors never include
/// a secret.
fn check_chap_pair(scope: &str, (name, chap): (&str, &Option<Credentials>), (mutual_name, mutual): (&str, &Option<Credentials>)) -> Result<(), String> {
    for (n, c) in [(name, chap), (mutual_name, mutual)] {
        if let Some(c) = c {
            let len = c.secret.expose().len();
            if len < MIN_CHAP_SECRET_LEN {
                return Err(format!("{scope}: {n}: the secret of user {:?} is {len} bytes; CHAP secrets must be at least {MIN_CHAP_SECRET_LEN} bytes (RFC 7143 12.1.3)", c.user));
            }
        }
    }
    if let (Some(a), Some(b)) = (chap, mutual) {
        if a.secret == b.secret {
            return Err(format!("{scope}: {name} and {mutual_name} have the same secret; mutual CHAP needs two different secrets (RFC 7143 12.1.3)"));
        }
    }
    Ok(())
}

/// What a redacted secret looks like in printed and saved configurations.
pub const REDACTED: &str = "<redacted>";

/// A secret from the configuration (CHAP secrets; any key added later must
/// use this type too). `Debug` and serialisation show [`REDACTED`], so a
/// secret reaches a log, `--print-config` or `--save-config` only inside
/// [`reveal_secrets`]; [`Secret::expose`] gives the value to the code that
/// authenticates.
/// The value is wiped from memory when dropped.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Secret(zeroize::Zeroizing<String>);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(zeroize::Zeroizing::new(s.into()))
    }
    /// The secret itself, for authentication only: never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Secret {
    type Error = String;
    fn try_from(s: String) -> Result<Secret, String> {
        if s == REDACTED {
            // A configuration saved without --show-secrets, loaded back.
            return Err(format!("a secret reads {REDACTED:?}: this configuration was saved without --show-secrets; write the real secret"));
        }
        Ok(Secret::new(s))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

thread_local! {
    static REVEAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if REVEAL.with(|r| r.get()) {
            s.serialize_str(self.expose())
        } else {
            s.serialize_str(REDACTED)
        }
    }
}

/// Run `f` with secrets serialised as themselves (on this thread only), for
/// an explicit `--show-secrets`.
pub fn reveal_secrets<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            REVEAL.with(|r| r.set(self.0));
        }
    }
    let _restore = Restore(REVEAL.with(|r| r.replace(true)));
    f()
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvmeConfig {
    #[serde(default)]
    pub listen: Vec<SocketAddr>,
    /// NVMe/RDMA listeners (`rdma_listen = ["10.0.0.1:4420"]`): addresses
    /// of RDMA devices' network interfaces (RoCE, iWARP, IPoIB).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma_listen: Vec<SocketAddr>,
    /// Discovery controller listener (port 8009 by convention). The I/O
    /// listeners answer discovery connects too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_listen: Option<SocketAddr>,
    #[serde(default, rename = "subsystem")]
    pub subsystems: Vec<NvmeSubsystem>,
    /// Controller ids this gateway hands out, inclusive. Several gateways
    /// exporting one subsystem to one host must not overlap: Linux refuses
    /// a second controller with an id it already has in the subsystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cntlid_range: Option<[u16; 2]>,
    /// TLS 1.3 (NVMe/TCP TP 8011) on the NVMe/TCP ports (`listen` and
    /// `discovery_listen`), as the discovery log announces it.
    #[serde(default, skip_serializing_if = "TlsMode::is_none")]
    pub tls: TlsMode,
    /// Ports whose TLS is not `tls` (`nvme_port_add` with `tls`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tls_ports: std::collections::BTreeMap<SocketAddr, TlsMode>,
    /// Named PSK files (SPDK's `keyring_file_add_key`), for hosts' `tls_key`.
    #[serde(default, rename = "key", skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<NvmeKey>,
}

impl NvmeConfig {
    /// The TLS mode of the TCP port configured as `addr`.
    pub fn tls_of(&self, addr: &SocketAddr) -> TlsMode {
        self.tls_ports.get(addr).copied().unwrap_or(self.tls)
    }
}

/// Whether an NVMe/TCP port runs TLS 1.3 (NVMe/TCP TP 8011).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Plaintext only.
    #[default]
    None,
    /// TLS or plaintext, as each host starts.
    Allowed,
    /// TLS only: a plaintext ICReq is refused.
    Required,
}

impl TlsMode {
    fn is_none(&self) -> bool {
        *self == TlsMode::None
    }
    pub fn parse(s: &str) -> Option<TlsMode> {
        Some(match s {
            "none" => TlsMode::None,
            "allowed" => TlsMode::Allowed,
            "required" => TlsMode::Required,
            _ => return None,
        })
    }
}

impl From<TlsMode> for bw_nvme::logpage::SecureChannel {
    fn from(m: TlsMode) -> Self {
        match m {
            TlsMode::None => bw_nvme::logpage::SecureChannel::None,
            TlsMode::Allowed => bw_nvme::logpage::SecureChannel::Allowed,
            TlsMode::Required => bw_nvme::logpage::SecureChannel::Required,
        }
    }
}

/// A PSK in a file of its own (`NVMeTLSkey-1:...`, its first line), by name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvmeKey {
    pub name: String,
    pub path: std::path::PathBuf,
}

impl NvmeKey {
    /// The PSK the file holds; the file must be a regular file of mode 600
    /// or stricter (as SPDK's keyring_file insists), not a link.
    pub fn read(&self) -> Result<bw_nvme::tls_psk::ConfiguredPsk, String> {
        use std::os::unix::fs::PermissionsExt;
        let p = &self.path;
        let m = std::fs::symlink_metadata(p).map_err(|e| format!("key {:?}: {}: {e}", self.name, p.display()))?;
        if !m.file_type().is_file() {
            return Err(format!("key {:?}: {} is not a regular file", self.name, p.display()));
        }
        if m.permissions().mode() & 0o077 != 0 {
            return Err(format!("key {:?}: {} is readable by others (mode {:o}): keys must be mode 600", self.name, p.display(), m.permissions().mode() & 0o777));
        }
        let text = zeroize::Zeroizing::new(std::fs::read_to_string(p).map_err(|e| format!("key {:?}: {}: {e}", self.name, p.display()))?);
        let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
        bw_nvme::tls_psk::ConfiguredPsk::parse(line).map_err(|e| format!("key {:?} ({}): {e}", self.name, p.display()))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvmeSubsystem {
    pub nqn: String,
    pub namespaces: Vec<NvmeNamespace>,
    /// Host NQNs allowed to connect; empty means any host.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// SPDK's switch: `true` lets any host connect whatever the lists say;
    /// `false` only the listed ones, so none while both lists are empty.
    /// Unset: any host while no host is listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_any_host: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// This gateway's ANA state for the subsystem's namespaces (every
    /// gateway of one subsystem reports its own).
    #[serde(default)]
    pub ana_state: AnaStateConfig,
    /// Hosts that authenticate in band (DH-HMAC-CHAP). Each is allowed to
    /// connect, as if listed in `allowed_hosts`; once any is listed, hosts
    /// in neither list are refused.
    #[serde(default, rename = "host", skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<NvmeHost>,
}

/// One host's keys on a subsystem: DH-HMAC-CHAP and/or a TLS PSK.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvmeHost {
    pub nqn: String,
    /// The host's key, `DHHC-1:<hh>:<base64>:` (`nvme gen-dhchap-key`):
    /// with it the host authenticates in band on every queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_secret: Option<Secret>,
    /// The controller's key: with it, the controller proves itself to a
    /// host that asks (`nvme connect --dhchap-ctrl-secret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_secret: Option<Secret>,
    /// Hash functions the controller may pick, in preference order
    /// (default sha256, sha384, sha512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_hashes: Option<Vec<String>>,
    /// DH groups the controller may pick, in preference order (default
    /// ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192, null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_dhgroups: Option<Vec<String>>,
    /// The host's configured TLS PSK, `NVMeTLSkey-1:<hh>:<base64>:`
    /// (`nvme gen-tls-key`), for the subsystem's TLS ports ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_psk: Option<Secret>,
    /// ... or the name of an `[[nvme.key]]` holding it (SPDK's `psk`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<String>,
}

impl NvmeHost {
    /// A host with keys of neither kind (only allowed).
    pub fn new(nqn: impl Into<String>) -> NvmeHost {
        NvmeHost { nqn: nqn.into(), dhchap_secret: None, dhchap_ctrl_secret: None, dhchap_hashes: None, dhchap_dhgroups: None, tls_psk: None, tls_key: None }
    }

    /// The host's TLS PSK, read (a `tls_key` from its file among `keys`);
    /// None when it has none.
    pub fn tls_psk(&self, keys: &[NvmeKey]) -> Result<Option<bw_nvme::tls_psk::ConfiguredPsk>, String> {
        match (&self.tls_psk, &self.tls_key) {
            (Some(_), Some(_)) => Err("tls_psk and tls_key: give one".into()),
            (Some(s), None) => bw_nvme::tls_psk::ConfiguredPsk::parse(s.expose()).map(Some).map_err(|e| format!("tls_psk: {e}")),
            (None, Some(name)) => keys.iter().find(|k| &k.name == name).ok_or_else(|| format!("tls_key {name:?}: no [[nvme.key]] of that name"))?.read().map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The authentication settings, checked: secrets parse (with their
    /// CRC), names are known, lists are not empty. None without
    /// `dhchap_secret` (then no other DH-HMAC-CHAP setting may be there).
    pub fn auth_config(&self) -> Result<Option<bw_nvme::auth::AuthConfig>, String> {
        use bw_nvme::auth::{AuthConfig, DhGroup, HashId, Secret as Key};
        let Some(secret) = &self.dhchap_secret else {
            if self.dhchap_ctrl_secret.is_some() || self.dhchap_hashes.is_some() || self.dhchap_dhgroups.is_some() {
                return Err("DH-HMAC-CHAP settings need dhchap_secret".into());
            }
            return Ok(None);
        };
        let host_key = Key::parse(secret.expose()).map_err(|e| format!("dhchap_secret: {e}"))?;
        let ctrl_key = match &self.dhchap_ctrl_secret {
            Some(s) => Some(Key::parse(s.expose()).map_err(|e| format!("dhchap_ctrl_secret: {e}"))?),
            None => None,
        };
        if ctrl_key.as_ref() == Some(&host_key) {
            return Err("dhchap_ctrl_secret equals dhchap_secret; bidirectional authentication needs two different keys".into());
        }
        let mut cfg = AuthConfig::new(host_key, ctrl_key);
        if let Some(names) = &self.dhchap_hashes {
            cfg.hashes = names.iter().map(|n| HashId::from_name(n).ok_or_else(|| format!("dhchap_hashes: unknown hash {n:?} (sha256, sha384, sha512)"))).collect::<Result<_, _>>()?;
        }
        if let Some(names) = &self.dhchap_dhgroups {
            cfg.groups = names
                .iter()
                .map(|n| DhGroup::from_name(n).ok_or_else(|| format!("dhchap_dhgroups: unknown group {n:?} (null, ffdhe2048 .. ffdhe8192)")))
                .collect::<Result<_, _>>()?;
        }
        if cfg.hashes.is_empty() || cfg.groups.is_empty() {
            return Err("dhchap_hashes and dhchap_dhgroups must not be empty".into());
        }
        Ok(Some(cfg))
    }
}

/// ANA states a gateway can report for its path to a subsystem.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum AnaStateConfig {
    #[default]
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvmeNamespace {
    pub nsid: u32,
    pub volume: String,
    #[serde(default)]
    pub readonly: bool,
    /// ANA group of the namespace, the same on every gateway (1..=128).
    #[serde(default = "one_u32")]
    pub ana_group: u32,
    /// The namespace's identifiers, as hosts see them (by-id links, UUID
    /// lookups), to stand in for another target's namespace: `uuid` and
    /// `nguid` (32 hex digits, dashes allowed, as "8-4-4-4-12"), `eui64`
    /// (16 hex digits). Unset, UUID and NGUID are derived from
    /// the subsystem NQN and NSID, and there is no EUI-64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nguid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eui64: Option<String>,
    /// Visible only to the hosts in `hosts` (SPDK's `no_auto_visible`);
    /// by default every host the subsystem allows sees the namespace.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_auto_visible: bool,
    /// The host NQNs that see a `no_auto_visible` namespace
    /// (`nvmf_ns_add_host`); they must be allowed on the subsystem too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

impl NvmeNamespace {
    /// A namespace with the derived identifiers, visible to every allowed host.
    pub fn new(nsid: u32, volume: String, readonly: bool, ana_group: u32) -> NvmeNamespace {
        NvmeNamespace { nsid, volume, readonly, ana_group, uuid: None, nguid: None, eui64: None, no_auto_visible: false, hosts: vec![] }
    }

    /// Which hosts see the namespace: `None` for every allowed host.
    pub fn visible_to(&self) -> Option<Vec<String>> {
        self.no_auto_visible.then(|| self.hosts.clone())
    }

    /// The identifiers set, parsed: (UUID, NGUID, EUI-64).
    pub fn ids(&self) -> Result<NamespaceIds, String> {
        fn parse<const N: usize>(what: &str, v: &Option<String>) -> Result<Option<[u8; N]>, String> {
            let Some(text) = v else { return Ok(None) };
            let digits: String = text.chars().filter(|c| *c != '-').collect();
            let bad = || format!("{what} {text:?}: expected {} hex digits (dashes allowed)", N * 2);
            if digits.len() != N * 2 || !digits.is_ascii() {
                return Err(bad());
            }
            let mut out = [0u8; N];
            for (i, b) in out.iter_mut().enumerate() {
                *b = u8::from_str_radix(&digits[i * 2..i * 2 + 2], 16).map_err(|_| bad())?;
            }
            Ok(Some(out))
        }
        Ok(NamespaceIds { uuid: parse("uuid", &self.uuid)?, nguid: parse("nguid", &self.nguid)?, eui64: parse("eui64", &self.eui64)? })
    }
}

/// A namespace's identifiers as set (`None`: derived, or none for EUI-64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NamespaceIds {
    pub uuid: Option<[u8; 16]>,
    pub nguid: Option<[u8; 16]>,
    pub eui64: Option<[u8; 8]>,
}

fn one() -> u16 {
    1
}

fn one_u32() -> u32 {
    1
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read { path: String, source: std::io::Error },
    #[error("config {path}")]
    Parse { path: String, source: toml::de::Error },
    #[error("{0}")]
    Invalid(String),
}

impl ServeConfig {
    pub fn from_toml_file(path: &str) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.into(), source })
    }

    /// The configuration as a TOML file the server starts from, secrets
    /// included (write it with mode 600).
    pub fn to_toml(&self) -> String {
        reveal_secrets(|| toml::to_string(self)).expect("a configuration always serialises")
    }

    /// The configuration as pretty JSON; secrets redacted unless `show_secrets`.
    pub fn to_json(&self, show_secrets: bool) -> String {
        let json = || serde_json::to_string_pretty(self).expect("a configuration always serialises");
        if show_secrets { reveal_secrets(json) } else { json() }
    }

    /// Whether any secret is configured (the file holding them must be
    /// private). Counts every [`Secret`] field, present and future.
    pub fn has_secrets(&self) -> bool {
        self.to_json(false).contains(&format!("\"{REDACTED}\""))
    }

    /// `NAME=BACKEND[,opts]` from `--volume`.
    pub fn add_volume_flag(&mut self, flag: &str) -> Result<(), ConfigError> {
        let (name, backend) = flag
            .split_once('=')
            .ok_or_else(|| ConfigError::Invalid(format!("--volume {flag:?}: expected NAME=BACKEND[,options]")))?;
        let backend = bw_block::BackendSpec::parse(backend.trim()).map_err(|e| ConfigError::Invalid(format!("--volume {flag:?}: {e}")))?;
        self.volumes.push(VolumeConfig::new(name.trim(), backend));
        Ok(())
    }

    /// `IFACE,volume=NAME,shelf=N,slot=M[,buffers=N][,config=STRING][,allow=MAC]...[,broadcast_writes=yes]`
    /// from `--aoe` (`allow` may be repeated).
    pub fn add_aoe_flag(&mut self, flag: &str) -> Result<(), ConfigError> {
        let bad = |why: &str| ConfigError::Invalid(format!("--aoe {flag:?}: {why}"));
        let mut parts = flag.split(',');
        let interface = parts.next().filter(|s| !s.is_empty()).ok_or_else(|| bad("missing interface"))?;
        let (mut volume, mut shelf, mut slot, mut buffers, mut config_string) = (None, None, None, None, String::new());
        let (mut allow, mut broadcast_writes) = (Vec::new(), false);
        for p in parts {
            let (k, v) = p.split_once('=').ok_or_else(|| bad("expected key=value"))?;
            match k {
                "volume" => volume = Some(v.to_string()),
                "shelf" => shelf = Some(v.parse::<u16>().map_err(|_| bad("shelf must be 0..65534"))?),
                "slot" => slot = Some(v.parse::<u8>().map_err(|_| bad("slot must be 0..254"))?),
                "buffers" => buffers = Some(v.parse::<u16>().map_err(|_| bad("buffers must be a number"))?),
                "config" => config_string = v.to_string(),
                "allow" => allow.push(bw_aoe::frame::parse_mac(v).ok_or_else(|| bad("allow must be a MAC address (aa:bb:cc:dd:ee:ff)"))?),
                "broadcast_writes" => {
                    broadcast_writes = match v {
                        "yes" | "true" => true,
                        "no" | "false" => false,
                        _ => return Err(bad("broadcast_writes must be yes or no")),
                    }
                }
                _ => return Err(bad(&format!("unknown key {k:?}"))),
            }
        }
        let volume = match volume {
            Some(v) => v,
            None if self.volumes.len() == 1 => self.volumes[0].name.clone(),
            None => return Err(bad("volume=NAME is required when there is not exactly one volume")),
        };
        self.aoe.get_or_insert_with(Default::default).exports.push(AoeExport {
            interface: interface.into(),
            volume,
            shelf: shelf.unwrap_or(0),
            slot: slot.unwrap_or(0),
            config_string,
            buffers,
            allow,
            broadcast_writes,
        });
        Ok(())
    }

    /// `--iscsi ADDR[:PORT]`: listen there; with no target configured, export
    /// every volume as LUNs 0.. of one default target open to anyone.
    pub fn add_iscsi_flag(&mut self, addr: &str) -> Result<(), ConfigError> {
        let sa = parse_listen(addr, 3260)?;
        let ic = self.iscsi.get_or_insert_with(Default::default);
        ic.listen.push(sa);
        if ic.targets.is_empty() {
            let host = hostname();
            ic.targets.push(IscsiTarget {
                iqn: format!("{DEFAULT_IQN_PREFIX}:{host}"),
                portal_group_tag: 1,
                luns: self
                    .volumes
                    .iter()
                    .enumerate()
                    .map(|(i, v)| IscsiLun { lun: i as u64, volume: v.name.clone(), readonly: false })
                    .collect(),
                allowed_initiators: vec![],
                chap: None,
                mutual_chap: None,
                target_port_group: 1,
                alua_state: AluaStateConfig::default(),
                relative_target_port: None,
            });
        }
        Ok(())
    }

    /// `--nvme ADDR[:PORT]`: like `--iscsi`, namespaces 1.. of one default subsystem.
    pub fn add_nvme_flag(&mut self, addr: &str) -> Result<(), ConfigError> {
        let sa = parse_listen(addr, 4420)?;
        let nc = self.nvme.get_or_insert_with(Default::default);
        nc.listen.push(sa);
        if nc.discovery_listen.is_none() {
            nc.discovery_listen = Some(SocketAddr::new(sa.ip(), 8009));
        }
        self.default_nvme_subsystem();
        Ok(())
    }

    /// `--nvme-rdma ADDR[:PORT]`: an NVMe/RDMA listener, with the same
    /// default subsystem as `--nvme`.
    pub fn add_nvme_rdma_flag(&mut self, addr: &str) -> Result<(), ConfigError> {
        let sa = parse_listen(addr, 4420)?;
        self.nvme.get_or_insert_with(Default::default).rdma_listen.push(sa);
        self.default_nvme_subsystem();
        Ok(())
    }

    /// Without a configured subsystem, every volume becomes a namespace of
    /// one (none without volumes: a control-driven target starts empty).
    fn default_nvme_subsystem(&mut self) {
        let nc = self.nvme.get_or_insert_with(Default::default);
        if nc.subsystems.is_empty() && !self.volumes.is_empty() {
            let host = hostname();
            nc.subsystems.push(NvmeSubsystem {
                nqn: format!("{DEFAULT_NQN_PREFIX}:{host}"),
                namespaces: self
                    .volumes
                    .iter()
                    .enumerate()
                    .map(|(i, v)| NvmeNamespace::new(i as u32 + 1, v.name.clone(), false, 1))
                    .collect(),
                allowed_hosts: vec![],
                allow_any_host: None,
                serial: None,
                model: None,
                ana_state: AnaStateConfig::default(),
                hosts: vec![],
            });
        }
    }

    /// Where `volume` is exported, one line each (`iSCSI IQN LUN n`,
    /// `NVMe NQN namespace n`, `AoE s.l on IFACE`).
    pub fn exports_of(&self, volume: &str) -> Vec<String> {
        let mut v = Vec::new();
        for t in self.iscsi.iter().flat_map(|i| &i.targets) {
            v.extend(t.luns.iter().filter(|l| l.volume == volume).map(|l| format!("iSCSI {} LUN {}", t.iqn, l.lun)));
        }
        for s in self.nvme.iter().flat_map(|n| &n.subsystems) {
            v.extend(s.namespaces.iter().filter(|n| n.volume == volume).map(|n| format!("NVMe {} namespace {}", s.nqn, n.nsid)));
        }
        for e in self.aoe.iter().flat_map(|a| &a.exports) {
            if e.volume == volume {
                v.push(format!("AoE {}.{} on {}", e.shelf, e.slot, e.interface));
            }
        }
        v
    }

    /// Every export of `volume` removed: its LUNs, namespaces, AoE exports.
    pub fn unexport(&mut self, volume: &str) {
        for t in self.iscsi.iter_mut().flat_map(|i| &mut i.targets) {
            t.luns.retain(|l| l.volume != volume);
        }
        for s in self.nvme.iter_mut().flat_map(|n| &mut n.subsystems) {
            s.namespaces.retain(|n| n.volume != volume);
        }
        if let Some(a) = &mut self.aoe {
            a.exports.retain(|e| e.volume != volume);
        }
    }

    /// What a server may start with: a valid configuration, with volumes
    /// unless it is `controlled` (has a control socket to be given them:
    /// a control-driven target starts empty).
    pub fn validate_start(&self, controlled: bool) -> Result<(), ConfigError> {
        self.validate()?;
        if self.volumes.is_empty() && self.pools.is_empty() && !controlled {
            return Err(ConfigError::Invalid(NO_VOLUMES.into()));
        }
        Ok(())
    }

    /// Cross-checks that TOML syntax cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.refuse_control_characters()?;
        self.limits.validate().map_err(ConfigError::Invalid)?;
        self.tuning.validate().map_err(ConfigError::Invalid)?;
        for a in self.control.iter().flat_map(|c| c.allowed_paths.iter().flatten()) {
            if !std::path::Path::new(a).is_absolute() {
                return Err(ConfigError::Invalid(format!("[control] allowed_paths: {a:?} is not an absolute path")));
            }
        }
        let pools = self.validate_pools()?;
        let volumes = self.validate_volumes(&pools)?;
        let known = |n: &str| volumes.contains(n);
        if let Some(a) = &self.aoe {
            a.validate(&known)?;
        }
        if let Some(i) = &self.iscsi {
            i.validate(&known)?;
        }
        if let Some(n) = &self.nvme {
            n.validate(&known)?;
        }
        Ok(())
    }

    /// The pools' names (each once) and kinds; returns the names.
    fn validate_pools(&self) -> Result<HashSet<&str>, ConfigError> {
        let inv = |s: String| Err(ConfigError::Invalid(s));
        let mut pools = HashSet::new();
        for p in &self.pools {
            check_name("pool", &p.name).map_err(ConfigError::Invalid)?;
            if !pools.insert(p.name.as_str()) {
                return inv(format!("pool {} is listed twice", p.name));
            }
            match (&p.rbd, p.path.is_empty()) {
                (Some(_), false) | (None, true) => return inv(format!("pool {}: give either path (a directory) or rbd (a Ceph pool)", p.name)),
                (None, false) if !std::path::Path::new(&p.path).is_absolute() => return inv(format!("pool {}: path {:?} must be absolute", p.name, p.path)),
                // Its volumes' backends name files in it: file:PATH/NAME.img.
                (None, false) if p.path.contains(',') => return inv(format!("pool {}: path {:?} holds a comma, which a volume's backend spec reads as the start of an option: use a directory without one", p.name, p.path)),
                (None, false) if p.conf.is_some() || p.id.is_some() => return inv(format!("pool {}: conf and id are for rbd pools", p.name)),
                (Some(_), true) if p.copy => return inv(format!("pool {}: copy is for directory pools (RBD clones are copy-on-write)", p.name)),
                _ => {}
            }
        }
        Ok(pools)
    }

    /// The volumes' names (each once), backends and pools; returns the names.
    fn validate_volumes(&self, pools: &HashSet<&str>) -> Result<HashSet<&str>, ConfigError> {
        let inv = |s: String| Err(ConfigError::Invalid(s));
        let mut names = HashSet::new();
        for v in &self.volumes {
            if v.name.is_empty() || !names.insert(v.name.as_str()) {
                return inv(format!("volume name {:?} is empty or used twice", v.name));
            }
            // What the configuration file cannot carry is not served either.
            v.backend.to_text().map_err(|e| ConfigError::Invalid(format!("volume {}: {e}", v.name)))?;
            if let Some(p) = &v.pool {
                if !pools.contains(p.as_str()) {
                    return inv(format!("volume {} names unknown pool {p:?}", v.name));
                }
            }
            if v.snapshot_of.is_some() && !v.backend.readonly {
                return inv(format!("volume {} is a snapshot: its backend must be readonly", v.name));
            }
        }
        Ok(names)
    }
}

impl AoeConfig {
    /// The exports, on volumes that are `known`.
    fn validate(&self, known: &dyn Fn(&str) -> bool) -> Result<(), ConfigError> {
        let inv = |s: String| Err(ConfigError::Invalid(s));
        let mut addrs = HashSet::new();
        for e in &self.exports {
            if !known(&e.volume) {
                return inv(format!("AoE export on {} names unknown volume {:?}", e.interface, e.volume));
            }
            if e.shelf == 0xFFFF || e.slot == 0xFF {
                return inv(format!("AoE shelf {} slot {} is the broadcast address", e.shelf, e.slot));
            }
            if !addrs.insert((e.interface.as_str(), e.shelf, e.slot)) {
                return inv(format!("AoE {}.{} exported twice on {}", e.shelf, e.slot, e.interface));
            }
            if e.config_string.len() > 1024 {
                return inv("AoE config string longer than 1024 bytes".into());
            }
            if e.allow.len() > bw_aoe::target::MAX_ALLOW {
                return inv(format!("AoE {}.{}: more than {} MAC addresses in allow", e.shelf, e.slot, bw_aoe::target::MAX_ALLOW));
            }
        }
        Ok(())
    }
}

impl IscsiConfig {
    /// Discovery's CHAP and the targets, whose LUNs are on volumes that are `known`.
    fn validate(&self, known: &dyn Fn(&str) -> bool) -> Result<(), ConfigError> {
        let inv = |s: String| Err(ConfigError::Invalid(s));
        if self.discovery_mutual_chap.is_some() && self.discovery_chap.is_none() {
            return inv("iscsi.discovery_mutual_chap needs iscsi.discovery_chap: the initiator authenticates first".into());
        }
        check_chap_pair("iscsi", ("discovery_chap", &self.discovery_chap), ("discovery_mutual_chap", &self.discovery_mutual_chap)).map_err(ConfigError::Invalid)?;
        for t in &self.targets {
            if !t.iqn.starts_with("iqn.") && !t.iqn.starts_with("eui.") && !t.iqn.starts_with("naa.") {
                return inv(format!("iSCSI target name {:?} must start with iqn., eui. or naa.", t.iqn));
            }
            if t.mutual_chap.is_some() && t.chap.is_none() {
                return inv(format!("iSCSI target {}: mutual_chap needs chap: the initiator authenticates first", t.iqn));
            }
            check_chap_pair(&format!("iSCSI target {}", t.iqn), ("chap", &t.chap), ("mutual_chap", &t.mutual_chap)).map_err(ConfigError::Invalid)?;
            if t.relative_target_port == Some(0) {
                return inv(format!("iSCSI target {}: relative_target_port 0 is reserved (1..=65535)", t.iqn));
            }
            let mut luns = HashSet::new();
            for l in &t.luns {
                if !known(&l.volume) {
                    return inv(format!("iSCSI target {} LUN {} names unknown volume {:?}", t.iqn, l.lun, l.volume));
                }
                // The largest LUN SAM-5's extended flat space carries:
                // a larger one was encoded as another LUN's number.
                if l.lun > bw_scsi::MAX_LUN {
                    return inv(format!("iSCSI target {} LUN {}: LUNs are at most {}", t.iqn, l.lun, bw_scsi::MAX_LUN));
                }
                if !luns.insert(l.lun) {
                    return inv(format!("iSCSI target {} has LUN {} twice", t.iqn, l.lun));
                }
            }
        }
        Ok(())
    }
}

impl NvmeConfig {
    /// The controller ids, keys, TLS ports and subsystems.
    fn validate(&self, known: &dyn Fn(&str) -> bool) -> Result<(), ConfigError> {
        let inv = |s: String| Err(ConfigError::Invalid(s));
        if let Some([lo, hi]) = self.cntlid_range {
            if lo == 0 || lo > hi || hi > 0xFFEF {
                return inv(format!("nvme.cntlid_range [{lo}, {hi}]: controller ids must be an ascending range within 1..=65519"));
            }
        }
        let mut names = HashSet::new();
        for k in &self.keys {
            if k.name.is_empty() || !names.insert(k.name.as_str()) {
                return inv(format!("nvme.key {:?}: key names must be set and distinct", k.name));
            }
        }
        for a in self.tls_ports.keys() {
            if !self.listen.contains(a) && self.discovery_listen != Some(*a) {
                return inv(format!("nvme.tls_ports names {a}, which is not an NVMe/TCP port (listen, discovery_listen)"));
            }
        }
        for s in &self.subsystems {
            self.validate_subsystem(s, known)?;
        }
        Ok(())
    }

    /// One subsystem: its name, hosts (with their keys) and namespaces.
    fn validate_subsystem(&self, s: &NvmeSubsystem, known: &dyn Fn(&str) -> bool) -> Result<(), ConfigError> {
        let inv = |s: String| Err(ConfigError::Invalid(s));
        check_nqn(&s.nqn).map_err(|e| ConfigError::Invalid(format!("NVMe subsystem name {:?}: {e}", s.nqn)))?;
        if s.nqn == bw_nvme::DISCOVERY_NQN {
            return inv(format!("NVMe subsystem name {:?} is the discovery subsystem's", s.nqn));
        }
        let mut hosts = HashSet::new();
        for h in s.allowed_hosts.iter().chain(s.hosts.iter().map(|h| &h.nqn)) {
            check_nqn(h).map_err(|e| ConfigError::Invalid(format!("NVMe {}: host {h:?}: {e}", s.nqn)))?;
        }
        for h in &s.hosts {
            if !hosts.insert(h.nqn.as_str()) {
                return inv(format!("NVMe {}: host {:?} is listed twice", s.nqn, h.nqn));
            }
            h.auth_config().map_err(|e| ConfigError::Invalid(format!("NVMe {} host {}: {e}", s.nqn, h.nqn)))?;
            // Key files are read when the keys are taken (start,
            // live changes): here only that they are named.
            let check = match (&h.tls_psk, &h.tls_key) {
                (Some(_), None) => h.tls_psk(&[]).map(|_| ()),
                (None, Some(name)) if !self.keys.iter().any(|k| &k.name == name) => Err(format!("tls_key {name:?}: no [[nvme.key]] of that name")),
                (Some(_), Some(_)) => Err("tls_psk and tls_key: give one".into()),
                _ => Ok(()),
            };
            check.map_err(|e| ConfigError::Invalid(format!("NVMe {} host {}: {e}", s.nqn, h.nqn)))?;
        }
        for ns in &s.namespaces {
            if ns.nsid == 0 || ns.nsid == u32::MAX || !known(&ns.volume) {
                return inv(format!("NVMe {} namespace {} is invalid or names unknown volume {:?}", s.nqn, ns.nsid, ns.volume));
            }
            ns.ids().map_err(|e| ConfigError::Invalid(format!("NVMe {} namespace {}: {e}", s.nqn, ns.nsid)))?;
            if ns.ana_group == 0 || ns.ana_group > bw_nvme::ana::MAX_GROUPS {
                return inv(format!("NVMe {} namespace {}: ana_group {} is not in 1..={}", s.nqn, ns.nsid, ns.ana_group, bw_nvme::ana::MAX_GROUPS));
            }
            if !ns.no_auto_visible && !ns.hosts.is_empty() {
                return inv(format!("NVMe {} namespace {}: hosts are listed only on a no_auto_visible namespace (the others are visible to every allowed host)", s.nqn, ns.nsid));
            }
            let mut seen = std::collections::HashSet::new();
            for h in &ns.hosts {
                check_nqn(h).map_err(|e| ConfigError::Invalid(format!("NVMe {} namespace {}: host {h:?}: {e}", s.nqn, ns.nsid)))?;
                if !seen.insert(h.as_str()) {
                    return inv(format!("NVMe {} namespace {}: host {h:?} is listed twice", s.nqn, ns.nsid));
                }
            }
        }
        Ok(())
    }
}

/// A pool or volume name: a file name that cannot escape the pool's
/// directory or hide in it (no `/`, no leading dot).
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!("{what} name {name:?}: 1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit"))
    }
}

impl ServeConfig {
    /// No string of the configuration (a name, a path, an initiator, a
    /// secret) may hold a control character: names are logged, listed and
    /// written back into files, where a newline splits a line and a NUL
    /// ends a C string early (a path "x.img\0.pr" is not the file it says).
    /// The error names the field; a secret's value is not shown.
    fn refuse_control_characters(&self) -> Result<(), ConfigError> {
        fn walk(v: &serde_json::Value, at: &str) -> Result<(), String> {
            match v {
                serde_json::Value::String(s) if s.chars().any(char::is_control) => {
                    let shown = if at.contains("secret") { "(a secret)".to_string() } else { format!("{s:?}") };
                    Err(format!("{at}: {shown} holds a control character"))
                }
                serde_json::Value::Array(a) => a.iter().enumerate().try_for_each(|(i, v)| walk(v, &format!("{at}[{i}]"))),
                serde_json::Value::Object(o) => o.iter().try_for_each(|(k, v)| walk(v, &if at.is_empty() { k.clone() } else { format!("{at}.{k}") })),
                _ => Ok(()),
            }
        }
        // A configuration that cannot be written (a backend its text cannot
        // carry) is refused by the checks after this one, which say why.
        let Ok(all) = reveal_secrets(|| serde_json::to_value(self)) else { return Ok(()) };
        walk(&all, "").map_err(ConfigError::Invalid)
    }
}

/// What a subsystem or host name must be: an NQN as the NVMe Base
/// Specification bounds it (UTF-8, at most 223 bytes), not empty, without
/// control characters (it is logged and shown). Its two formats
/// (`nqn.yyyy-mm.reverse-domain:...` and `nqn.2014-08.org.nvmexpress:uuid:...`)
/// are what a name should be, but not what is required here: Linux's
/// nvmet takes any name (blktests names its subsystems
/// `blktests-subsystem-N`), Linux hosts send whatever name they are given
/// (`nvme connect -n`), and a gateway in front of such a target must
/// accept the same names to stand in for it. docs/control.md says so.
pub fn check_nqn(nqn: &str) -> Result<(), String> {
    if nqn.is_empty() {
        return Err("empty".into());
    }
    if nqn.len() > bw_nvme::fabrics::NQN_MAX_LEN {
        return Err(format!("{} bytes, longer than the {} an NQN may have", nqn.len(), bw_nvme::fabrics::NQN_MAX_LEN));
    }
    if nqn.chars().any(char::is_control) {
        return Err("holds a control character".into());
    }
    Ok(())
}

/// A warning if the configuration file at `path` holds secrets and others
/// than its owner may read it (as ssh does for private keys).
pub fn permission_warning(path: &str, cfg: &ServeConfig) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (mode & 0o077 != 0 && cfg.has_secrets()).then(|| {
        format!("config {path} holds secrets but its mode {:04o} lets other users read it: chmod 600 {path}", mode & 0o7777)
    })
}

/// Write `text` (secrets may be in it) to `path`, replacing what is there
/// whole: a new file of root's, mode 600, written beside it, synced and
/// renamed over it (bw_rootdir). serve runs as root and the path is a
/// caller's, so whatever is at the path (another user's file, a link to,
/// say, /etc/shadow, another name of a file) is replaced, never written
/// through, and the directory must be one only root may write; otherwise
/// nothing is written and the error says which directory lets whom in.
pub fn write_private(path: &str, text: &str) -> std::io::Result<()> {
    write_atomic(std::path::Path::new(path), text)
}

/// Replace the file at `path` with `text` whole or not at all, as
/// [`write_private`] does: a crash at any moment leaves the old file or
/// the new one, never a mix, and at worst a temporary `.NAME.new-PID`
/// beside it, which [`remove_temporaries`] removes at the next start.
/// (serve resolves the `--config` path once at start, so a symbolic link
/// there is followed then and not replaced now.)
pub fn write_atomic(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    bw_rootdir::replace_file(path, text.as_bytes(), 0o600)
}

/// Remove the temporaries a killed serve left beside the configuration
/// file `path` it persists changes to; what went. Fails if changes cannot
/// be persisted there (a directory other users may write).
pub fn remove_temporaries(path: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let (dir, name) = bw_rootdir::RootDir::of(path)?;
    Ok(dir.remove_temporaries(&name)?.into_iter().map(|t| dir.join(t)).collect())
}

/// `ADDR`, `ADDR:PORT`, `:PORT` or `[v6]:PORT`.
pub fn parse_listen(s: &str, default_port: u16) -> Result<SocketAddr, ConfigError> {
    let s = s.trim();
    let with_port = if s.parse::<std::net::IpAddr>().is_ok() {
        if s.contains(':') { format!("[{s}]:{default_port}") } else { format!("{s}:{default_port}") }
    } else if let Some(p) = s.strip_prefix(':') {
        format!("0.0.0.0:{p}")
    } else {
        s.to_string()
    };
    with_port
        .parse()
        .map_err(|_| ConfigError::Invalid(format!("listen address {s:?}: expected IP[:PORT]")))
}

fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into());
    let h: String = raw
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c.to_ascii_lowercase() } else { '-' })
        .collect();
    if h.is_empty() { "localhost".into() } else { h }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_inside_the_pool() {
        for bad in ["", "../x", "a/b", ".hidden", "-x", &"a".repeat(129)] {
            assert!(check_name("volume", bad).is_err(), "{bad:?}");
        }
        for good in ["volume-1b2c", "snp-a.b_c", "0"] {
            check_name("volume", good).unwrap();
        }
    }

    #[test]
    fn flags_build_a_valid_config() {
        let mut c = ServeConfig::default();
        c.add_volume_flag("d0=ram:64M").unwrap();
        c.add_volume_flag("d1=file:/tmp/x,size=1G").unwrap();
        c.add_aoe_flag("veth0,volume=d1,shelf=3,slot=4").unwrap();
        c.add_iscsi_flag("127.0.0.1").unwrap();
        c.add_nvme_flag("127.0.0.1:4421").unwrap();
        c.validate().unwrap();
        let i = c.iscsi.as_ref().unwrap();
        assert_eq!(i.listen[0].port(), 3260);
        assert_eq!(i.targets[0].luns.len(), 2);
        let n = c.nvme.as_ref().unwrap();
        assert_eq!(n.subsystems[0].namespaces[1].nsid, 2);
        assert_eq!(n.discovery_listen.unwrap().port(), 8009);
        assert_eq!(c.aoe.as_ref().unwrap().exports[0].shelf, 3);
    }

    #[test]
    fn aoe_allow_list_and_broadcast_writes_from_toml_and_flags() {
        let text = r#"
            [[volume]]
            name = "d"
            backend = "ram:1M"
            [[aoe.export]]
            interface = "eth1"
            volume = "d"
            shelf = 1
            slot = 0
            allow = ["02:00:00:00:00:01", "02-00-00-00-00-0A"]
        "#;
        let c: ServeConfig = toml::from_str(text).unwrap();
        c.validate().unwrap();
        let e = &c.aoe.as_ref().unwrap().exports[0];
        assert_eq!(e.allow, vec![[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 0x0a]]);
        assert!(!e.broadcast_writes, "ignored by default");
        let back: ServeConfig = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        assert!(toml::to_string(&c).unwrap().contains("\"02:00:00:00:00:0a\""));
        assert!(toml::from_str::<ServeConfig>(&text.replace("02:00:00:00:00:01", "02:00:00:00:01")).is_err());
        let on: ServeConfig = toml::from_str(&format!("{text}broadcast_writes = true\n")).unwrap();
        assert!(on.aoe.unwrap().exports[0].broadcast_writes);
        let mut many = c.clone();
        many.aoe.as_mut().unwrap().exports[0].allow = vec![[2, 0, 0, 0, 0, 1]; bw_aoe::target::MAX_ALLOW + 1];
        assert!(many.validate().is_err());

        let mut f = ServeConfig::default();
        f.add_volume_flag("d=ram:1M").unwrap();
        f.add_aoe_flag("eth1,shelf=1,allow=02:00:00:00:00:01,allow=02:00:00:00:00:02,broadcast_writes=yes").unwrap();
        let e = &f.aoe.as_ref().unwrap().exports[0];
        assert_eq!((e.allow.len(), e.broadcast_writes), (2, true));
        assert!(f.add_aoe_flag("eth1,allow=02:00").is_err());
        assert!(f.add_aoe_flag("eth1,broadcast_writes=maybe").is_err());
    }

    #[test]
    fn ana_state_groups_and_controller_id_ranges() {
        let text = r#"
            [[volume]]
            name = "v"
            backend = "ram:1M"
            [nvme]
            listen = ["127.0.0.1:4420"]
            cntlid_range = [1000, 1999]
            [[nvme.subsystem]]
            nqn = "nqn.2026-11.org.example:v"
            ana_state = "non-optimized"
            namespaces = [{ nsid = 1, volume = "v", ana_group = 5 }, { nsid = 2, volume = "v" }]
        "#;
        let c: ServeConfig = toml::from_str(text).unwrap();
        c.validate().unwrap();
        let n = c.nvme.as_ref().unwrap();
        assert_eq!(n.cntlid_range, Some([1000, 1999]));
        assert_eq!(n.subsystems[0].ana_state, AnaStateConfig::NonOptimized);
        assert_eq!((n.subsystems[0].namespaces[0].ana_group, n.subsystems[0].namespaces[1].ana_group), (5, 1));
        for bad in [text.replace("[1000, 1999]", "[0, 5]"), text.replace("[1000, 1999]", "[9, 3]"), text.replace("ana_group = 5", "ana_group = 129")] {
            let c: ServeConfig = toml::from_str(&bad).unwrap();
            assert!(c.validate().is_err(), "accepted: {bad}");
        }
        assert!(toml::from_str::<ServeConfig>(&text.replace("non-optimized", "sleepy")).is_err());
    }

    #[test]
    fn toml_round_trips_and_rejects_unknowns() {
        let text = r#"
            [[volume]]
            name = "disk0"
            backend = "ram:1G"
            [[aoe.export]]
            interface = "eth1"
            volume = "disk0"
            shelf = 1
            slot = 0
            [iscsi]
            listen = ["0.0.0.0:3260"]
            discovery_chap = { user = "scan", secret = "0a1b2c3d4e5f" }
            [[iscsi.target]]
            iqn = "iqn.2026-11.org.example:disk0"
            luns = [{ lun = 0, volume = "disk0" }]
            chap = { user = "bob", secret = "0123456789ab" }
            target_port_group = 7
            alua_state = "active-non-optimized"
        "#;
        let mut c: ServeConfig = toml::from_str(text).unwrap();
        c.validate().unwrap();
        let t = &c.iscsi.as_ref().unwrap().targets[0];
        assert_eq!((t.target_port_group, t.alua_state), (7, AluaStateConfig::ActiveNonOptimized));
        assert_eq!(t.relative_target_port, None, "defaults to the group id when the front-end starts");
        let mut r: ServeConfig = toml::from_str(&text.replace("target_port_group = 7", "target_port_group = 7\nrelative_target_port = 0")).unwrap();
        assert!(r.validate().is_err(), "relative target port 0 is reserved");
        r.iscsi.as_mut().unwrap().targets[0].relative_target_port = Some(2);
        r.validate().unwrap();
        assert!(toml::from_str::<ServeConfig>(&text.replace("active-non-optimized", "sleepy")).is_err());
        let back: ServeConfig = toml::from_str(&reveal_secrets(|| toml::to_string(&c).unwrap())).unwrap();
        assert_eq!(back, c);
        assert_eq!(c.iscsi.as_ref().and_then(|i| i.discovery_chap.as_ref()).map(|d| d.user.as_str()), Some("scan"));
        // Mutual CHAP without one-way CHAP is a mistake, for discovery and for a target.
        let mut d = c.clone();
        if let Some(i) = d.iscsi.as_mut() {
            i.discovery_mutual_chap = i.discovery_chap.take();
        }
        assert!(d.validate().is_err());
        if let Some(t) = c.iscsi.as_mut().and_then(|i| i.targets.first_mut()) {
            t.mutual_chap = t.chap.take();
        }
        assert!(c.validate().is_err());
        assert!(toml::from_str::<ServeConfig>("[[volume]]\nname='a'\nbackend='ram:1M'\ncolour='red'").is_err());
        let l: ServeConfig = toml::from_str("[limits]\nmax_sessions = 3\nlogin_timeout_s = 2").unwrap();
        assert_eq!((l.limits.max_sessions, l.limits.login_timeout_s, l.limits.max_connections_per_address), (3, 2, 1024));
        assert!(toml::from_str::<ServeConfig>("[limits]\nmax_session = 3").is_err());
        let l: ServeConfig =
            toml::from_str("[limits]\nmax_discovery_sessions = 5\ndiscovery_idle_timeout_s = 7\nmax_pending_logins = 9").unwrap();
        let l = l.limits;
        assert_eq!((l.max_discovery_sessions, l.discovery_idle_timeout_s, l.max_pending_logins, l.max_sessions), (5, 7, 9, 4096));
    }

    const WITH_SECRETS: &str = r#"
        [[volume]]
        name = "v"
        backend = "ram:1M"
        [iscsi]
        listen = ["127.0.0.1:3260"]
        discovery_chap = { user = "scan", secret = "disc-Secret-1" }
        discovery_mutual_chap = { user = "portal", secret = "disc-Secret-2" }
        [[iscsi.target]]
        iqn = "iqn.2026-11.org.example:v"
        luns = [{ lun = 0, volume = "v" }]
        chap = { user = "bob", secret = "tgt-Secret-3" }
        mutual_chap = { user = "target", secret = "tgt-Secret-4" }
    "#;
    const SECRETS: [&str; 4] = ["disc-Secret-1", "disc-Secret-2", "tgt-Secret-3", "tgt-Secret-4"];

    /// CHAP secrets shorter than 12 bytes, and one secret for both
    /// directions, are refused at load with an error naming the key (and
    /// not the secret); 12 bytes and two different secrets are fine.
    #[test]
    fn weak_chap_secrets_are_refused() {
        let ok: ServeConfig = toml::from_str(WITH_SECRETS).unwrap();
        ok.validate().unwrap();
        for (secret, replacement, key) in [
            ("disc-Secret-1", "short-secret", ""),
            ("disc-Secret-1", "short-secr1", "iscsi: discovery_chap: "),
            ("disc-Secret-2", "eleven-byte", "iscsi: discovery_mutual_chap: "),
            ("tgt-Secret-3", "s3cret", "iSCSI target iqn.2026-11.org.example:v: chap: "),
            ("tgt-Secret-4", "", "iSCSI target iqn.2026-11.org.example:v: mutual_chap: "),
            ("disc-Secret-2", "disc-Secret-1", "iscsi: discovery_chap and discovery_mutual_chap have the same secret"),
            ("tgt-Secret-4", "tgt-Secret-3", "iSCSI target iqn.2026-11.org.example:v: chap and mutual_chap have the same secret"),
        ] {
            let c: ServeConfig = toml::from_str(&WITH_SECRETS.replace(secret, replacement)).unwrap();
            match c.validate() {
                Ok(()) if key.is_empty() => {}
                Ok(()) => panic!("{replacement:?} for {secret:?} accepted"),
                Err(e) => {
                    let e = e.to_string();
                    assert!(!key.is_empty() && e.contains(key), "{replacement:?} for {secret:?}: {e}");
                    assert!(replacement.is_empty() || !e.contains(replacement), "the error shows the secret: {e}");
                }
            }
        }
    }

    /// Printed, saved and debug-formatted configurations show no secret
    /// unless revealed; revealed ones load back to the same configuration.
    #[test]
    fn secrets_are_redacted_unless_revealed() {
        let c: ServeConfig = toml::from_str(WITH_SECRETS).unwrap();
        c.validate().unwrap();
        assert!(c.has_secrets());
        let (shown, debug, revealed) = (c.to_json(false), format!("{c:?} {c:#?}"), c.to_json(true));
        for s in SECRETS {
            assert!(!shown.contains(s), "{s} in --print-config output:\n{shown}");
            assert!(!debug.contains(s), "{s} in Debug output");
            assert!(revealed.contains(s), "{s} missing with --show-secrets");
        }
        assert_eq!(shown.matches(REDACTED).count(), 4);
        // Revealing is scoped: afterwards secrets are hidden again.
        assert!(!c.to_json(false).contains(SECRETS[0]));
        let back: ServeConfig = serde_json::from_str(&revealed).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.iscsi.as_ref().and_then(|i| i.targets[0].chap.as_ref()).map(|c| c.secret.expose()), Some("tgt-Secret-3"));
        // A redacted save loaded back is refused, not taken as the secret "<redacted>".
        let err = serde_json::from_str::<ServeConfig>(&shown).unwrap_err().to_string();
        assert!(err.contains("--show-secrets"), "{err}");
        let plain: ServeConfig = toml::from_str("[[volume]]\nname = \"v\"\nbackend = \"ram:1M\"").unwrap();
        assert!(!plain.has_secrets());
    }

    #[test]
    fn a_readable_file_with_secrets_gets_a_warning() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("bw-cfg-perm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("serve.toml");
        let p = path.to_str().unwrap();
        std::fs::write(&path, WITH_SECRETS).unwrap();
        let c = ServeConfig::from_toml_file(p).unwrap();
        let plain: ServeConfig = toml::from_str("[[volume]]\nname = \"v\"\nbackend = \"ram:1M\"").unwrap();
        for (mode, warn) in [(0o644, true), (0o640, true), (0o604, true), (0o600, false), (0o400, false)] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let w = permission_warning(p, &c);
            assert_eq!(w.is_some(), warn, "mode {mode:o}: {w:?}");
            assert!(permission_warning(p, &plain).is_none(), "no secrets, no warning");
        }
        // Saved configurations are private and root's, even over an
        // existing readable file of another user's.
        let saved = dir.join("saved.json");
        std::fs::write(&saved, "old").unwrap();
        std::fs::set_permissions(&saved, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::chown(&saved, Some(65534), None).unwrap();
        let theirs = std::fs::File::open(&saved).unwrap();
        write_private(saved.to_str().unwrap(), &c.to_json(true)).unwrap();
        let m = std::fs::metadata(&saved).unwrap();
        assert_eq!((m.permissions().mode() & 0o777, std::os::unix::fs::MetadataExt::uid(&m)), (0o600, 0));
        assert_eq!(std::io::read_to_string(theirs).unwrap(), "old", "the secrets went into the other user's file");
        // Neither a symbolic link nor a hard link at the path is written
        // through: the name is replaced.
        let victim = dir.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let victim_mode = std::fs::metadata(&victim).unwrap().permissions().mode();
        let sym = dir.join("sym.json");
        std::os::unix::fs::symlink(&victim, &sym).unwrap();
        write_private(sym.to_str().unwrap(), "x").unwrap();
        let hard = dir.join("hard.json");
        std::fs::hard_link(&victim, &hard).unwrap();
        write_private(hard.to_str().unwrap(), "x").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::metadata(&victim).unwrap().permissions().mode(), victim_mode);
        assert!(std::fs::symlink_metadata(&sym).unwrap().is_file());
        // A directory another user may write is refused, with the reason.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = write_private(saved.to_str().unwrap(), "x").unwrap_err();
        assert!(e.to_string().contains("may be written by every user"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dhchap_hosts_are_checked_and_redacted() {
        let key = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
        let ctrl = "DHHC-1:01:0fJS36Wnj8zkI9noG6XzglMvd8Z4FxwQFjlhA480rAFD99vN:";
        let text = format!(
            r#"
            [[volume]]
            name = "v"
            backend = "ram:1M"
            [[nvme.subsystem]]
            nqn = "nqn.2026-11.org.example:v"
            namespaces = [{{ nsid = 1, volume = "v" }}]
            [[nvme.subsystem.host]]
            nqn = "nqn.2026-11.org.example:h"
            dhchap_secret = "{key}"
            dhchap_ctrl_secret = "{ctrl}"
            dhchap_hashes = ["hmac(sha512)", "sha256"]
            dhchap_dhgroups = ["ffdhe4096", "null"]
        "#
        );
        let c: ServeConfig = toml::from_str(&text).unwrap();
        c.validate().unwrap();
        let h = &c.nvme.as_ref().unwrap().subsystems[0].hosts[0];
        let a = h.auth_config().unwrap().unwrap();
        use bw_nvme::auth::{DhGroup, HashId};
        assert_eq!(a.hashes, [HashId::Sha512, HashId::Sha256]);
        assert_eq!(a.groups, [DhGroup::Ffdhe4096, DhGroup::Null]);
        assert!(a.ctrl_key.is_some());
        let shown = toml::to_string(&c).unwrap();
        assert!(!shown.contains("AAECAwQF") && !shown.contains("0fJS36Wn") && shown.contains(REDACTED), "{shown}");
        for bad in [
            text.replace("AAECAwQF", "AAECAwQG"),
            text.replace(ctrl, key),
            text.replace("\"sha256\"]", "\"md5\"]"),
            text.replace("[\"ffdhe4096\", \"null\"]", "[]"),
            text.replace("nqn = \"nqn.2026-11.org.example:h\"", "nqn = \"\""),
            text.replace("nqn = \"nqn.2026-11.org.example:h\"", &format!("nqn = \"{}\"", "h".repeat(224))),
            text.replace("nqn = \"nqn.2026-11.org.example:v\"", "nqn = \"nqn.2014-08.org.nvmexpress.discovery\""),
            text.replace("nqn = \"nqn.2026-11.org.example:v\"", "nqn = \"v\\u0007\""),
        ] {
            let c: ServeConfig = toml::from_str(&bad).unwrap();
            assert!(c.validate().is_err(), "accepted: {bad}");
        }
        assert!(toml::from_str::<ServeConfig>(&text.replace("dhchap_hashes", "dhchap_hash")).is_err());
        // Names outside the NQN formats, as nvmet takes them (blktests').
        let other = text.replace("nqn.2026-11.org.example:v", "blktests-subsystem-1").replace("nqn.2026-11.org.example:h", "blktests-host");
        toml::from_str::<ServeConfig>(&other).unwrap().validate().unwrap();
    }

    #[test]
    fn tls_ports_and_psks_are_checked_and_redacted() {
        use std::os::unix::fs::PermissionsExt;
        let psk = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
        let dir = std::env::temp_dir().join(format!("bw-tls-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("key0");
        std::fs::write(&file, format!("{psk}\n")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = format!(
            r#"
            [[volume]]
            name = "v"
            backend = "ram:1M"
            [nvme]
            listen = ["127.0.0.1:4420", "127.0.0.1:4421"]
            tls = "required"
            tls_ports = {{ "127.0.0.1:4421" = "allowed" }}
            [[nvme.key]]
            name = "key0"
            path = "{}"
            [[nvme.subsystem]]
            nqn = "nqn.2026-11.org.example:v"
            namespaces = [{{ nsid = 1, volume = "v" }}]
            [[nvme.subsystem.host]]
            nqn = "nqn.2026-11.org.example:h1"
            tls_psk = "{psk}"
            [[nvme.subsystem.host]]
            nqn = "nqn.2026-11.org.example:h2"
            tls_key = "key0"
        "#,
            file.display()
        );
        let c: ServeConfig = toml::from_str(&text).unwrap();
        c.validate().unwrap();
        let n = c.nvme.as_ref().unwrap();
        assert_eq!(n.tls_of(&"127.0.0.1:4420".parse().unwrap()), TlsMode::Required);
        assert_eq!(n.tls_of(&"127.0.0.1:4421".parse().unwrap()), TlsMode::Allowed);
        let hosts = &n.subsystems[0].hosts;
        assert_eq!(hosts[0].tls_psk(&n.keys).unwrap(), hosts[1].tls_psk(&n.keys).unwrap());
        assert!(hosts[0].auth_config().unwrap().is_none(), "a PSK alone is no DH-HMAC-CHAP");
        let shown = c.to_json(false);
        assert!(!shown.contains("AAECAwQF") && shown.contains(REDACTED), "{shown}");
        assert!(c.has_secrets());
        // The key file must be private.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(hosts[1].tls_psk(&n.keys).unwrap_err().contains("mode 600"));
        for bad in [
            text.replace("AAECAwQF", "AAECAwQG"),
            text.replace("tls_key = \"key0\"", "tls_key = \"key1\""),
            text.replace("tls_key = \"key0\"", &format!("tls_key = \"key0\"\ntls_psk = \"{psk}\"")),
            text.replace("{ \"127.0.0.1:4421\" = \"allowed\" }", "{ \"127.0.0.1:4422\" = \"allowed\" }"),
            text.replace("tls_psk = \"NVMeTLSkey", "tls_psk = \"DHHC"),
        ] {
            let c: ServeConfig = toml::from_str(&bad).unwrap();
            assert!(c.validate().is_err(), "accepted: {bad}");
        }
        assert!(toml::from_str::<ServeConfig>(&text.replace("\"required\"", "\"maybe\"")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn namespace_ids_are_parsed_or_refused() {
        let mut n = NvmeNamespace::new(1, "v".into(), false, 1);
        assert_eq!(n.ids().unwrap(), NamespaceIds::default());
        n.uuid = Some("91fdba0d-f87b-4c25-b80f-db7be1418b9e".into());
        n.nguid = Some("000102030405060708090a0b0c0d0e0f".into());
        n.eui64 = Some("0011-2233-4455-6677".into());
        let ids = n.ids().unwrap();
        assert_eq!(ids.uuid.unwrap()[..4], [0x91, 0xfd, 0xba, 0x0d]);
        assert_eq!(ids.nguid.unwrap(), core::array::from_fn(|i| i as u8));
        assert_eq!(ids.eui64, Some([0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77]));
        for (field, bad) in [("uuid", "91fdba0d"), ("nguid", "zz0102030405060708090a0b0c0d0e0f"), ("eui64", "00112233445566778"), ("eui64", "ééééééé")] {
            let mut m = n.clone();
            *match field {
                "uuid" => &mut m.uuid,
                "nguid" => &mut m.nguid,
                _ => &mut m.eui64,
            } = Some(bad.into());
            let e = m.ids().unwrap_err();
            assert!(e.starts_with(field), "{e}");
        }
    }

    /// NUL, newline and the other control characters, in every string.
    #[test]
    fn control_characters_are_refused_in_every_name() {
        let base = "[[volume]]\nname = \"a\"\nbackend = \"ram:1M\"\n[iscsi]\nlisten = [\"127.0.0.1:3260\"]\n[[iscsi.target]]\niqn = \"iqn.2026-11.org.example:t\"\nluns = [{ lun = 0, volume = \"a\" }]\n";
        let ok: ServeConfig = toml::from_str(base).unwrap();
        ok.validate().unwrap();
        for (field, bad) in [
            ("\"a\\nb\"", base.replace("name = \"a\"", "name = \"a\\nb\"").replace("volume = \"a\"", "volume = \"a\\nb\"")),
            ("volume[0].backend", base.replace("ram:1M", "file:/srv/x.img\\u0000.pr")),
            ("iscsi.target[0].iqn", base.replace("example:t", "example:t\\r")),
            ("iscsi.target[0].allowed_initiators[0]", base.replace("luns =", "allowed_initiators = [\"iqn.x:\\u001b[2J\"]\nluns =")),
            ("iscsi.target[0].chap.secret", base.to_string() + "chap = { user = \"u\", secret = \"twelve-chars\\u0007x\" }\n"),
        ] {
            let c: ServeConfig = toml::from_str(&bad).unwrap_or_else(|e| panic!("{field}: {e}"));
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field) && e.contains("control character"), "{field}: {e}");
            assert!(!e.contains("twelve"), "a secret was shown: {e}");
        }
    }

    /// [control] allowed_paths: inside (after links), in a pool, or refused
    /// with the reason; an allowed directory others may write is no place.
    #[test]
    fn allowed_paths_confine_what_the_control_methods_name() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("bw-cfg-allowed-{}", std::process::id()));
        for sub in ["in", "out", "pool", "open"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::set_permissions(d.join("open"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::fs::write(d.join("out/secret"), "s").unwrap();
        std::os::unix::fs::symlink(d.join("out/secret"), d.join("in/link")).unwrap();
        let text = format!(
            "[[pool]]\nname = \"p\"\npath = \"{0}/pool\"\n[control]\nallowed_paths = [\"{0}/in\", \"{0}/open\"]\n",
            d.display()
        );
        let c: ServeConfig = toml::from_str(&text).unwrap();
        c.validate().unwrap();
        let at = |p: &str| c.check_allowed(&d.join(p), "file");
        at("in/new.img").unwrap();
        at("pool/v.img").unwrap();
        for bad in ["out/secret", "in/link", "in/../out/secret", "out/new/x"] {
            assert!(at(bad).unwrap_err().contains("outside [control] allowed_paths"), "{bad}");
        }
        assert!(c.check_allowed(std::path::Path::new("/etc/shadow"), "file").is_err());
        assert!(at("open/x.img").unwrap_err().contains("may be written by every user"));
        let nowhere: ServeConfig = toml::from_str("[control]\nallowed_paths = []\n").unwrap();
        assert!(nowhere.check_allowed(&d.join("in/x"), "file").unwrap_err().contains("none is listed"));
        ServeConfig::default().check_allowed(std::path::Path::new("/etc/shadow"), "file").unwrap();
        let relative: ServeConfig = toml::from_str("[control]\nallowed_paths = [\"srv\"]\n").unwrap();
        assert!(relative.validate().is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn validation_catches_mistakes() {
        let mut c = ServeConfig::default();
        // Empty: only a server with a control socket starts so.
        assert!(c.validate_start(false).is_err());
        c.validate_start(true).unwrap();
        c.add_volume_flag("d=ram:1M").unwrap();
        c.add_aoe_flag("eth0,volume=nope").unwrap();
        assert!(c.validate().is_err());
        assert!(c.add_aoe_flag("eth0,shelf=x").is_err());
        assert!(parse_listen("::1", 3260).unwrap().port() == 3260);
        assert!(parse_listen(":3261", 3260).unwrap().port() == 3261);
        assert!(parse_listen("nohost", 1).is_err());
        // LUNs: no larger than their encoding carries, none twice.
        let mut c = ServeConfig::default();
        c.add_volume_flag("d=ram:1M").unwrap();
        c.add_iscsi_flag("127.0.0.1").unwrap();
        c.iscsi.as_mut().unwrap().targets[0].luns[0].lun = bw_scsi::MAX_LUN;
        c.validate().unwrap();
        c.iscsi.as_mut().unwrap().targets[0].luns[0].lun = bw_scsi::MAX_LUN + 1;
        assert!(c.validate().unwrap_err().to_string().contains("at most 16777215"));
        let again = c.iscsi.as_ref().unwrap().targets[0].luns[0].clone();
        c.iscsi.as_mut().unwrap().targets[0].luns[0].lun = 3;
        c.iscsi.as_mut().unwrap().targets[0].luns.push(IscsiLun { lun: 3, ..again });
        assert!(c.validate().unwrap_err().to_string().contains("LUN 3 twice"));
    }

    /// Backends are typed, and read and written as the text people
    /// write: a configuration in the spec's own spelling saves (TOML,
    /// save_config) and prints (JSON, --print-config) with each backend
    /// string as it was, and loads back the same. The packaging example
    /// is one of them.
    #[test]
    fn backends_keep_their_text_through_save_and_print() {
        let backends = [
            "ram:64M",
            "file:/srv/disk0.img,size=10G,sync",
            "file:/dev/sdb,direct,readonly",
            "rbd:rbd/vol1,conf=/etc/ceph/ceph.conf,id=gateway,size=1G,timeout=20",
            "rbd:rbd/vol1@monday,readonly",
        ];
        let text: String = backends.iter().enumerate().map(|(i, b)| format!("[[volume]]\nname = \"v{i}\"\nbackend = \"{b}\"\n")).collect();
        let packaged = include_str!("../../../packaging/blockwire.toml");
        for text in [text.as_str(), packaged] {
            let c: ServeConfig = toml::from_str(text).unwrap();
            c.validate().unwrap();
            let (saved, printed) = (c.to_toml(), c.to_json(false));
            for v in &c.volumes {
                let b = v.backend.to_string();
                assert!(text.contains(&format!("backend = \"{b}\"")), "{b} is not how the file spelled it");
                assert!(saved.contains(&format!("backend = \"{b}\"")), "{b} not in the saved TOML:\n{saved}");
                assert!(printed.contains(&format!("\"backend\": \"{b}\"")), "{b} not in the printed JSON:\n{printed}");
            }
            assert_eq!(toml::from_str::<ServeConfig>(&saved).unwrap(), c);
            assert_eq!(serde_json::from_str::<ServeConfig>(&printed).unwrap(), c);
        }
        // A spec that does not parse is an error at load, naming it.
        let e = toml::from_str::<ServeConfig>("[[volume]]\nname = \"v\"\nbackend = \"tape:1\"").unwrap_err().to_string();
        assert!(e.contains("invalid backend \"tape:1\""), "{e}");
    }

    /// A backend the file cannot carry is refused by the checks every
    /// change passes, before anything is served or saved: a file name
    /// with a comma (written, it would read back as options), or a pool
    /// whose volumes' files would have one.
    #[test]
    fn backends_the_text_cannot_carry_are_refused() {
        let mut c = ServeConfig::default();
        let comma = bw_block::BackendSpec { kind: bw_block::BackendKind::File { path: "/srv/x,size=64M".into(), size: None }, direct: false, sync: false, readonly: false };
        c.volumes.push(VolumeConfig::new("v", comma));
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("volume v") && e.contains("comma"), "{e}");
        let p: ServeConfig = toml::from_str("[[pool]]\nname = \"p\"\npath = \"/srv/a,b\"").unwrap();
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("pool p") && e.contains("comma"), "{e}");
    }

    /// What save_config writes loads back to the same configuration,
    /// secrets included.
    #[test]
    fn saved_configuration_round_trips() {
        let text = r#"
            [[volume]]
            name = "v"
            backend = "ram:1M"
            [iscsi]
            listen = ["127.0.0.1:3260"]
            [[iscsi.target]]
            iqn = "iqn.2026-11.org.example:v"
            luns = [{ lun = 0, volume = "v" }]
            chap = { user = "bob", secret = "tgt-Secret-3" }
            [nvme]
            listen = ["127.0.0.1:4420"]
            [[nvme.subsystem]]
            nqn = "nqn.2026-11.org.example:v"
            namespaces = [{ nsid = 1, volume = "v" }]
            [[nvme.subsystem.host]]
            nqn = "nqn.2026-11.org.example:h"
            dhchap_secret = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"
        "#;
        let c: ServeConfig = toml::from_str(text).unwrap();
        let saved = c.to_toml();
        assert!(saved.contains("tgt-Secret-3") && saved.contains("DHHC-1:00:AAEC"), "{saved}");
        let back: ServeConfig = toml::from_str(&saved).unwrap();
        assert_eq!(back, c);
    }
}
