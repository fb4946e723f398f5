//! One link's targets and the subjects measured through them: every
//! target started once (blockwire serve with all its protocols and the
//! peers: they listen on different ports and AoE shelves), the client
//! host's kernel initiators attached to them, then every stage's cases
//! over the live subjects, then the sessions and targets stopped.

use super::context::RunContext;
use crate::subjects::{blockwire, Subject};
use crate::subjects::process::TargetProcess;
use crate::network::topology::{Link, Topology};
use bw_lab_results::{Failure, SubjectKey};
use std::time::Duration;

/// Consecutive failed runs after which a subject is given up (at this MTU).
pub const MAX_CONSECUTIVE_FAILURES: u32 = 2;

/// A subject being measured on one link, and how its runs are going.
pub struct LiveSubject {
    pub key: SubjectKey,
    pub url: String,
    /// A kernel initiator's block device (fio runs on it instead of the
    /// bench on `url`), and what detaches it.
    pub kernel: Option<crate::subjects::clients::Attached>,
    /// Index of the target process that serves it (None: an external
    /// subject, which the lab does not run).
    pub proc: Option<usize>,
    /// The target and protocol it measures.
    pub subject: Subject,
    /// The client measuring it.
    pub client: crate::subjects::clients::ClientKind,
    pub done: u64,
    pub consecutive_failures: u32,
    pub gave_up: bool,
}

impl LiveSubject {
    fn new(subject: Subject, link: &Link, proc: Option<usize>) -> LiveSubject {
        LiveSubject {
            key: subject.key(),
            url: subject.url(link),
            kernel: None,
            proc,
            subject,
            client: crate::subjects::clients::ClientKind::Blockwire,
            done: 0,
            consecutive_failures: 0,
            gave_up: false,
        }
    }

    /// Stop measuring it at this MTU: record why, keep the progress bar
    /// honest, and mark it unavailable if it never produced a sample.
    pub fn give_up(&mut self, cx: &mut RunContext, per_subject: u64, mtu: u32, workload: &str, why: String, failures_recorded: bool) {
        self.gave_up = true;
        cx.progress().inc(per_subject.saturating_sub(self.done));
        if !failures_recorded {
            cx.push_failure(Failure { subject: self.key.clone().into(), mtu: Some(mtu), workload: workload.into(), reason: why.clone() });
        }
        if cx.results().samples.iter().all(|x| x.subject != self.key) {
            let last = cx.results().failures.last().map(|f| f.reason.clone()).unwrap_or(why.clone());
            if let Some(subj) = cx.subject_record_mut(&self.key) {
                subj.unavailable.get_or_insert(last);
            }
        }
        cx.say(&format!("lab: {} at MTU {mtu}: {why}", self.key));
    }
}

/// Where blockwire's client reaches an external subject from: the client
/// host between machines; in one box this machine itself (the lab's
/// namespaces reach nothing outside).
pub fn external_client(topo: &Topology) -> crate::hosts::host::Host {
    if topo.remote {
        topo.client.clone()
    } else {
        crate::hosts::host::Host::Local
    }
}

/// Before an external subject is measured: what it says it is
/// (`blockwire identify`, from where its client runs) goes on its records,
/// and its size must hold the run's volume. Err: why it is unavailable.
fn visit_external(cx: &mut RunContext, topo: &Topology, s: Subject) -> Result<(), String> {
    let Some(e) = s.external() else { return Ok(()) };
    let client = external_client(topo);
    let exe = client.lab_exe(cx.exe()).to_string_lossy().into_owned();
    if e.address.serves_files() {
        make_nfs_image(&client, &exe, e.url, cx.plan().params.size_bytes)?;
    }
    let out = client
        .command_with(&exe, &["identify", "--json", "--timeout", "15", e.url])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|err| format!("cannot run blockwire identify on {}: {err}", client.name()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("not reachable from {}: {}", client.name(), crate::command::last_lines(err.trim(), 2).replace('\n', "; ")));
    }
    let json = client.program_output(&stdout).map_err(|err| format!("{err:#}"))?;
    let v: serde_json::Value = serde_json::from_str(json.trim()).map_err(|err| format!("blockwire identify printed no JSON: {err}"))?;
    let size = v["size_bytes"].as_u64().unwrap_or(0);
    let need = cx.plan().params.size_bytes;
    if size < need {
        return Err(format!("it has {} MiB, the run's volume is {} MiB: give --size {}M or less", size >> 20, need >> 20, size >> 20));
    }
    let identity = v["identity"].as_str().map(str::to_string);
    cx.say(&format!("lab: {}: {} ({} MiB), measured from {}", s.key(), identity.as_deref().unwrap_or("no identity"), size >> 20, client.name()));
    for c in cx.clients().into_iter().filter(|c| c.serves(s)) {
        let key = c.key(s);
        if let Some(r) = cx.subject_record_mut(&key) {
            r.identity = identity.clone();
        }
    }
    Ok(())
}

