//! `blockwire csi` against a real serve: csi-sanity (the Kubernetes
//! project's conformance suite for CSI drivers, kubernetes-csi/csi-test,
//! installed by `make deps` with `go install`), hostile gRPC, and QoS
//! set through ControllerModifyVolume holding over NVMe/TCP.
//!
//! The plugin's node side uses this host's FUSE attach (no kernel
//! initiator here); serve has one directory pool (copy = true: /tmp has
//! no reflinks) and answers the control API over HTTP only.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The specs csi-sanity skips, each for a capability the plugin does not
/// advertise (docs/notes/2026-11-25-csi.md says why of each); any other
/// skip fails the test, as a failure does.
const EXPECTED_SKIPS: &[(&str, &str)] = &[
    ("NodeExpandVolume", "NodeExpandVolume not supported"),
    ("NodeGetVolumeHealth", "NodeGetVolumeHealth not supported"),
    ("NodeGetStorageHealth", "NodeGetStorageHealth not supported"),
    ("ControllerListVolumeHealth", "ControllerListVolumeHealth not supported"),
    ("ControllerGetVolumeHealth", "ControllerGetVolumeHealth not supported"),
    ("max attach limit", "testnodevolumeattachlimit not enabled"),
    ("already published but is incompatible", "ControllerPublishVolume.readonly field not supported"),
    ("GroupController", "GroupControllerService not supported"),
    ("accessibility requirements", "SNAPSHOT_ACCESSIBILITY_CONSTRAINTS not supported"),
];

/// csi-sanity on PATH or where `go install` puts it.
fn csi_sanity() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(g) = std::env::var_os("GOPATH") {
        dirs.push(PathBuf::from(g).join("bin"));
    }
    dirs.push(PathBuf::from("/root/go/bin"));
    dirs.into_iter().map(|d| d.join("csi-sanity")).find(|p| p.is_file())
}

/// A serve with a pool and the control API over HTTP, and the plugin
/// (controller and node) on a socket in `dir`.
struct Setup {
    dir: TempDir,
    serve: Serve,
    plugin: Option<Child>,
    socket: PathBuf,
    http: String,
    creds: PathBuf,
    nvme: u16,
}

impl Setup {
    fn start(tag: &str) -> Setup {
        require_root();
        let dir = TempDir::new(tag);
        let pool = dir.path().join("pool");
        std::fs::create_dir_all(&pool).unwrap();
        let creds = dir.path().join("creds");
        std::fs::write(&creds, "csi:sanity-secret\n").unwrap();
        std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let (nvme, http) = (free_port(), free_port());
        let toml = format!("[[pool]]\nname = \"p\"\npath = \"{}\"\ncopy = true\n\n[nvme]\nlisten = [\"127.0.0.1:{nvme}\"]\n", pool.display());
        let http = format!("127.0.0.1:{http}");
        let serve = Serve::with_config(&dir, &toml, &["--control", "none", "--rpc-http", &http, "--rpc-http-credentials", creds.to_str().unwrap()]);
        let socket = dir.path().join("csi.sock");
        let state = dir.path().join("state");
        let plugin = Command::new(blockwire_bin())
            .args(["csi", "--endpoint", socket.to_str().unwrap(), "--gateway", &format!("http://{http}"), "--credentials", creds.to_str().unwrap()])
            .args(["--attach", "fuse", "--state-dir", state.to_str().unwrap(), "--host-nqn", "nqn.2026-11.io.blockwire.test:csi-node", "--iqn", "iqn.2026-11.io.blockwire.test:csi-node", "-v"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("csi.log")).unwrap())
            .spawn()
            .expect("spawn blockwire csi");
        let t0 = Instant::now();
        while !socket.exists() {
            assert!(t0.elapsed() < Duration::from_secs(30), "the plugin did not make {} in 30 s", socket.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        Setup { dir, serve, plugin: Some(plugin), socket, http, creds, nvme }
    }

    /// A control call over HTTP, as the plugin makes them.
    fn ctl(&self, method: &str, params: &str) -> serde_json::Value {
        control_call(&self.http, &self.creds, method, params)
    }

    fn plugin_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("csi.log")).unwrap_or_default()
    }

