//! The CSI Node service: a published volume becomes a block device on
//! this node, then a file system at the staging path, then a bind mount at
//! each target path (or the device itself, for raw block volumes).
//!
//! Two ways to a block device ([`Attacher`]):
//! - the kernel's initiators: `nvme connect` to every address the
//!   controller published (native NVMe multipath joins the paths into one
//!   namespace device), or `iscsiadm` logins to every portal (dm-multipath
//!   joins them);
//! - where the node has no kernel initiator (this project's test machines,
//!   containers without the modules): blockwire's own, `blockwire attach
//!   --loop` (a FUSE file over blockwire's initiator, a loop device on it),
//!   which the plugin logs so at start. It reaches the first published
//!   address only (the initiator reconnects to it; it has no multipath)
//!   and keeps its size from the attach (no online growth: the node does
//!   not advertise EXPAND_VOLUME then).
//!
//! What a stage leaves is recorded in `STATE_DIR/VOLUME_ID/stage.json`
//! (the device, how it was attached), so unstaging undoes exactly that,
//! also after the plugin restarts.

use crate::names::NodeId;
use crate::proto::{self, node_server::Node};
use crate::status::{required, required_msg};
use crate::Protocol;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokio::process::Command;
use tonic::{Request, Response, Status};

const DEFAULT_FS: &str = "ext4";

/// How this node reaches volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attacher {
    Kernel,
    Fuse,
}

impl Attacher {
    /// The kernel's initiators where the NVMe/TCP host module and the
    /// `nvme` tool are there, else blockwire's own.
    pub fn detect() -> Attacher {
        let module = Path::new("/sys/module/nvme_tcp").exists() || std::process::Command::new("modprobe").arg("nvme-tcp").output().is_ok_and(|o| o.status.success());
        let tool = std::process::Command::new("nvme").arg("version").output().is_ok_and(|o| o.status.success());
        if module && tool {
            Attacher::Kernel
        } else {
            Attacher::Fuse
        }
    }
}

pub struct NodeService {
    pub node: NodeId,
    pub attacher: Attacher,
    /// Where stage records and FUSE directories live.
    pub state_dir: PathBuf,
    /// The blockwire binary (`blockwire attach`, `blockwire umount`).
    pub blockwire: PathBuf,
    pub lock: tokio::sync::Mutex<()>,
}

/// What NodeStage did, for NodeUnstage to undo.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stage {
    device: String,
    /// `fuse`: the FUSE directory of `blockwire attach`; `nvme`: the
    /// subsystem NQN connected; `iscsi`: the IQN and portals logged in.
    how: How,
    block: bool,
    /// Target paths the volume is published at, with whether that
    /// publication allows no other (SINGLE_NODE_SINGLE_WRITER).
    #[serde(default)]
    published: Vec<(PathBuf, bool)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum How {
    Fuse { dir: PathBuf },
    Nvme { nqn: String },
    Iscsi {
        iqn: String,
        portals: Vec<String>,
        /// The open-iscsi interface logged in through ([`NodeService::iscsi_iface`]).
        #[serde(default)]
        iface: Option<String>,
        /// The dm-multipath map over the portals' disks, when several.
        #[serde(default)]
        map: Option<String>,
    },
}

/// `-I IFACE` where there is one.
fn with_iface<'a>(mut args: Vec<&'a str>, iface: &'a Option<String>) -> Vec<&'a str> {
    if let Some(i) = iface {
        args.extend(["-I", i.as_str()]);
    }
    args
}