/// The lab's own image file on an external NFS export (`url`), made from
/// `client` with the lab's binary `exe` there, recorded first (the host's
/// state file, `nfsimage`), removed at the run's end or by the next run.
/// Nothing else on the export is written.
fn make_nfs_image(client: &crate::hosts::host::Host, exe: &str, url: &str, size: u64) -> Result<(), String> {
    let undo = crate::cleanup::Resource::owned(crate::hosts::host::ShellUndo {
        host: client.clone(),
        script: crate::hosts::state_file::UNDO_ONE,
        args: vec!["nfsimage".into(), url.into(), exe.into()],
    });
    client.record("nfsimage", url, exe).map_err(|e| format!("{e:#}"))?;
    crate::cleanup::registry()
        .create(undo, || {
            let out = client.command_with(exe, &["nfs", "create", url, "--size", &size.to_string()]).stdin(std::process::Stdio::null()).output()?;
            let err = String::from_utf8_lossy(&out.stderr);
            anyhow::ensure!(out.status.success(), "cannot make the lab's image file {url}: {}", crate::command::last_lines(err.trim(), 2).replace('\n', "; "));
            Ok(())
        })
        .map(|_| ())
        .map_err(|e| format!("{e:#}"))
}

/// The targets of one link and the subjects live on them.
pub struct LinkRun<'a> {
    pub topo: &'a Topology,
    pub link: &'a Link,
    pub procs: Vec<TargetProcess>,
    pub live: Vec<LiveSubject>,
    /// The first link of the first factor combination of its shape (the
    /// fs suite runs there only).
    pub first: bool,
}