    /// What a run must leave: no volume, no export, no mount or attach
    /// daemon of the plugin's, no stage record.
    fn assert_nothing_left(&self) {
        let vols = self.ctl("volume_list", "null");
        assert_eq!(vols.as_array().map(|a| a.len()), Some(0), "volumes left: {vols}");
        let st = self.ctl("status", "null");
        assert_eq!(st["nvme_subsystems"].as_array().map(|a| a.len()), Some(0), "subsystems left: {}", st["nvme_subsystems"]);
        let root = self.dir.path().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let ours: Vec<&str> = mounts.lines().filter(|l| l.contains(&root)).collect();
        assert!(ours.is_empty(), "mounts left: {ours:?}");
        let state = self.dir.path().join("state");
        let left: Vec<_> = std::fs::read_dir(&state).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        assert!(left.is_empty(), "stage records left in {}: {left:?}", state.display());
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(mut p) = self.plugin.take() {
            // SAFETY: signalling our own child by PID.
            unsafe { libc::kill(p.id() as i32, libc::SIGTERM) };
            let _ = p.wait();
        }
        // Anything a failed run left attached under the directory.
        let root = self.dir.path().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut points: Vec<&str> = mounts.lines().filter_map(|l| l.split(' ').nth(1)).filter(|p| p.starts_with(&root) && !p.ends_with("/fuse")).collect();
        points.reverse();
        for p in points {
            let _ = Command::new("umount").arg(p).status();
        }
        for e in std::fs::read_dir(self.dir.path().join("state")).into_iter().flatten().flatten() {
            let fuse = e.path().join("fuse");
            if bw_attach_state_exists(&fuse) {
                let _ = Command::new(blockwire_bin()).args(["umount", "--wait", "5"]).arg(&fuse).status();
            }
        }
        let _ = &self.serve;
    }
}

fn bw_attach_state_exists(fuse: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mounts").unwrap_or_default().lines().any(|l| l.split(' ').nth(1) == Some(&*fuse.to_string_lossy()))
}

/// csi-sanity's whole suite: every spec passes or is skipped for a
/// capability the plugin does not advertise; afterwards nothing of the
/// run is left on the gateway or the node. About 10 s.
#[test]
fn csi_sanity_passes() {
    let Some(sanity) = csi_sanity() else {
        return skip("no csi-sanity (make deps installs it with go install where Go and its module proxy are reachable)");
    };
    let s = Setup::start("csi");
    let d = s.dir.path();
    std::fs::write(d.join("params.yaml"), "pool: p\n").unwrap();
    std::fs::write(d.join("mutable.yaml"), "rw_ios_per_sec: \"2000\"\nw_mbytes_per_sec: \"64\"\n").unwrap();
    std::fs::write(d.join("secrets.yaml"), secrets_yaml(&std::fs::read_to_string(&s.creds).unwrap())).unwrap();
    let report = d.join("report.json");
    let out = Command::new(&sanity)
        .arg(format!("--csi.endpoint={}", s.socket.display()))
        .arg(format!("--csi.stagingdir={}", d.join("stage").display()))
        .arg(format!("--csi.mountdir={}", d.join("mnt").display()))
        .args(["--csi.testvolumesize=67108864", "--csi.testvolumeexpandsize=134217728"])
        .arg(format!("--csi.testvolumeparameters={}", d.join("params.yaml").display()))
        .arg(format!("--csi.testvolumemutableparameters={}", d.join("mutable.yaml").display()))
        .arg(format!("--csi.secrets={}", d.join("secrets.yaml").display()))
        .arg("--ginkgo.no-color")
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .arg("--ginkgo.timeout=5m")
        .output()
        .expect("run csi-sanity");
    let text = String::from_utf8_lossy(&out.stdout);
    let tail: String = text.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    assert!(out.status.success(), "csi-sanity failed:\n{tail}\nplugin log:\n{}", s.plugin_log());
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).expect("the JSON report")).unwrap();
    let (mut passed, mut unexpected) = (0, vec![]);
    let mut skipped_specs = 0;
    for spec in r[0]["SpecReports"].as_array().expect("specs") {
        let name = format!("{} {}", spec["ContainerHierarchyTexts"].as_array().map(|a| a.iter().filter_map(|t| t.as_str()).collect::<Vec<_>>().join(" ")).unwrap_or_default(), spec["LeafNodeText"].as_str().unwrap_or(""));
        match spec["State"].as_str() {
            Some("passed") => passed += 1,
            Some("skipped") => {
                skipped_specs += 1;
                let why = spec["Failure"]["Message"].as_str().unwrap_or("");
                if !EXPECTED_SKIPS.iter().any(|(part, reason)| name.contains(part) && why == *reason) {
                    unexpected.push(format!("{name}: {why}"));
                }
            }
            Some("pending") | None => {}
            Some(other) => unexpected.push(format!("{name}: {other}")),
        }
    }
    println!("csi-sanity: {passed} passed, {skipped_specs} skipped (capabilities not advertised)");
    assert!(unexpected.is_empty(), "specs skipped for another reason, or not passed: {unexpected:#?}");
    assert!(passed >= 80, "only {passed} specs passed:\n{tail}");
    s.assert_nothing_left();
}