async fn run(program: &str, args: &[&str]) -> Result<String, Status> {
    let out = Command::new(program).args(args).output().await.map_err(|e| Status::internal(format!("{program}: {e}")))?;
    if !out.status.success() {
        return Err(Status::internal(format!("{program} {}: {}: {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_mounted(p: &Path) -> bool {
    bw_attach::is_mountpoint(p)
}

/// The file system on `dev`, if blkid finds one (exit 2: none).
async fn fs_type(dev: &str) -> Result<Option<String>, Status> {
    let out = Command::new("blkid").args(["-p", "-s", "TYPE", "-o", "value", dev]).output().await.map_err(|e| Status::internal(format!("blkid: {e}")))?;
    match out.status.code() {
        Some(0) => Ok(Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())),
        Some(2) => Ok(None),
        _ => Err(Status::internal(format!("blkid {dev}: {}", String::from_utf8_lossy(&out.stderr).trim()))),
    }
}

impl NodeService {
    fn volume_dir(&self, id: &str) -> Result<PathBuf, Status> {
        // Volume IDs are this plugin's volume names: no path separators.
        if !crate::names::is_volume_name(id) {
            return Err(Status::not_found(format!("volume {id:?}: not a volume of this plugin")));
        }
        Ok(self.state_dir.join(id))
    }

    fn stage_record(&self, id: &str) -> Result<Option<Stage>, Status> {
        let p = self.volume_dir(id)?.join("stage.json");
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| Status::internal(format!("{}: {e}", p.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Status::internal(format!("{}: {e}", p.display()))),
        }
    }

    fn write_record(&self, id: &str, s: &Stage) -> Result<(), Status> {
        let dir = self.volume_dir(id)?;
        std::fs::create_dir_all(&dir).map_err(|e| Status::internal(format!("{}: {e}", dir.display())))?;
        let tmp = dir.join("stage.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(s).expect("JSON")).and_then(|()| std::fs::rename(&tmp, dir.join("stage.json"))).map_err(|e| Status::internal(format!("{}: {e}", dir.display())))
    }

    /// Attach the volume the publish context describes; its block device.
    async fn attach(&self, id: &str, ctx: &HashMap<String, String>) -> Result<(String, How), Status> {
        let get = |k: &str| ctx.get(k).filter(|v| !v.is_empty()).ok_or_else(|| Status::invalid_argument(format!("publish_context has no {k}: was the volume ControllerPublished?")));
        let protocol: Protocol = get("protocol")?.parse().map_err(Status::invalid_argument)?;
        let addresses: Vec<&str> = get("addresses")?.split(',').filter(|a| !a.is_empty()).collect();
        let (name, unit) = match protocol {
            Protocol::Iscsi => (get("iqn")?.clone(), get("lun")?.clone()),
            _ => (get("nqn")?.clone(), get("nsid")?.clone()),
        };
        if name.contains('/') || unit.parse::<u64>().is_err() {
            return Err(Status::invalid_argument(format!("publish_context: {name:?} / {unit:?}")));
        }
        match self.attacher {
            Attacher::Fuse => {
                let scheme = match protocol {
                    Protocol::NvmeTcp => "nvme+tcp",
                    Protocol::NvmeRdma => "nvme+rdma",
                    Protocol::Iscsi => "iscsi",
                };
                let url = format!("{scheme}://{}/{name}/{unit}", addresses[0]);
                let dir = self.volume_dir(id)?.join("fuse");
                std::fs::create_dir_all(&dir).map_err(|e| Status::internal(format!("{}: {e}", dir.display())))?;
                let initiator = if protocol == Protocol::Iscsi { &self.node.iqn } else { &self.node.host_nqn };
                let bin = self.blockwire.to_string_lossy().into_owned();
                let dir_s = dir.to_string_lossy().into_owned();
                run(&bin, &["attach", &url, &dir_s, "--loop", "--background", "--initiator-name", initiator]).await?;
                let dev = bw_attach::AttachState::at(&dir).and_then(|s| s.loop_dev).ok_or_else(|| Status::internal(format!("blockwire attach {url}: no loop device recorded")))?;
                Ok((dev, How::Fuse { dir }))
            }
            Attacher::Kernel if protocol == Protocol::Iscsi => {
                let iface = Some(self.iscsi_iface().await?);
                // Several portals (a volume on an RBD pool, published
                // through every gateway) are joined by dm-multipath; a node
                // without it gets one path, and the log says so: two SCSI
                // disks of one LUN without a map over them would be two
                // devices for one volume, and no failover either way.
                let multipath = match (addresses.len() > 1).then(dm_multipath_missing) {
                    Some(Some(why)) => {
                        log::warn!("volume {id}: iSCSI {name} is published through {} portals but {why}: staged on ONE path only ({}), with no failover to the others", addresses.len(), addresses[0]);
                        false
                    }
                    Some(None) => true,
                    None => false,
                };
                let portals: Vec<String> = if multipath { addresses.iter().map(|s| s.to_string()).collect() } else { vec![addresses[0].to_string()] };
                let how = How::Iscsi { iqn: name.clone(), portals: portals.clone(), iface: iface.clone(), map: None };
                let attached = async {
                    for p in &portals {
                        self.iscsi_login(&name, p, &iface, multipath).await?;
                    }
                    let disks = wait_for(|| portals.iter().map(|p| iscsi_disk(&name, &unit, p)).collect::<Option<Vec<String>>>()).await;
                    let disks = disks.ok_or_else(|| Status::internal(format!("iSCSI {name} LUN {unit}: no SCSI disk appeared for every portal of {}", portals.join(", "))))?;
                    if multipath {
                        let map = multipath_map(&disks).await?;
                        log::info!("volume {id}: dm-multipath map {map} over {} ({})", disks.join(", "), portals.join(", "));
                        Ok((format!("/dev/mapper/{map}"), How::Iscsi { iqn: name.clone(), portals: portals.clone(), iface: iface.clone(), map: Some(map) }))
                    } else {
                        if addresses.len() == 1 {
                            log::info!("volume {id}: iSCSI {name} has one portal ({}): staged on its disk {}, no multipath", portals[0], disks[0]);
                        }
                        Ok((format!("/dev/{}", disks[0]), how.clone()))
                    }
                }
                .await;
                if attached.is_err() {
                    // Nothing half-made left behind: the sessions and records go.
                    let _ = self.detach(&how).await;
                }
                attached
            }
            Attacher::Kernel => {
                let transport = if protocol == Protocol::NvmeRdma { "rdma" } else { "tcp" };
                for a in &addresses {
                    let (host, port) = a.rsplit_once(':').ok_or_else(|| Status::invalid_argument(format!("address {a:?}: HOST:PORT")))?;
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    let r = run("nvme", &["connect", "-t", transport, "-a", host, "-s", port, "-n", &name, "--hostnqn", &self.node.host_nqn]).await;
                    if let Err(e) = r {
                        if !e.message().contains("already connected") {
                            return Err(e);
                        }
                    }
                }
                let nsid: u32 = unit.parse().map_err(|_| Status::invalid_argument("nsid"))?;
                let dev = wait_for(|| nvme_device(&name, nsid)).await.ok_or_else(|| Status::internal(format!("NVMe {name} namespace {nsid}: no block device appeared")))?;
                Ok((dev, How::Nvme { nqn: name }))
            }
        }
    }

    /// [`NodeService::detach`], unless another volume staged here came
    /// through the same NVMe subsystem (a shared one: disconnecting would
    /// take its namespace away too); the namespace of this one goes with
    /// ControllerUnpublishVolume, which the kernel hears of (AEN, rescan).
    async fn detach_unless_shared(&self, id: &str, how: &How) -> Result<(), Status> {
        if let How::Nvme { nqn } = how {
            let others = std::fs::read_dir(&self.state_dir).into_iter().flatten().flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|n| n != id);
            for other in others {
                if matches!(self.stage_record(&other), Ok(Some(Stage { how: How::Nvme { nqn: o }, .. })) if &o == nqn) {
                    log::info!("volume {id}: NVMe {nqn} stays connected for volume {other}");
                    return Ok(());
                }
            }
        }
        self.detach(how).await
    }

    /// The open-iscsi interface whose initiator name is this node's IQN,
    /// made if missing. Without one iscsiadm logs in with the host's
    /// /etc/iscsi/initiatorname.iscsi, which need not be the IQN that
    /// NodeGetInfo reported and ControllerPublish allowed (the target
    /// then refuses the login: authorization failure, seen in the kernel
    /// VM with `--iqn`). Named after the IQN, so two plugins with two
    /// identities on one host do not share one.
    async fn iscsi_iface(&self) -> Result<String, Status> {
        use sha2::{Digest, Sha256};
        let name = format!("bwcsi-{}", &hex::encode(Sha256::digest(self.node.iqn.as_bytes()))[..16]);
        if let Err(e) = run("iscsiadm", &["-m", "iface", "-I", &name, "-o", "new"]).await {
            if !e.message().contains("exists") {
                return Err(e);
            }
        }
        run("iscsiadm", &["-m", "iface", "-I", &name, "-o", "update", "-n", "iface.initiatorname", "-v", &self.node.iqn]).await?;
        Ok(name)
    }

    /// A node record for exactly `portal`, not SendTargets discovery: a
    /// gateway reports the addresses it listens on, which a node behind NAT
    /// (or reaching a gateway that listens on 0.0.0.0) cannot use, and
    /// discovery would record every target the gateway has. Then the login.
    async fn iscsi_login(&self, iqn: &str, portal: &str, iface: &Option<String>, multipath: bool) -> Result<(), Status> {
        let made = run("iscsiadm", &with_iface(vec!["-m", "node", "-o", "new", "-T", iqn, "-p", portal], iface)).await;
        if let Err(e) = made {
            if !e.message().contains("exists") {
                return Err(e);
            }
        }
        if multipath {
            // open-iscsi's default (120 s) holds a dead gateway's I/O for
            // two minutes before dm-multipath may retry it on another path;
            // iscsid.conf's advice for dm-multipath is a few seconds.
            let t = MULTIPATH_REPLACEMENT_TIMEOUT_S.to_string();
            run("iscsiadm", &with_iface(vec!["-m", "node", "-T", iqn, "-p", portal, "-o", "update", "-n", "node.session.timeo.replacement_timeout", "-v", &t], iface)).await?;
        }
        let login = run("iscsiadm", &with_iface(vec!["-m", "node", "-T", iqn, "-p", portal, "--login"], iface)).await;
        if let Err(e) = login {
            if !e.message().contains("already present") {
                return Err(e);
            }
        }
        Ok(())
    }

    async fn detach(&self, how: &How) -> Result<(), Status> {
        match how {
            How::Fuse { dir } => {
                if bw_attach::AttachState::at(dir).is_some() {
                    let bin = self.blockwire.to_string_lossy().into_owned();
                    run(&bin, &["umount", &dir.to_string_lossy()]).await?;
                }
            }
            How::Nvme { nqn } => {
                run("nvme", &["disconnect", "-n", nqn]).await?;
            }
            How::Iscsi { iqn, portals, iface, map } => {
                // The map first: logged out under it, its paths would fail
                // and the map stay (queueing I/O forever with no_path_retry
                // queue). A map still open (mounted) is refused here, and
                // the sessions stay for the retry.
                if let Some(m) = map {
                    if dm_by_name(m).is_some() {
                        run("multipath", &["-f", m]).await?;
                    }
                    remove_stale_mapper_node(m);
                }
                for p in portals {
                    let r = run("iscsiadm", &with_iface(vec!["-m", "node", "-T", iqn, "-p", p, "--logout"], iface)).await;
                    if let Err(e) = r {
                        if !e.message().contains("No matching sessions") {
                            return Err(e);
                        }
                    }
                    // The node record stage made: nothing of the volume left.
                    let _ = run("iscsiadm", &with_iface(vec!["-m", "node", "-o", "delete", "-T", iqn, "-p", p], iface)).await;
                }
            }
        }
        Ok(())
    }
}

/// Poll for up to 10 s (udev and the kernel's scan take a moment).
async fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    for _ in 0..100 {
        if let Some(d) = f() {
            return Some(d);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    None
}

/// The namespace device of subsystem `nqn`, namespace `nsid`: with native
/// multipath one head device (`nvmeXnY`) for all paths.
fn nvme_device(nqn: &str, nsid: u32) -> Option<String> {
    for sub in std::fs::read_dir("/sys/class/nvme-subsystem").ok()?.flatten() {
        let p = sub.path();
        if std::fs::read_to_string(p.join("subsysnqn")).ok()?.trim() != nqn {
            continue;
        }
        for e in std::fs::read_dir(&p).ok()?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("nvme") && n.contains('n') && std::fs::read_to_string(e.path().join("nsid")).is_ok_and(|s| s.trim() == nsid.to_string()) {
                return Some(format!("/dev/{n}"));
            }
        }
    }
    None
}

/// Why dm-multipath cannot join paths on this node, if it cannot: no
/// `multipath` tool, or no dm-multipath in the kernel.
fn dm_multipath_missing() -> Option<String> {
    if !on_path("multipath") {
        return Some("this node has no `multipath` (multipath-tools)".into());
    }
    let module = Path::new("/sys/module/dm_multipath").exists() || std::process::Command::new("modprobe").arg("dm-multipath").output().is_ok_and(|o| o.status.success());
    if !module {
        return Some("this node's kernel has no dm-multipath (modprobe dm-multipath failed)".into());
    }
    None
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Seconds an iSCSI session down holds its I/O before failing it to
/// dm-multipath (open-iscsi's `replacement_timeout`).
const MULTIPATH_REPLACEMENT_TIMEOUT_S: u32 = 5;

/// The dm-multipath map over `disks` (one LUN's SCSI disks, one per
/// portal): multipathd's, where it made one from udev's events, else made
/// with `multipath` (which also adds a path a map lacks). Its name; its
/// /dev/mapper node made where no udev makes it (libdevmapper leaves node
/// creation to udev for multipath's maps).
///
/// multipath names a path by the WWID udev's database gives for it, not
/// the kernel's: where that entry is stale (udev behind, still holding a
/// removed disk's entry for the device number the new disk reuses), it
/// makes a map of the old WWID over the new disk; asked again once udev
/// has caught up, it makes the LUN's map over all the disks beside it
/// (device-mapper lets several maps hold one disk). Such a map (its WWID
/// not the one the disks report in sysfs) is flushed; the map returned is
/// the one of the LUN's WWID holding every disk, once no other holds any.
async fn multipath_map(disks: &[String]) -> Result<String, Status> {
    if on_path("udevadm") {
        // udev done with the logins' disks (and the removals before them).
        let _ = Command::new("udevadm").args(["settle", "--timeout=10"]).output().await;
    }
    let want = multipath_wwid(&disks[0]);
    let mut said = String::new();
    let mut held = vec![];
    for i in 0..50 {
        held = disks.iter().map(|d| holders(d)).collect::<Vec<_>>();
        // Multipath's maps (others, e.g. LVM's, are not this function's).
        let stale: Vec<&Holder> = held.iter().flatten().filter(|m| m.wwid.is_some() && want.is_some() && m.wwid != want).collect();
        let mut flushed = false;
        for map in &stale {
            let r = run("multipath", &["-f", &map.name]).await;
            let outcome = r.as_ref().map_or_else(|e| format!("flush failed ({}), tried again", e.message()), |_| "flushed".into());
            log::warn!("dm-multipath map {} ({}) holds one of {} but is of WWID {:?}, not the LUN's {:?} (made from stale udev data, e.g. a removed disk's entry for a reused device number): {outcome}", map.name, map.dm, disks.join(", "), map.wwid, want);
            flushed |= r.is_ok();
        }
        if stale.is_empty() {
            if let Some(map) = held[0].iter().find(|m| m.wwid.is_some() && held.iter().all(|h| h.contains(m))) {
                make_mapper_node(&map.name, &map.dm)?;
                return Ok(map.name.clone());
            }
        }
        if i % 5 == 0 || flushed {
            // Paths multipath has not seen yet (udev still probing them)
            // are skipped; asked again until all are in one map.
            let out = Command::new("multipath").args(["-v2", &format!("/dev/{}", disks[0])]).output().await.map_err(|e| Status::internal(format!("multipath: {e}")))?;
            said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)).trim().to_string();
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let held: Vec<String> = disks.iter().zip(&held).map(|(d, h)| format!("{d} in {}", if h.is_empty() { "no map".into() } else { h.iter().map(|m| format!("{} (WWID {:?})", m.name, m.wwid)).collect::<Vec<_>>().join(" and ") })).collect();
    Err(Status::failed_precondition(format!(
        "dm-multipath made no map of WWID {want:?} over {} alone in 10 s ({}; multipath said: {said:?}); see multipath.conf (blacklist, find_multipaths), udev's database (`udevadm info /dev/{}`) and `multipath -v3 /dev/{}`",
        disks.join(", "),
        held.join(", "),
        disks[0],
        disks[0]
    )))
}

/// A device-mapper device holding a disk: its `dm-N`, name, and the WWID
/// of its uuid when multipath made it (`mpath-WWID`), else None.
#[derive(Debug, PartialEq)]
struct Holder {
    dm: String,
    name: String,
    wwid: Option<String>,
}

/// Every device-mapper device holding `disk`.
fn holders(disk: &str) -> Vec<Holder> {
    let dms = std::fs::read_dir(format!("/sys/block/{disk}/holders")).into_iter().flatten().flatten().map(|e| e.file_name().to_string_lossy().into_owned());
    dms.filter_map(|dm| {
        let read = |f: &str| std::fs::read_to_string(format!("/sys/block/{dm}/dm/{f}")).ok().map(|s| s.trim().to_string());
        let name = read("name")?;
        let wwid = read("uuid").and_then(|u| u.strip_prefix("mpath-").map(str::to_ascii_lowercase));
        Some(Holder { dm, name, wwid })
    })
    .collect()
}

/// The WWID multipath gives a SCSI disk (udev's ID_SERIAL, as scsi_id
/// makes it: the designator's type digit, then its hex), from the kernel's
/// own `device/wwid`; None for a designator this does not map.
fn multipath_wwid(disk: &str) -> Option<String> {
    let w = std::fs::read_to_string(format!("/sys/block/{disk}/device/wwid")).ok()?;
    let w = w.trim().to_ascii_lowercase();
    [("naa.", '3'), ("eui.", '2')].iter().find_map(|(prefix, digit)| w.strip_prefix(prefix).map(|hex| format!("{digit}{hex}")))
}

/// A dm-multipath map to its paths' size, once they have it (`want`
/// bytes, when known; the rescan that grows them is the kernel's, after
/// `iscsiadm -R`): multipathd's `resize map` where multipathd runs (it
/// keeps its own idea of the map's size), else `multipath -r`: without
/// `-r` multipath leaves the paths of an existing map alone and never
/// compares sizes (multipath-tools 0.9.4, coalesce_paths); with it the map
/// is rebuilt from its paths, at their size.
async fn resize_map(name: &str, want: Option<u64>) -> Result<(), Status> {
    let dm = dm_by_name(name).ok_or_else(|| Status::not_found(format!("dm-multipath map {name} is gone")))?;
    let paths: Vec<String> = std::fs::read_dir(format!("/sys/block/{dm}/slaves")).map_err(|e| Status::internal(format!("{dm}/slaves: {e}")))?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    let grown = |d: &String| want.is_none_or(|w| block_size(&format!("/dev/{d}")).is_some_and(|b| b >= w));
    if paths.is_empty() || wait_for(|| paths.iter().all(grown).then_some(())).await.is_none() {
        let sizes: Vec<String> = paths.iter().map(|d| format!("{d} {} bytes", block_size(&format!("/dev/{d}")).unwrap_or(0))).collect();
        return Err(Status::unavailable(format!("map {name}'s paths ({}) have not grown to {want:?} bytes after the rescan: retry", sizes.join(", "))));
    }
    let daemon = Command::new("multipathd").args(["show", "daemon"]).output().await.is_ok_and(|o| o.status.success());
    if daemon {
        let said = run("multipathd", &["resize", "map", name]).await?;
        if !said.trim().starts_with("ok") {
            return Err(Status::internal(format!("multipathd resize map {name}: {}", said.trim())));
        }
    } else {
        run("multipath", &["-v2", "-r", &format!("/dev/{}", paths[0])]).await?;
    }
    log::info!("dm-multipath map {name} resized over {} ({})", paths.join(", "), if daemon { "multipathd" } else { "multipath" });
    Ok(())
}

/// The `dm-N` of the device-mapper device named `name`, if there is one.
fn dm_by_name(name: &str) -> Option<String> {
    std::fs::read_dir("/sys/block").ok()?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).find(|d| d.starts_with("dm-") && std::fs::read_to_string(format!("/sys/block/{d}/dm/name")).is_ok_and(|n| n.trim() == name))
}

fn make_mapper_node(name: &str, dm: &str) -> Result<(), Status> {
    use std::os::unix::ffi::OsStrExt;
    let path = PathBuf::from(format!("/dev/mapper/{name}"));
    if path.exists() {
        return Ok(());
    }
    let devno = std::fs::read_to_string(format!("/sys/block/{dm}/dev")).map_err(|e| Status::internal(format!("{dm}: {e}")))?;
    let (maj, min) = devno.trim().split_once(':').and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?))).ok_or_else(|| Status::internal(format!("{dm}/dev: {devno:?}")))?;
    std::fs::create_dir_all("/dev/mapper").map_err(|e| Status::internal(format!("/dev/mapper: {e}")))?;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| Status::internal(e.to_string()))?;
    // SAFETY: mknod with a NUL-terminated path.
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(maj, min)) } != 0 {
        return Err(Status::internal(format!("mknod {}: {}", path.display(), std::io::Error::last_os_error())));
    }
    log::info!("made {} ({maj}:{min}): no udev made it", path.display());
    Ok(())
}