impl<'a> LinkRun<'a> {
    /// Start every target of the plan measured at the current digest
    /// setting on `link`, check AoE's reach between hosts, and attach the
    /// client host's kernel initiators. What does not start is marked
    /// unavailable and left out.
    pub fn start(cx: &mut RunContext, topo: &'a Topology, link: &'a Link, first: bool) -> LinkRun<'a> {
        // What starting them records (a target that did not start) belongs
        // to them: a resumed run that starts them again records it anew.
        cx.begin_case(&crate::resume::case::targets(&cx.at(), link.mtu));
        let run = LinkRun::start_targets(cx, topo, link, first);
        cx.end_case();
        run
    }

    fn start_targets(cx: &mut RunContext, topo: &'a Topology, link: &'a Link, first: bool) -> LinkRun<'a> {
        let mut run = LinkRun { topo, link, procs: vec![], live: vec![], first };
        let measured = cx.plan().subjects_for(cx.digest(), cx.tls());
        let mut ours: Vec<_> = cx.plan().protocols.iter().copied().filter(|p| measured.contains(&Subject::Blockwire(*p))).collect();
        let mut peers = cx.plan().peers.clone();
        if topo.routed {
            // AoE is Ethernet frames: a router between the hosts ends it.
            let why = "AoE needs the hosts on one layer-2 segment; the client reaches the target through a router";
            for p in ours.iter().filter(|p| **p == crate::subjects::Protocol::Aoe) {
                cx.mark_target_unavailable(Subject::Blockwire(*p), link.mtu, why.into());
            }
            for p in peers.iter().filter(|p| p.target().address().aoe().is_some()) {
                cx.mark_target_unavailable(Subject::Peer(*p), link.mtu, why.into());
            }
            ours.retain(|p| *p != crate::subjects::Protocol::Aoe);
            peers.retain(|p| p.target().address().aoe().is_none());
        }
        let rdma = crate::subjects::Protocol::NvmeRdma;
        if ours.contains(&rdma) {
            // No RDMA device on the link: one line, no serve that fails to bind.
            let why = crate::network::rdma::check(&topo.target, &link.target_if).or_else(|| crate::network::rdma::check(&topo.client, &link.client_if));
            if let Some(why) = why {
                cx.mark_target_unavailable(Subject::Blockwire(rdma), link.mtu, why);
                ours.retain(|p| *p != rdma);
            }
        }
        if !ours.is_empty() {
            cx.progress().set_message(format!("MTU {}: starting blockwire serve", link.mtu));
            let serve = blockwire::Serve {
                exe: cx.exe(),
                host: &topo.target,
                link,
                backend: format!("file:{}", cx.backing().display()),
                log: None,
                ready_within: Duration::from_secs(20),
                soft_digest: cx.digest() == crate::network::offload::Digest::Crc32cSoft,
                tls: cx.tls() == crate::network::offload::Tls::On,
            };
            let (proc, status) = blockwire::start(&serve, &ours);
            for (proto, st) in &status {
                if let Err(why) = st {
                    cx.mark_target_unavailable(Subject::Blockwire(*proto), link.mtu, why.clone());
                }
            }
            if let Some(p) = proc {
                if let Some(d) = blockwire::aoe_datapath(&p.log_tail()) {
                    cx.record_target_datapath(Subject::Blockwire(crate::subjects::Protocol::Aoe), &d);
                }
                for (proto, _) in status.iter().filter(|(_, s)| s.is_ok()) {
                    run.live.push(LiveSubject::new(Subject::Blockwire(*proto), link, Some(run.procs.len())));
                }
                run.procs.push(p);
            }
        }
        for peer in peers {
            let subject = Subject::Peer(peer);
            if !measured.contains(&subject) {
                continue;
            }
            cx.progress().set_message(format!("MTU {}: starting {}", link.mtu, peer.name()));
            match peer.start(topo, link, cx.backing(), cx.tls() == crate::network::offload::Tls::On) {
                Ok(p) => {
                    if let Some(settings) = &p.settings {
                        cx.record_settings(subject, settings);
                    }
                    run.live.push(LiveSubject::new(subject, link, Some(run.procs.len())));
                    run.procs.push(p);
                }
                Err(why) => cx.mark_target_unavailable(subject, link.mtu, why),
            }
        }
        // The user's own storage: not on the lab's link, visited once per
        // run (at the first link), never started.
        for s in measured.iter().copied().filter(|s| s.external().is_some() && first) {
            cx.progress().set_message(format!("{}: asking what it is", s.key()));
            match visit_external(cx, topo, s) {
                Ok(()) => run.live.push(LiveSubject::new(s, link, None)),
                Err(why) => cx.mark_target_unavailable(s, link.mtu, why),
            }
        }
        if topo.remote {
            run.check_aoe_reach(cx);
        }
        // Kernel initiators negotiate no digests here: they are measured in
        // the digest-free combinations only; with TLS, nvme-tcp connects
        // with --tls to the subjects that serve it (the only ones left).
        if cx.digest() == crate::network::offload::Digest::None {
            run.attach_kernel_clients(cx);
        }
        run
    }

    /// Between hosts, the AoE targets that started are asked for by an AoE
    /// config query broadcast from the client host's interface; those that
    /// do not answer are unavailable (a layer-2 reason, not a failure of the
    /// target), for every client.
    fn check_aoe_reach(&mut self, cx: &mut RunContext) {
        let (topo, link) = (self.topo, self.link);
        // (An external AoE target is on the user's interface, not the link's.)
        let wanted: Vec<(Subject, (u16, u8))> = self
            .live
            .iter()
            .filter(|s| s.subject.external().is_none())
            .filter_map(|s| s.subject.address().aoe().map(|a| (s.subject, a)))
            .collect();
        if wanted.is_empty() {
            return;
        }
        let addrs: Vec<(u16, u8)> = wanted.iter().map(|w| w.1).collect();
        // A second, longer query before giving up: a frame lost on a busy
        // (or emulated) host is not a missing layer-2 path.
        let mut result = (vec![], String::new());
        for wait_s in [2, 5] {
            result = match crate::hosts::remote::aoe_answers(&topo.client, cx.exe(), &link.client_if, &addrs, wait_s) {
                Ok(v) => v,
                Err(e) => (vec![], format!("{e:#}")),
            };
            if result.0.len() == addrs.len() {
                break;
            }
        }
        let (answered, err) = result;
        for (subject, (shelf, slot)) in wanted.into_iter().filter(|w| !answered.contains(&w.1)) {
            let why = format!(
                "AoE cannot reach the target at layer 2: an AoE config query broadcast from {} on {} got no answer from e{shelf}.{slot} ({}){}",
                link.client_if,
                topo.client.name(),
                subject.target_name(),
                if err.is_empty() { String::new() } else { format!(": {err}") }
            );
            cx.say(&format!("lab: preflight: {why}"));
            cx.mark_target_unavailable(subject, link.mtu, why);
            self.live.retain(|s| s.subject != subject);
        }
    }

    /// Beside each started target measured by blockwire's client, the
    /// client host's kernel clients of it (its protocol's block initiator,
    /// the NFS client on a peer serving files), attached now: the block
    /// device (or the image file on the NFS mount) stays for the link's
    /// micro and sweep runs (the NFS client is only mounted when some run
    /// it: the fs suite mounts it in its own turns). blockwire's own client
    /// leaves the runs unless the run's clients have it.
    fn attach_kernel_clients(&mut self, cx: &mut RunContext) {
        use crate::subjects::clients::ClientKind;
        let (topo, link) = (self.topo, self.link);
        let clients = cx.clients();
        let per_subject = cx.runs_per_subject(link.mtu);
        let benched = !(cx.plan().micro.is_empty() && cx.plan().sweep.is_empty());
        let tls = cx.tls() == crate::network::offload::Tls::On;
        let mut added = vec![];
        let has_runs = per_subject > 0;
        for s in self.live.iter().filter(|_| has_runs) {
            let subject = s.subject;
            let over_tls = |c: &ClientKind| !tls || *c == ClientKind::Kernel(crate::subjects::Protocol::Nvme);
            for &c in clients.iter().filter(|c| c.is_kernel() && c.serves(subject) && over_tls(c)) {
                let key = c.key(subject);
                cx.progress().inc_length(per_subject);
                let live = |kernel: Option<crate::subjects::clients::Attached>| LiveSubject {
                    key: key.clone(),
                    url: kernel.as_ref().map(|a| a.device.clone()).unwrap_or_default(),
                    kernel,
                    proc: s.proc,
                    subject,
                    client: c,
                    done: 0,
                    consecutive_failures: 0,
                    gave_up: false,
                };
                if matches!(c, ClientKind::KernelNfs(_)) && !benched {
                    added.push(live(None));
                    continue;
                }
                cx.progress().set_message(format!("MTU {}: attaching {key}", link.mtu));
                match crate::subjects::clients::attach(&topo.client, c, subject, link, tls) {
                    Ok(a) => {
                        cx.say(&format!("lab: {key}: {} on {}", a.device, topo.client.name()));
                        if tls {
                            if let Some(r) = cx.subject_record_mut(&key) {
                                bw_lab_results::joined::add_once(&mut r.target_datapath, "client ktls records (nvme connect --tls, tlshd handshake)");
                            }
                        }
                        added.push(live(Some(a)));
                    }
                    Err(e) => {
                        if let Some(r) = cx.subject_record_mut(&key) {
                            r.unavailable.get_or_insert(format!("{e:#}"));
                        }
                        cx.push_failure(Failure { subject: key.clone().into(), mtu: Some(link.mtu), workload: String::new(), reason: format!("{e:#}") });
                        cx.say(&format!("lab: {key} at MTU {}: unavailable: {e:#}", link.mtu));
                        cx.progress().inc(per_subject);
                    }
                }
            }
        }
        if !clients.contains(&ClientKind::Blockwire) {
            self.live.retain(|s| s.client.is_kernel());
        }
        self.live.extend(added);
    }

    /// The kernel's sessions go before their targets do.
    pub fn stop(mut self, cx: &RunContext) {
        for s in &mut self.live {
            if let Some(k) = s.kernel.take() {
                let device = k.device.clone();
                if let Err(e) = k.release() {
                    cx.say(&format!("lab: {}: detaching {device}: {e:#}", s.key));
                }
            }
        }
        for p in self.procs {
            p.stop();
        }
    }
}