fn secrets_yaml(creds: &str) -> String {
    let (u, p) = creds.trim().split_once(':').unwrap();
    let keys = [
        "CreateVolumeSecret", "DeleteVolumeSecret", "ControllerPublishVolumeSecret", "ControllerUnpublishVolumeSecret",
        "ControllerValidateVolumeCapabilitiesSecret", "NodeStageVolumeSecret", "NodePublishVolumeSecret", "CreateSnapshotSecret",
        "DeleteSnapshotSecret", "ControllerExpandVolumeSecret", "ListSnapshotsSecret", "ControllerModifyVolumeSecret",
    ];
    keys.iter().map(|k| format!("{k}:\n  username: {u}\n  password: {p}\n")).collect()
}

mod hostile {
    use super::*;
    use bw_csi::proto;

    /// CreateVolume as csi.proto has it, plus a field it lacks (tag 99),
    /// and one whose name bytes are not UTF-8 (a string field's wire form).
    #[derive(Clone, PartialEq, prost::Message)]
    struct OddCreate {
        #[prost(bytes = "vec", tag = "1")]
        name: Vec<u8>,
        #[prost(string, tag = "99")]
        unknown: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Empty {}

    async fn raw(channel: tonic::transport::Channel, msg: OddCreate) -> tonic::Status {
        let mut g = tonic::client::Grpc::new(channel);
        g.ready().await.unwrap();
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/csi.v1.Controller/CreateVolume");
        let r: Result<tonic::Response<Empty>, _> = g.unary(tonic::Request::new(msg), path, tonic_prost::ProstCodec::default()).await;
        r.expect_err("the plugin took it")
    }