/// The /dev/mapper node of a map that is gone (udev removes it; without
/// udev it stays, pointing at a device number the next map may take).
fn remove_stale_mapper_node(name: &str) {
    let path = PathBuf::from(format!("/dev/mapper/{name}"));
    if dm_by_name(name).is_none() && path.exists() {
        let _ = std::fs::remove_file(&path);
    }
}

/// The SCSI disk (`sdX`) of LUN `lun` in the session logged in to `iqn`
/// through `portal` (HOST:PORT).
fn iscsi_disk(iqn: &str, lun: &str, portal: &str) -> Option<String> {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    for s in std::fs::read_dir("/sys/class/iscsi_session").ok()?.flatten() {
        if read(s.path().join("targetname")).as_deref() != Some(iqn) {
            continue;
        }
        let session = s.file_name().to_string_lossy().into_owned();
        let n = session.strip_prefix("session")?;
        let conn = std::fs::read_dir("/sys/class/iscsi_connection").ok()?.flatten().find(|c| c.file_name().to_string_lossy().starts_with(&format!("connection{n}:")))?;
        let (addr, port) = (read(conn.path().join("persistent_address"))?, read(conn.path().join("persistent_port"))?);
        let (want_host, want_port) = portal.rsplit_once(':')?;
        if addr != want_host.trim_start_matches('[').trim_end_matches(']') || port != want_port {
            continue;
        }
        // .../sessionN/targetH:C:T/H:C:T:LUN/block/sdX
        let dev = std::fs::canonicalize(s.path().join("device")).ok()?;
        for t in std::fs::read_dir(&dev).ok()?.flatten().filter(|t| t.file_name().to_string_lossy().starts_with("target")) {
            for l in std::fs::read_dir(t.path()).ok()?.flatten() {
                if l.file_name().to_string_lossy().rsplit(':').next() == Some(lun) {
                    if let Some(b) = std::fs::read_dir(l.path().join("block")).ok().and_then(|mut d| d.next()).and_then(|e| e.ok()) {
                        return Some(b.file_name().to_string_lossy().into_owned());
                    }
                }
            }
        }
    }
    None
}