    /// Malformed and hostile requests get the CSI code and change nothing
    /// on the gateway. About 2 s.
    #[test]
    fn malformed_grpc_gets_the_csi_code_and_changes_nothing() {
        let s = Setup::start("csih");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let ch = bw_csi::client::connect_unix(s.socket.clone()).await.expect("connect");
            let mut c = proto::controller_client::ControllerClient::new(ch.clone()).max_encoding_message_size(8 << 20);
            let cap = proto::VolumeCapability {
                access_mode: Some(proto::volume_capability::AccessMode { mode: proto::volume_capability::access_mode::Mode::SingleNodeWriter as i32 }),
                access_type: Some(proto::volume_capability::AccessType::Mount(Default::default())),
            };
            let create = |name: &str, req: i64, lim: i64| proto::CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(proto::CapacityRange { required_bytes: req, limit_bytes: lim }),
                volume_capabilities: vec![cap.clone()],
                parameters: [("pool".to_string(), "p".to_string())].into(),
                ..Default::default()
            };
            use tonic::Code;
            let code = |r: Result<tonic::Response<proto::CreateVolumeResponse>, tonic::Status>| r.map(|_| Code::Ok).unwrap_or_else(|e| e.code());
            // Oversized: 2 MiB of name, over the 1 MiB the plugin takes;
            // refused before decoding, with tonic's code for it
            // (OUT_OF_RANGE; grpc-go says RESOURCE_EXHAUSTED).
            let big = "x".repeat(2 << 20);
            let st = c.create_volume(create(&big, 1 << 20, 0)).await.unwrap_err();
            assert_eq!(st.code(), Code::OutOfRange, "{st}");
            assert!(st.message().contains("too large"), "{st}");
            assert_eq!(code(c.create_volume(create("", 1 << 20, 0)).await), Code::InvalidArgument);
            assert_eq!(code(c.create_volume(create(&"n".repeat(129), 1 << 20, 0)).await), Code::InvalidArgument);
            assert_eq!(code(c.create_volume(create("neg", -1, 0)).await), Code::InvalidArgument);
            assert_eq!(code(c.create_volume(create("range", 5000, 6000)).await), Code::OutOfRange);
            let mut odd = create("param", 1 << 20, 0);
            odd.parameters.insert("replicas".into(), "3".into());
            assert_eq!(code(c.create_volume(odd).await), Code::InvalidArgument);
            let mut caps = create("caps", 1 << 20, 0);
            caps.volume_capabilities.clear();
            assert_eq!(code(c.create_volume(caps).await), Code::InvalidArgument);
            let mut qos = create("qos", 1 << 20, 0);
            qos.mutable_parameters.insert("rw_ios_per_sec".into(), "lots".into());
            assert_eq!(code(c.create_volume(qos).await), Code::InvalidArgument);
            // A name that is not UTF-8: the message does not decode.
            let st = raw(ch.clone(), OddCreate { name: vec![0xff, 0xfe, b'a'], unknown: String::new() }).await;
            assert_eq!(st.code(), Code::Internal, "{st}");
            // A field csi.proto lacks is passed over (proto3); the request
            // is then judged by what it has: no capabilities.
            let st = raw(ch.clone(), OddCreate { name: b"unknown-field".to_vec(), unknown: "x".into() }).await;
            assert_eq!(st.code(), Code::InvalidArgument, "{st}");
            // Unknown objects.
            let st = c.delete_volume(proto::DeleteVolumeRequest { volume_id: "../../etc".into(), ..Default::default() }).await;
            assert!(st.is_ok(), "deleting what does not exist is OK (CSI)");
            let st = c.controller_expand_volume(proto::ControllerExpandVolumeRequest { volume_id: "nope".into(), capacity_range: Some(proto::CapacityRange { required_bytes: 1 << 20, limit_bytes: 0 }), ..Default::default() }).await.unwrap_err();
            assert_eq!(st.code(), Code::NotFound);
            let mut n = proto::node_client::NodeClient::new(ch);
            let st = n.node_get_volume_stats(proto::NodeGetVolumeStatsRequest { volume_id: "../x".into(), volume_path: "/".into(), ..Default::default() }).await.unwrap_err();
            assert_eq!(st.code(), Code::NotFound);
        });
        s.assert_nothing_left();
        assert!(!s.dir.path().join("pool").read_dir().unwrap().any(|e| e.is_ok()), "a pool file was made");
    }
}

/// QoS set through ControllerModifyVolume holds over NVMe/TCP (asserted
/// from above only: at most 10% over the limit, whatever the machine's
/// load), and lifting it through bdev_set_qos_limit is reported. About 8 s.
#[test]
fn qos_from_controller_modify_volume_holds_over_nvme_tcp() {
    let s = Setup::start("csiq");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let id = rt.block_on(async {
        use bw_csi::proto;
        let ch = bw_csi::client::connect_unix(s.socket.clone()).await.expect("connect");
        let mut c = proto::controller_client::ControllerClient::new(ch);
        let cap = proto::VolumeCapability {
            access_mode: Some(proto::volume_capability::AccessMode { mode: proto::volume_capability::access_mode::Mode::SingleNodeWriter as i32 }),
            access_type: Some(proto::volume_capability::AccessType::Block(Default::default())),
        };
        let v = c
            .create_volume(proto::CreateVolumeRequest { name: "pvc-qos".into(), capacity_range: Some(proto::CapacityRange { required_bytes: 64 << 20, limit_bytes: 0 }), volume_capabilities: vec![cap.clone()], parameters: [("pool".to_string(), "p".to_string())].into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        c.controller_modify_volume(proto::ControllerModifyVolumeRequest { volume_id: v.volume_id.clone(), mutable_parameters: [("rw_ios_per_sec".to_string(), "500".to_string())].into(), ..Default::default() }).await.unwrap();
        v.volume_id
    });
    let listed = s.ctl("volume_list", "null");
    assert_eq!(listed[0]["qos"]["rw_ios_per_sec"], 500, "{listed}");
    s.ctl("nvme_subsystem_add", &format!(r#"{{"nqn":"nqn.2026-11.io.blockwire.test:qos","namespaces":[{{"nsid":1,"volume":"{id}"}}]}}"#));
    let url = format!("nvme+tcp://127.0.0.1:{}/nqn.2026-11.io.blockwire.test:qos/1", s.nvme);
    let out = blockwire_ok(None, &["bench", &url, "--runtime", "4", "--bs", "4096", "--iodepth", "32", "--rw", "randread", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let iops = v["iops"].as_f64().unwrap_or_else(|| panic!("no iops in {v}"));
    println!("NVMe/TCP 4 KiB QD32 reads under rw_ios_per_sec 500: {iops:.0} IOPS");
    assert!(iops <= 550.0, "{iops:.0} IOPS under a 500 IOPS limit");
    assert!(iops > 0.0);
    s.ctl("bdev_set_qos_limit", &format!(r#"{{"name":"{id}","rw_ios_per_sec":0}}"#));
    assert_eq!(s.ctl("volume_list", "null")[0]["qos"], serde_json::json!({}));
    s.ctl("nvme_subsystem_remove", r#"{"nqn":"nqn.2026-11.io.blockwire.test:qos"}"#);
    s.ctl("volume_delete", &format!(r#"{{"name":"{id}"}}"#));
    s.assert_nothing_left();
}

/// A control call to a gateway's `--rpc-http` endpoint `http` with the
/// USER:PASSWORD in `creds`; its result (an error fails the test).
pub(crate) fn control_call(http: &str, creds: &Path, method: &str, params: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}}}"#);
    let auth = base64_encode(std::fs::read_to_string(creds).unwrap().trim().as_bytes());
    let mut t = std::net::TcpStream::connect(http).expect("connect to --rpc-http");
    write!(t, "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut answer = String::new();
    t.read_to_string(&mut answer).unwrap();
    let json = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{method}: {e}: {answer}"));
    assert!(v.get("error").is_none(), "{method}: {v}");
    v["result"].clone()
}

fn base64_encode(b: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

/// `nvmeSubsystem: shared`: two volumes published through one subsystem,
/// each a namespace only the nodes it was published to see (checked with
/// a raw NVMe/TCP host per node: its Identify active namespace list);
/// unpublishing hides it, the last unpublish removes the namespace and
/// then the subsystem. About 3 s.
#[test]
fn shared_subsystem_shows_each_node_its_own_namespaces() {
    use bw_csi::proto;
    let s = Setup::start("csis");
    let (a, b) = ("nqn.2026-11.io.blockwire.test:node-a", "nqn.2026-11.io.blockwire.test:node-b");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ch = rt.block_on(bw_csi::client::connect_unix(s.socket.clone())).expect("connect");
    let mut c = proto::controller_client::ControllerClient::new(ch);
    let cap = proto::VolumeCapability {
        access_mode: Some(proto::volume_capability::AccessMode { mode: proto::volume_capability::access_mode::Mode::SingleNodeWriter as i32 }),
        access_type: Some(proto::volume_capability::AccessType::Block(Default::default())),
    };
    let params: std::collections::HashMap<String, String> = [("pool".to_string(), "p".to_string()), ("nvmeSubsystem".to_string(), "shared".to_string())].into();
    let bad = rt.block_on(c.create_volume(proto::CreateVolumeRequest { name: "pvc-x".into(), volume_capabilities: vec![cap.clone()], parameters: [("nvmeSubsystem".to_string(), "some".to_string())].into(), ..Default::default() }));
    assert_eq!(bad.unwrap_err().code(), tonic::Code::InvalidArgument);
    let mut vols = vec![];
    for name in ["pvc-s1", "pvc-s2"] {
        let req = proto::CreateVolumeRequest { name: name.into(), capacity_range: Some(proto::CapacityRange { required_bytes: 8 << 20, limit_bytes: 0 }), volume_capabilities: vec![cap.clone()], parameters: params.clone(), ..Default::default() };
        vols.push(rt.block_on(c.create_volume(req)).unwrap().into_inner().volume.unwrap());
    }
    let publish = |c: &mut proto::controller_client::ControllerClient<_>, v: &proto::Volume, host: &str| {
        let req = proto::ControllerPublishVolumeRequest { volume_id: v.volume_id.clone(), node_id: format!("{host} iqn.2026-11.io.blockwire.test:x"), volume_capability: Some(cap.clone()), volume_context: v.volume_context.clone(), ..Default::default() };
        rt.block_on(c.controller_publish_volume(req)).unwrap().into_inner().publish_context
    };
    let unpublish = |c: &mut proto::controller_client::ControllerClient<_>, v: &proto::Volume, host: &str| {
        rt.block_on(c.controller_unpublish_volume(proto::ControllerUnpublishVolumeRequest { volume_id: v.volume_id.clone(), node_id: format!("{host} iqn.2026-11.io.blockwire.test:x"), ..Default::default() })).unwrap();
    };
    let p1 = publish(&mut c, &vols[0], a);
    let p2 = publish(&mut c, &vols[1], b);
    let again = publish(&mut c, &vols[0], a);
    assert_eq!(p1, again, "publishing again is idempotent");
    assert_eq!(p1["nqn"], p2["nqn"], "one subsystem");
    assert_eq!((p1["nsid"].as_str(), p2["nsid"].as_str()), ("1", "2"));
    let nqn = p1["nqn"].clone();
    // What each node's host sees: the active namespace list.
    let active = |host: &str| -> Vec<u32> {
        let (mut q, cq) = crate::common::nvme_raw::RawNvme::connected(s.nvme, &nqn, 0, 0xFFFF, host, [3; 16]);
        assert!(cq.status.is_success(), "{host}: {cq:?}");
        assert!(q.command(bw_nvme::fabrics::Property::set_sqe(2, bw_nvme::fabrics::reg::CC, 0x46_0001), &[]).unwrap().status.is_success());
        let mut id = bw_nvme::queue_entry::Sqe::new(bw_nvme::queue_entry::admin::IDENTIFY, 5, 0);
        id.set_cdw(10, bw_nvme::identify::cns::ACTIVE_NS_LIST as u32);
        id.set_sgl(bw_nvme::queue_entry::Sgl { addr: 0, length: 4096, kind: bw_nvme::queue_entry::sgl::TRANSPORT });
        let (_, d) = q.exchange(id, &[]).unwrap();
        d.chunks(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).take_while(|n| *n != 0).collect()
    };
    assert_eq!((active(a), active(b)), (vec![1], vec![2]));
    publish(&mut c, &vols[1], a);
    assert_eq!((active(a), active(b)), (vec![1, 2], vec![2]));
    let del = rt.block_on(c.delete_volume(proto::DeleteVolumeRequest { volume_id: vols[1].volume_id.clone(), ..Default::default() }));
    assert_eq!(del.unwrap_err().code(), tonic::Code::FailedPrecondition, "a published volume was deleted");
    unpublish(&mut c, &vols[1], a);
    assert_eq!((active(a), active(b)), (vec![1], vec![2]));
    unpublish(&mut c, &vols[0], a);
    let st = s.ctl("status", "null");
    let sub = st["nvme_subsystems"].as_array().unwrap().iter().find(|x| x["nqn"] == nqn).expect("the subsystem stays while it has a namespace").clone();
    assert_eq!(sub["allowed_hosts"], serde_json::json!([b]), "node a, shown nothing, left the subsystem: {sub}");
    unpublish(&mut c, &vols[1], b);
    assert!(!s.ctl("status", "null")["nvme_subsystems"].as_array().unwrap().iter().any(|x| x["nqn"] == nqn), "the empty subsystem was left");
    for v in &vols {
        rt.block_on(c.delete_volume(proto::DeleteVolumeRequest { volume_id: v.volume_id.clone(), ..Default::default() })).unwrap();
    }
    s.assert_nothing_left();
}