fn block_size(dev: &str) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(dev).ok()?;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x80081272, &mut size as *mut u64) };
    (r == 0).then_some(size)
}

fn mount_volume(c: &proto::VolumeCapability) -> Option<&proto::volume_capability::MountVolume> {
    match &c.access_type {
        Some(proto::volume_capability::AccessType::Mount(m)) => Some(m),
        _ => None,
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_get_capabilities(&self, _: Request<proto::NodeGetCapabilitiesRequest>) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
        use proto::node_service_capability::{rpc::Type as T, Rpc, Type};
        let mut caps = vec![T::StageUnstageVolume, T::GetVolumeStats, T::SingleNodeMultiWriter];
        if self.attacher == Attacher::Kernel {
            caps.push(T::ExpandVolume);
        }
        Ok(Response::new(proto::NodeGetCapabilitiesResponse {
            capabilities: caps.iter().map(|t| proto::NodeServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: *t as i32 })) }).collect(),
        }))
    }

    async fn node_get_info(&self, _: Request<proto::NodeGetInfoRequest>) -> Result<Response<proto::NodeGetInfoResponse>, Status> {
        Ok(Response::new(proto::NodeGetInfoResponse { node_id: self.node.encode(), max_volumes_per_node: 0, accessible_topology: None }))
    }

    async fn node_stage_volume(&self, req: Request<proto::NodeStageVolumeRequest>) -> Result<Response<proto::NodeStageVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let staging = PathBuf::from(required("staging_target_path", &r.staging_target_path)?);
        let cap = required_msg("volume_capability", &r.volume_capability)?;
        crate::capability::check(std::slice::from_ref(cap)).map_err(Status::invalid_argument)?;
        let _g = self.lock.lock().await;
        let block = mount_volume(cap).is_none();
        if let Some(s) = self.stage_record(id)? {
            if s.block == block && (block || is_mounted(&staging)) {
                return Ok(Response::new(proto::NodeStageVolumeResponse {}));
            }
            return Err(Status::already_exists(format!("volume {id} is staged otherwise ({}): NodeUnstageVolume first", if s.block { "as a block device" } else { "with a file system" })));
        }
        let (device, how) = self.attach(id, &r.publish_context).await?;
        let staged = async {
            if let Some(m) = mount_volume(cap) {
                let fs = [m.fs_type.as_str(), r.volume_context.get("fs").map(String::as_str).unwrap_or(""), DEFAULT_FS].into_iter().find(|f| !f.is_empty()).unwrap_or(DEFAULT_FS).to_string();
                match fs_type(&device).await? {
                    None => {
                        let force = if fs == "xfs" { "-f" } else { "-F" };
                        run(&format!("mkfs.{fs}"), &[force, &device]).await?;
                    }
                    Some(have) if have != fs => return Err(Status::failed_precondition(format!("volume {id} holds {have}, not {fs}"))),
                    Some(_) => {}
                }
                std::fs::create_dir_all(&staging).map_err(|e| Status::internal(format!("{}: {e}", staging.display())))?;
                let mut args = vec!["-t".to_string(), fs.clone()];
                if !m.mount_flags.is_empty() {
                    args.push("-o".into());
                    args.push(m.mount_flags.join(","));
                }
                args.push(device.clone());
                args.push(staging.to_string_lossy().into_owned());
                run("mount", &args.iter().map(String::as_str).collect::<Vec<_>>()).await?;
            }
            self.write_record(id, &Stage { device: device.clone(), how: how.clone(), block, published: vec![] })
        }
        .await;
        if let Err(e) = staged {
            if is_mounted(&staging) {
                let _ = run("umount", &[&staging.to_string_lossy()]).await;
            }
            let _ = self.detach_unless_shared(id, &how).await;
            return Err(e);
        }
        log::info!("staged volume {id}: {device} at {}", staging.display());
        Ok(Response::new(proto::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(&self, req: Request<proto::NodeUnstageVolumeRequest>) -> Result<Response<proto::NodeUnstageVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let staging = PathBuf::from(required("staging_target_path", &r.staging_target_path)?);
        let _g = self.lock.lock().await;
        if is_mounted(&staging) {
            run("umount", &[&staging.to_string_lossy()]).await?;
        }
        if let Some(s) = self.stage_record(id)? {
            // Publications the CO did not undo would hold the device.
            for (t, _) in s.published.iter().filter(|(t, _)| is_mounted(t)) {
                log::warn!("volume {id}: still published at {} when unstaged: unmounted", t.display());
                run("umount", &[&t.to_string_lossy()]).await?;
            }
            self.detach_unless_shared(id, &s.how).await?;
        }
        let dir = self.volume_dir(id)?;
        if dir.exists() {
            let _ = std::fs::remove_file(dir.join("stage.json"));
            let _ = std::fs::remove_dir(dir.join("fuse"));
            std::fs::remove_dir(&dir).map_err(|e| Status::internal(format!("{}: {e}", dir.display())))?;
        }
        log::info!("unstaged volume {id}");
        Ok(Response::new(proto::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(&self, req: Request<proto::NodePublishVolumeRequest>) -> Result<Response<proto::NodePublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let target = PathBuf::from(required("target_path", &r.target_path)?);
        let cap = required_msg("volume_capability", &r.volume_capability)?;
        crate::capability::check(std::slice::from_ref(cap)).map_err(Status::invalid_argument)?;
        let staging = PathBuf::from(required("staging_target_path", &r.staging_target_path)?);
        let _g = self.lock.lock().await;
        let mut s = self.stage_record(id)?.ok_or_else(|| Status::failed_precondition(format!("volume {id} is not staged: NodeStageVolume first")))?;
        if is_mounted(&target) && s.published.iter().any(|(t, _)| t == &target) {
            return Ok(Response::new(proto::NodePublishVolumeResponse {}));
        }
        let single = cap.access_mode.as_ref().is_some_and(|m| m.mode() == proto::volume_capability::access_mode::Mode::SingleNodeSingleWriter);
        if let Some((other, _)) = s.published.iter().find(|(t, excl)| t != &target && (*excl || single)) {
            return Err(Status::failed_precondition(format!("volume {id} is published at {} with single-writer access: one target path at a time", other.display())));
        }
        let source = if s.block {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Status::internal(format!("{}: {e}", parent.display())))?;
            }
            std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&target).map_err(|e| Status::internal(format!("{}: {e}", target.display())))?;
            s.device.clone()
        } else {
            std::fs::create_dir_all(&target).map_err(|e| Status::internal(format!("{}: {e}", target.display())))?;
            staging.to_string_lossy().into_owned()
        };
        let t = target.to_string_lossy().into_owned();
        run("mount", &["--bind", &source, &t]).await?;
        if r.readonly {
            if let Err(e) = run("mount", &["-o", "remount,bind,ro", &t]).await {
                let _ = run("umount", &[&t]).await;
                return Err(e);
            }
        }
        s.published.push((target, single));
        self.write_record(id, &s)?;
        Ok(Response::new(proto::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(&self, req: Request<proto::NodeUnpublishVolumeRequest>) -> Result<Response<proto::NodeUnpublishVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let target = PathBuf::from(required("target_path", &r.target_path)?);
        let _g = self.lock.lock().await;
        if let Ok(Some(mut s)) = self.stage_record(id) {
            s.published.retain(|(t, _)| t != &target);
            self.write_record(id, &s)?;
        }
        if is_mounted(&target) {
            run("umount", &[&target.to_string_lossy()]).await?;
        }
        // CSI: the SP removes the file or directory it made at target_path.
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => std::fs::remove_dir(&target),
            Ok(_) => std::fs::remove_file(&target),
            Err(_) => Ok(()),
        }
        .map_err(|e| Status::internal(format!("{}: {e}", target.display())))?;
        Ok(Response::new(proto::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(&self, req: Request<proto::NodeGetVolumeStatsRequest>) -> Result<Response<proto::NodeGetVolumeStatsResponse>, Status> {
        use proto::volume_usage::Unit;
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let path = PathBuf::from(required("volume_path", &r.volume_path)?);
        let s = self.stage_record(id)?.ok_or_else(|| Status::not_found(format!("volume {id} is not staged on this node")))?;
        if !is_mounted(&path) {
            return Err(Status::not_found(format!("volume {id} is not at {}", path.display())));
        }
        if s.block {
            let total = block_size(&s.device).ok_or_else(|| Status::internal(format!("{}: size unknown", s.device)))?;
            let usage = vec![proto::VolumeUsage { available: 0, total: total as i64, used: 0, unit: Unit::Bytes as i32 }];
            return Ok(Response::new(proto::NodeGetVolumeStatsResponse { usage }));
        }
        let st = nix_statvfs(&path).map_err(|e| Status::internal(format!("statvfs {}: {e}", path.display())))?;
        let usage = vec![
            proto::VolumeUsage { available: st.0 as i64, total: st.1 as i64, used: st.1.saturating_sub(st.2) as i64, unit: Unit::Bytes as i32 },
            proto::VolumeUsage { available: st.3 as i64, total: st.4 as i64, used: st.4.saturating_sub(st.3) as i64, unit: Unit::Inodes as i32 },
        ];
        Ok(Response::new(proto::NodeGetVolumeStatsResponse { usage }))
    }

    async fn node_expand_volume(&self, req: Request<proto::NodeExpandVolumeRequest>) -> Result<Response<proto::NodeExpandVolumeResponse>, Status> {
        let r = req.into_inner();
        let id = required("volume_id", &r.volume_id)?;
        let path = PathBuf::from(required("volume_path", &r.volume_path)?);
        let s = self.stage_record(id)?.ok_or_else(|| Status::not_found(format!("volume {id} is not staged on this node")))?;
        if self.attacher == Attacher::Fuse {
            return Err(Status::unimplemented("blockwire attach keeps the size it attached with: unstage and stage again"));
        }
        let _g = self.lock.lock().await;
        let want = r.capacity_range.as_ref().map(|c| c.required_bytes.max(0) as u64).filter(|w| *w > 0);
        if let How::Iscsi { iqn, portals, iface, map } = &s.how {
            for p in portals {
                run("iscsiadm", &with_iface(vec!["-m", "node", "-T", iqn, "-p", p, "-R"], iface)).await?;
            }
            if let Some(m) = map {
                resize_map(m, want).await?;
            }
        }
        if let Some(want) = want {
            grown_to(&s, want).await?;
        }
        if !s.block {
            let m = bw_attach::mount_at(&path).ok_or_else(|| Status::not_found(format!("{}: not a mount point", path.display())))?;
            match m.fstype.as_str() {
                "xfs" => run("xfs_growfs", &[&path.to_string_lossy()]).await?,
                _ => run("resize2fs", &[&s.device]).await?,
            };
        }
        Ok(Response::new(proto::NodeExpandVolumeResponse { capacity_bytes: block_size(&s.device).unwrap_or(0) as i64 }))
    }
}

/// Wait until the staged device is `want` bytes or more. The gateways tell
/// NVMe hosts of a resize with an asynchronous event (Namespace Attribute
/// Changed) that the kernel handles in its own time; ControllerExpand has
/// returned by then, and growing the file system before the device has
/// grown would do nothing and report success. Where the event is late or
/// lost, each controller is asked to rescan.
async fn grown_to(s: &Stage, want: u64) -> Result<(), Status> {
    for i in 0..100 {
        if block_size(&s.device).is_some_and(|b| b >= want) {
            return Ok(());
        }
        if let (How::Nvme { nqn }, 20 | 60) = (&s.how, i) {
            for c in nvme_controllers(nqn) {
                let _ = run("nvme", &["ns-rescan", &format!("/dev/{c}")]).await;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(Status::unavailable(format!("{} is {} bytes, not yet the {want} asked for: retry", s.device, block_size(&s.device).unwrap_or(0))))
}

/// The controllers (`nvmeN`) connected to subsystem `nqn`.
fn nvme_controllers(nqn: &str) -> Vec<String> {
    let mut out = vec![];
    for sub in std::fs::read_dir("/sys/class/nvme-subsystem").into_iter().flatten().flatten() {
        if std::fs::read_to_string(sub.path().join("subsysnqn")).is_ok_and(|n| n.trim() == nqn) {
            for e in std::fs::read_dir(sub.path()).into_iter().flatten().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.strip_prefix("nvme").is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())) {
                    out.push(n);
                }
            }
        }
    }
    out
}

/// (bytes available, total bytes, free bytes, inodes free, inodes total).
fn nix_statvfs(p: &Path) -> std::io::Result<(u64, u64, u64, u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: statvfs fills the struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let f = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * f, st.f_blocks as u64 * f, st.f_bfree as u64 * f, st.f_ffree as u64, st.f_files as u64))
}
