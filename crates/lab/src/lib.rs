//! The lab: every protocol and every peer, side by side, in one command.
//!
//! `blockwire lab` builds two network namespaces joined by a veth pair per
//! MTU, serves one tmpfs-backed volume with `blockwire serve` (AoE, iSCSI and
//! NVMe/TCP at once), tgtd (iSCSI) and vblade (AoE), measures the network
//! (iperf3), drives `blockwire bench` against each subject from the other
//! namespace, mounts ext4 on each with `blockwire mount` for file-system
//! workloads in a memory-limited cgroup, runs the same locally as the
//! baseline, and writes results.json, results.csv and report.html.
//!
//! Rooms, one job each (docs/notes/2026-11-26-lab-rooms.md has the table):
//! `plan` (what to run, from the command line), `orchestrate` (the storage
//! run's one loop over link shapes, links and stages), `stage` (what the
//! storage suites share: the run context, a stage's hooks, one link's
//! targets and live subjects, the cases in run order), `suites` (each suite
//! in a room of its own: `net`, `bench` (micro and sweep), `fs`, `route`;
//! `runner` runs one measured workload; `suites` itself says what every
//! suite is to the lab), `subjects` (what is measured: blockwire and each
//! peer, their target `process`es, the `clients` a subject is measured
//! with, the `kernel_nfs` client), `network` (namespaces and veths,
//! offloads, RDMA's check), `hosts` (where things run: a namespace, this
//! machine, or another over `ssh`; `remote` opens a run across machines,
//! see docs/multi-host.md; `/proc` facts, whole-machine CPU, the client's
//! memory cgroup, the `state_file` of what a run makes on a host and this
//! machine's `local_state`), `cleanup` (tracking and signal handling; a
//! leaf: what only an owner knows how to undo, such as a file on an ssh
//! host, the owner registers as a `cleanup::Undo`), `command` (running
//! programs on this machine), `resume` (the record of what a run measured,
//! its stored plan, and `--resume`: see docs/lab-endings.md). The records
//! it writes (results.json, with `stats` and `accounting`) are the crate
//! `bw-lab-results`; the report it renders from them (analysis, CSV, the
//! HTML sections, charts) is `bw-lab-report`.
//! HTML sections, charts) is `bw-lab-report`.

pub mod cleanup;
pub mod command;
pub mod hosts;
pub mod network;
pub mod orchestrate;
pub mod plan;
pub mod resume;
pub mod stage;
pub mod subjects;
pub mod suites;


use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, after_long_help = ENDINGS_HELP)]
pub struct LabArgs {
    #[command(subcommand)]
    pub command: Option<LabCommand>,
    /// Small sizes, one MTU, short runs and a small sweep grid (under 5 minutes).
    #[arg(long)]
    pub quick: bool,
    /// blockwire protocols to measure (default: aoe,iscsi,nvme).
    #[arg(long, value_name = "LIST", value_enum, value_delimiter = ',')]
    pub protocols: Option<Vec<subjects::Protocol>>,
    /// Peer targets on the same backing file, or none. The help users see
    /// is made from `subjects::PeerKind` by the cli (crates/cli/src/help.rs,
    /// `lab_peers_help`), so it names every peer.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = subjects::parse_peer_choice)]
    pub peers: Option<Vec<subjects::PeerChoice>>,
    /// Your own storage as a subject beside the others, NAME=URL (repeatable):
    /// iscsi://HOST[:PORT]/IQN/LUN, nvme+tcp://HOST[:PORT]/NQN/NSID, nvme+rdma://...,
    /// aoe://IFACE/SHELF.SLOT, or nfs://HOST[:PORT]/EXPORT. The lab never starts or stops it
    /// and reads what it says it is (INQUIRY, Identify, the export). Block subjects get read
    /// workloads only unless --allow-writes names them; on an NFS export the lab writes only
    /// its own image file, removed at the end.
    #[arg(long = "subject", value_name = "NAME=URL")]
    pub subject: Vec<String>,
    /// Run the write workloads on these external block subjects too (names from --subject,
    /// comma-separated). THE LUN'S OR NAMESPACE'S CONTENTS WILL BE DESTROYED.
    #[arg(long = "allow-writes", value_name = "NAME", value_delimiter = ',')]
    pub allow_writes: Vec<String>,
    /// MTUs, one veth pair each (default: 1500,9000; --quick: 1500).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub mtu: Option<Vec<u32>>,
    /// Suites, comma-separated: net (iperf3 ceiling), micro, sweep, fs (file systems over `blockwire mount`), or all (default: all); route (the routed-path suite) runs alone.
    #[arg(long, value_name = "LIST", value_enum, value_delimiter = ',')]
    pub suite: Option<Vec<plan::SuiteChoice>>,
    /// Link shapes: none (plain veth) or tc tbf rates such as 1gbit,10gbit on both directions (default: none).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub link: Option<Vec<String>>,
    /// Repetitions of every micro and fs case (default 5 for micro, 3 for fs; net uses at most 3, --quick 1; sweep points run once).
    #[arg(long)]
    pub repeat: Option<u32>,
    /// Output directory (default: ./lab-YYYYMMDD-HHMMSS).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Volume size, e.g. 1G (default 1G; --quick: 128M).
    #[arg(long)]
    pub size: Option<String>,
    /// Seconds per micro run (default 2; --quick: 1).
    #[arg(long, value_name = "SECS")]
    pub runtime: Option<u32>,
    /// Seconds per sweep point (default 1).
    #[arg(long, value_name = "SECS")]
    pub sweep_runtime: Option<u32>,
    /// The most to wait, over the whole run, for the machine to go idle
    /// before each measurement (at most 1 s per run with --quick, 3 s
    /// otherwise; default 20 s in all with --quick, 180 s otherwise). 0
    /// measures at once, on a machine that is never idle: each sample still
    /// records how busy the machine was before it.
    #[arg(long, value_name = "SECS")]
    pub idle_wait: Option<f64>,
    /// Skip the local fio baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// fs suite: memory limits of the workload's cgroup, which bound the client's page cache (default: 256M,2G; --quick: 256M).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub client_mem: Option<Vec<String>>,
    /// fs suite: workloads (default: all; --quick: varmail). The help users
    /// see is made from `bw_lab_results::fs::ALL` by the cli
    /// (crates/cli/src/help.rs, `lab_fs_workloads_help`), so it names every one.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub fs_workloads: Option<Vec<String>>,
    /// fs suite: seconds per flowop and fio run (default 4; --quick: 2).
    #[arg(long, value_name = "SECS")]
    pub fs_runtime: Option<u32>,
    /// TCP congestion control inside the lab's namespaces: auto (the
    /// default: cubic where the system's paces by timer, as BBR does on the
    /// lab's veth links, which have no qdisc to pace for it; otherwise the
    /// system's), system (what new namespaces inherit), or an algorithm,
    /// e.g. cubic or bbr. Every TCP target and client of a run uses it alike;
    /// between real hosts each keeps its own.
    #[arg(long, value_name = "NAME")]
    pub tcp_congestion: Option<String>,
    /// Run the targets on this host, ssh://[USER@]HOST[:PORT], instead of a
    /// namespace here (the user's ssh config and keys apply; never a password).
    #[arg(long, value_name = "URL")]
    pub target_host: Option<String>,
    /// Run the clients on this host (default: this machine).
    #[arg(long, value_name = "URL", requires = "target_host")]
    pub client_host: Option<String>,
    /// The target host's address on the storage network, when it is not its ssh address.
    #[arg(long, value_name = "ADDR", requires = "target_host")]
    pub data_addr: Option<std::net::Ipv4Addr>,
    /// An ssh option for every host, KEY=VALUE (repeatable), passed as `-o KEY=VALUE`.
    #[arg(long = "ssh-option", value_name = "KEY=VALUE", value_parser = hosts::ssh::parse_option)]
    pub ssh_option: Vec<(String, String)>,
    /// Initiators to measure every target with: blockwire (its userspace
    /// clients), kernel (the client host's open-iscsi, nvme-tcp and aoe,
    /// driven by fio; between hosts only). Default: blockwire, and with
    /// --client-host every kernel initiator that host has.
    #[arg(long, value_name = "LIST", value_enum, value_delimiter = ',')]
    pub clients: Option<Vec<subjects::clients::ClientChoice>>,
    /// Let the lab change real NICs: the MTU to --mtu, offloads (--offload),
    /// qdiscs (--link shapes, on NICs with the kernel's default root
    /// qdisc); each written to the host's state file first and restored at
    /// the end (or by the next run after a killed one).
    #[arg(long, requires = "target_host")]
    pub allow_nic_changes: bool,
    /// Micro suite: the workloads to run (default: all; --quick: seqread-1m, randread-4k-qd1, randread-4k-qd32, randwrite-4k-qd32).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub micro_workloads: Option<Vec<String>>,
    /// fs suite and local baseline: file systems, each measured in turn: ext4, ext4-tuned (noatime, inode tables and journal zeroed at mkfs, a larger journal), xfs, btrfs (copy-on-write), btrfs-nodatacow (default: ext4). Over NFS (ganesha) it is the server's file system, under the export.
    #[arg(long = "fs", value_name = "LIST", value_delimiter = ',')]
    pub fs_kinds: Option<Vec<String>>,
    /// fs suite: honour (default) or ignore the workloads' fsyncs (eatmydata: the analogue of ZFS sync=disabled), each measured in turn.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub fsync: Option<Vec<String>>,
    /// The offload study: NIC offloads on the lab's links, each measured in
    /// turn: none (checksums, scatter-gather, TSO, GSO, GRO off on both ends),
    /// stateless (all on). Default: TSO/GSO off (frames of MTU size), GRO and checksums on.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub offload: Option<Vec<String>>,
    /// The offload study: iSCSI/NVMe-TCP digests, each measured in turn:
    /// none, crc32c (the CPU's CRC instruction), crc32c-soft (portable
    /// tables on both ends). With digests only blockwire's iSCSI and
    /// NVMe/TCP run. Default: none.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub digest: Option<Vec<String>>,
    /// The offload study: NVMe/TCP over TLS 1.3, each measured in turn: off,
    /// on (blockwire's target, and nvmet's TCP port with --peers nvmet,
    /// require TLS with a PSK the lab makes; nvmet needs tlshd running and
    /// a kernel with TLS on the target host, and the kernel initiator the
    /// same on the client host; blockwire's record layer is the kernel's
    /// where the hosts have kTLS, else user space, and the report says
    /// which for each end). With TLS only those NVMe/TCP subjects run.
    /// Default: off.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub tls: Option<Vec<String>>,
    /// Suite route only: paths to compare: direct, mpls (one path per --datapath), mpls-bpf, mpls-userspace, vxlan (default: direct,mpls,vxlan).
    #[arg(long, value_name = "LIST", value_enum, value_delimiter = ',')]
    pub path: Option<Vec<suites::route::PathChoice>>,
    /// Suite route only: MPLS router datapaths to measure: bpf, userspace (default: bpf,userspace).
    #[arg(long, value_name = "LIST", value_enum, value_delimiter = ',')]
    pub datapath: Option<Vec<suites::route::Datapath>>,
    /// Go on with the run in DIR where it stopped (killed, interrupted, a
    /// host lost, the machine rebooted): the cases it finished are kept, the
    /// one it was in is measured again whole, the rest is measured, and DIR
    /// gets the results.json, CSV and report of the whole run (which say
    /// which start measured what). With no other options it runs DIR's
    /// stored plan; options that make another plan are refused.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    pub resume: Option<PathBuf>,
}

/// `blockwire lab --help`: how long runs end, and what each ending leaves.
pub const ENDINGS_HELP: &str = "\
Long runs (docs/lab-endings.md):
  A full run takes hours. Start it so that a closed terminal or a dropped
  ssh connection does not end it:
    systemd-run --unit=bwlab --collect -p KillMode=mixed \\
        blockwire lab --out /var/tmp/lab1
        (journalctl -u bwlab -f to watch; systemctl stop bwlab sends SIGTERM
        to the lab alone, which stops its own processes in order)
    nohup blockwire lab --out /var/tmp/lab1 > lab1.log 2>&1 &
    tmux new -s lab 'blockwire lab --out /var/tmp/lab1'   (detach: C-b d)
  A run that ends early goes on with: blockwire lab --resume /var/tmp/lab1

How a run ends, and what it leaves:
  SIGINT (Ctrl-C), SIGTERM, SIGQUIT, SIGHUP (terminal or ssh session closed),
  or its output gone (its terminal, or the reader of its pipe):
      the run stops, writes results.json and the report with what it measured
      (\"aborted\" says why), and undoes everything it made, here and on its
      hosts. Nothing is left. A second signal while it cleans up kills every
      process, cleans up for at most 20 s, says what is left, and exits.
  SIGKILL, an OOM kill, a crash, a power cut:
      no handler runs. What the run made is listed in its state file
      (/var/tmp/bwlab-local here, /var/tmp/bwlab-remote on ssh hosts), and
      the next blockwire lab (or blockwire lab sweep) undoes it first, and
      says what it undid; a live run's things are never touched.
  A lost ssh host: as SIGINT; what is left there goes with the next run.
  In every case OUT/record.jsonl keeps each sample as it was measured:
  blockwire lab --resume OUT goes on from there.";

#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Re-render OUT/report.html (and results.csv) from OUT/results.json.
    Report {
        /// The output directory of an earlier run.
        out: PathBuf,
    },
    /// Undo what dead runs left on this machine (what every run does first),
    /// by their state files in /var/tmp/bwlab-local; a live run's are left alone.
    Sweep,
}

pub fn run(args: LabArgs) -> anyhow::Result<()> {
    if let Some(LabCommand::Report { out }) = &args.command {
        let results = bw_lab_results::Results::load(&out.join("results.json"))?;
        bw_lab_report::write_all(out, &results)?;
        println!("lab: report re-rendered: {}", out.join("report.html").display());
        return Ok(());
    }
    if let Some(LabCommand::Sweep) = &args.command {
        let swept = hosts::local_state::sweep(std::path::Path::new(hosts::local_state::LOCAL_DIR));
        for s in &swept {
            println!("lab: {}", s.message("this machine"));
        }
        if swept.is_empty() {
            println!("lab: no dead run's state file in {}", hosts::local_state::LOCAL_DIR);
        }
        return Ok(());
    }
    let args = match args.resume.clone() {
        Some(dir) => resumed_args(args, &dir)?,
        None => args,
    };
    let (mut suite, out) = if args.suite.as_deref() == Some(&[plan::SuiteChoice::Route]) {
        anyhow::ensure!(args.target_host.is_none(), "the route suite runs on this machine only (no --target-host)");
        anyhow::ensure!(args.resume.is_none(), "the route suite cannot be resumed (it runs in minutes): run it again");
        let s = suites::route::suite::RouteSuite::from_args(&suites::route::suite::RouteChoices {
            quick: args.quick,
            datapath: args.datapath.clone(),
            path: args.path.clone(),
            protocols: args.protocols.clone(),
            mtu: args.mtu.clone(),
            repeat: args.repeat,
            runtime: args.runtime,
            size: args.size.clone(),
            out: args.out.clone(),
        })?;
        let out = s.out.clone();
        (Box::new(s) as Box<dyn suites::Suite>, out)
    } else {
        let s = match storage_suites(&args) {
            Ok(s) => s,
            Err(e) => {
                // What setting up made (ssh masters, files) goes now.
                hosts::ssh::set_ending();
                for e in cleanup::registry().cleanup_all() {
                    cleanup::say(&format!("lab: cleanup: {e}"));
                }
                hosts::local_state::close();
                return Err(e);
            }
        };
        let out = s.cx.out_dir().to_path_buf();
        (Box::new(s) as Box<dyn suites::Suite>, out)
    };
    suites::run_and_report(suite.as_mut(), &out)
}

/// `--resume DIR` alone (or with pacing options only, which then apply):
/// the options DIR's run was started with; with options, those (the plan
/// they make is checked against DIR's).
fn resumed_args(args: LabArgs, dir: &std::path::Path) -> anyhow::Result<LabArgs> {
    let stored = resume::stored_plan::StoredPlan::load(dir)?;
    if !resume::stored_plan::plan_options(&resume::stored_plan::argv()).is_empty() {
        return Ok(args);
    }
    #[derive(clap::Parser)]
    struct Stored {
        #[command(flatten)]
        lab: LabArgs,
    }
    use clap::Parser;
    let mut a = Stored::try_parse_from(std::iter::once("lab".to_string()).chain(stored.argv.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("{}: the options stored there do not parse: {e}", dir.join(resume::stored_plan::FILE).display()))?
        .lab;
    a.resume = Some(dir.to_path_buf());
    if args.idle_wait.is_some() {
        a.idle_wait = args.idle_wait;
    }
    Ok(a)
}

/// What a run's options make, as a resumed run must make it again: the
/// parameters, the subjects (and the user's own as given), the hosts.
fn plan_description(plan: &plan::Plan, args: &LabArgs) -> serde_json::Value {
    serde_json::json!({
        "params": plan.params,
        "subjects": plan.subjects().into_iter().map(|s| s.key().to_string()).collect::<Vec<_>>(),
        "baseline": plan.baseline,
        "external": {"subjects": args.subject, "allow_writes": args.allow_writes},
        "hosts": {
            "target": args.target_host,
            "client": args.client_host,
            "data_addr": args.data_addr.map(|a| a.to_string()),
            "clients": args.clients.as_ref().map(|c| format!("{c:?}")),
            "allow_nic_changes": args.allow_nic_changes,
        },
    })
}

/// The net, micro, sweep and fs suites as the command line asks.
/// The plan's choices from the command line (and what this machine has).
fn choices(args: &LabArgs) -> anyhow::Result<plan::Choices> {
    let machine = hosts::proc::machine_info();
    Ok(plan::Choices {
        quick: args.quick,
        protocols: args.protocols.clone(),
        peers: args.peers.clone(),
        mtu: args.mtu.clone(),
        suite: args.suite.clone(),
        repeat: args.repeat,
        size: args.size.clone(),
        runtime: args.runtime,
        sweep_runtime: args.sweep_runtime,
        idle_wait: args.idle_wait,
        no_baseline: args.no_baseline,
        link: args.link.clone(),
        client_mem: args.client_mem.clone(),
        fs_workloads: args.fs_workloads.clone(),
        fs_runtime: args.fs_runtime,
        tcp_congestion: args.tcp_congestion.clone(),
        micro_workloads: args.micro_workloads.clone(),
        fs_kinds: args.fs_kinds.clone(),
        fsync: args.fsync.clone(),
        offload: args.offload.clone(),
        digest: args.digest.clone(),
        tls: args.tls.clone(),
        externals: external_subjects(args)?,
        mem_total: machine.mem_total_bytes,
        system_congestion: machine.tcp_congestion,
        available_congestion: bw_net::tcp::available().unwrap_or_default(),
        cgroup: match hosts::cgroup::detect(std::path::Path::new(hosts::cgroup::ROOT)) {
            Ok((hosts::cgroup::Version::V1, _)) => "v1".into(),
            Ok((hosts::cgroup::Version::V2, _)) => "v2".into(),
            Err(_) => "none".into(),
        },
    })
}

/// The plan as stored beside the run's record: this run's, or for
/// `--resume` the stored one, which this run's options must not change
/// (a resumed run is the same plan, or nothing happens).
fn stored_plan(args: &LabArgs, plan: &plan::Plan) -> anyhow::Result<resume::stored_plan::StoredPlan> {
    let described = plan_description(plan, args);
    Ok(match &args.resume {
        Some(dir) => {
            let stored = resume::stored_plan::StoredPlan::load(dir)?;
            let d = stored.differences(&described);
            anyhow::ensure!(
                d.is_empty(),
                "--resume {}: these options make another plan than that run's ({}); what differs:\n  {}\n(--resume {} alone goes on with its own plan)",
                dir.display(),
                dir.join(resume::stored_plan::FILE).display(),
                d.join("\n  "),
                dir.display()
            );
            stored
        }
        None => resume::stored_plan::StoredPlan { argv: resume::stored_plan::argv(), plan: described, cases: vec![] },
    })
}

fn storage_suites(args: &LabArgs) -> anyhow::Result<orchestrate::LabRun> {
    let mut plan = plan::Plan::from_choices(&choices(args)?)?;
    if args.target_host.is_some() {
        let fatal = hosts::remote::adapt_plan(&mut plan, args.allow_nic_changes);
        anyhow::ensure!(fatal.is_empty(), "{}", fatal.join("\n"));
    }
    anyhow::ensure!(
        args.target_host.is_some() || !args.clients.as_ref().is_some_and(|c| c.contains(&subjects::clients::ClientChoice::Kernel)),
        "--clients kernel measures kernel initiators between hosts: give --target-host (in one box the lab's clients run in network namespaces)"
    );
    let stored = stored_plan(args, &plan)?;
    // A run still writing DIR is refused before anything is made.
    let resumed_book = match &args.resume {
        Some(dir) => Some(resume::book::Book::reopen(dir)?),
        None => None,
    };
    preflight(&plan, args.target_host.is_some(), args.client_host.is_some())?;
    // Before any thread exists (see install_signal_handler).
    cleanup::install_signal_handler()?;
    // What dead runs left here goes before anything is made.
    hosts::local_state::start_run();
    let exe = std::env::current_exe()?;
    let remote = match &args.target_host {
        None => None,
        Some(_) => {
            let choices = hosts::remote::HostChoices {
                target_host: args.target_host.clone(),
                client_host: args.client_host.clone(),
                data_addr: args.data_addr,
                ssh_options: args.ssh_option.clone(),
                allow_nic_changes: args.allow_nic_changes,
                mtu: args.mtu.clone(),
                clients: args.clients.clone(),
            };
            Some(hosts::remote::open(&choices, &plan, &exe)?)
        }
    };
    let out = args.resume.clone().or_else(|| args.out.clone()).unwrap_or_else(|| {
        let stamp: String = bw_lab_results::utc_now().chars().filter(|c| c.is_ascii_digit()).collect();
        PathBuf::from(format!("lab-{}-{}", &stamp[..8], &stamp[8..]))
    });
    std::fs::create_dir_all(&out)?;
    // Once its terminal or pipe is gone, what the lab says goes here.
    cleanup::write_output_to_after_it_is_lost(out.join("ending.log"));
    let book = match resumed_book {
        Some(b) => b,
        None => {
            let b = resume::book::Book::fresh(&out)?;
            stored.save(&out)?;
            b
        }
    };
    let mut run = orchestrate::LabRun::new(plan, exe, out);
    run.cx.keep_book(book);
    run.stored = Some(stored);
    if let Some((hosts, clients)) = remote {
        run.cx.run_across(hosts, clients);
    }
    Ok(run)
}

/// `--subject` and `--allow-writes`: the external subjects, made once for
/// the whole process (a subject refers to its row by a `'static` borrow).
fn external_subjects(args: &LabArgs) -> anyhow::Result<Vec<&'static subjects::external::External>> {
    let taken: Vec<&str> = subjects::PeerKind::all().iter().flat_map(|p| [p.name(), p.target().target_name()]).collect();
    let me: String = command::first_line("hostname", &[]).unwrap_or_default().chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    let file = format!("bwlab-{me}-{}.img", std::process::id());
    let mut v: Vec<subjects::external::External> = vec![];
    for s in &args.subject {
        let e = subjects::external::parse(s, &taken, &file).map_err(|e| anyhow::anyhow!("--subject {e}"))?;
        anyhow::ensure!(!v.iter().any(|x| x.name == e.name), "--subject {}: given twice", e.name);
        v.push(e);
    }
    for name in &args.allow_writes {
        let e = v.iter_mut().find(|e| e.name == name.trim()).ok_or_else(|| anyhow::anyhow!("--allow-writes {name}: no --subject of that name"))?;
        e.allow_writes = true;
    }
    Ok(v.into_iter().map(|e| &*Box::leak(Box::new(e))).collect())
}

/// Fail early with a clear message when the lab cannot work at all.
/// `remote`: the targets run on another host; `remote_client`: so do the
/// clients (this machine only drives them over ssh).
fn preflight(plan: &plan::Plan, remote: bool, remote_client: bool) -> anyhow::Result<()> {
    use command::which;
    if remote {
        anyhow::ensure!(which("ssh"), "ssh is not installed (package openssh-client)");
    }
    if remote_client {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!("the lab creates network namespaces and veth pairs, and its clients need root: run it as root");
    }
    anyhow::ensure!(which("ip"), "ip is not installed (package iproute2)");
    if plan.baseline {
        anyhow::ensure!(which("fio"), "fio is not installed (or pass --no-baseline)");
    }
    if plan.net_runs > 0 {
        anyhow::ensure!(which("iperf3"), "iperf3 is not installed (or leave out the net suite)");
    }
    if plan.links.iter().any(|l| l.bits_per_s.is_some()) {
        anyhow::ensure!(which("tc"), "tc is not installed (package iproute2)");
    }
    if let Some(fs) = &plan.fs {
        anyhow::ensure!(
            hosts::cgroup::detect(std::path::Path::new(hosts::cgroup::ROOT)).is_ok(),
            "the fs suite limits the client's memory with a memory cgroup, and {} has no memory controller",
            hosts::cgroup::ROOT
        );
        anyhow::ensure!(std::path::Path::new("/dev/fuse").exists(), "the fs suite mounts through FUSE: /dev/fuse is missing (modprobe fuse)");
        for (tool, package) in [("nsenter", "util-linux"), ("losetup", "util-linux"), ("mkfs.ext4", "e2fsprogs"), ("fio", "fio")] {
            anyhow::ensure!(which(tool), "{tool} is not installed (package {package}); the fs suite needs it");
        }
        for &(kind, fsync) in &plan.fs_combinations {
            let (tool, package) = (kind.mkfs_program(), if kind.mkfs_type() == "btrfs" { "btrfs-progs" } else { "xfsprogs" });
            anyhow::ensure!(which(tool), "{tool} is not installed (package {package}); --fs {} needs it", kind.name());
            if let Some(w) = fsync.wrapper() {
                anyhow::ensure!(which(w), "{w} is not installed (package eatmydata); --fsync ignore needs it");
            }
        }
        for (w, tool, package) in [("postmark", "postmark", "postmark"), ("bonnie", "bonnie++", "bonnie++")] {
            if fs.workloads.iter().any(|x| x == w) {
                anyhow::ensure!(which(tool), "{tool} is not installed (package {package}; or leave {w} out of --fs-workloads)");
            }
        }
    }
    let need = plan.params.size_bytes;
    if remote {
        return Ok(());
    }
    if let Ok(st) = nix::sys::statvfs::statvfs("/dev/shm") {
        let free = st.blocks_available() * st.fragment_size();
        anyhow::ensure!(free > need, "/dev/shm has {} MiB free, the volume needs {} MiB", free >> 20, need >> 20);
    }
    Ok(())
}


#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lab: LabArgs,
    }

    fn parse(args: &[&str]) -> Result<LabArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("lab").chain(args.iter().copied())).map(|c| c.lab)
    }

    #[test]
    fn lists_are_typed_and_comma_separated() {
        let a = parse(&["--protocols", "aoe,nvme", "--peers", "tgt", "--mtu", "1500,9000", "--suite", "net,fs"]).unwrap();
        assert_eq!(a.protocols, Some(vec![subjects::Protocol::Aoe, subjects::Protocol::Nvme]));
        assert_eq!(a.peers, Some(vec![subjects::PeerChoice(Some(subjects::PeerKind::Tgt))]));
        assert_eq!(a.mtu, Some(vec![1500, 9000]));
        assert_eq!(a.suite, Some(vec![plan::SuiteChoice::Net, plan::SuiteChoice::Fs]));
        assert_eq!(parse(&["--peers", "none"]).unwrap().peers, Some(vec![subjects::PeerChoice(None)]));
        let r = parse(&["--suite", "route", "--path", "direct,mpls-bpf", "--datapath", "userspace"]).unwrap();
        assert_eq!(r.path, Some(vec![suites::route::PathChoice::Direct, suites::route::PathChoice::MplsBpf]));
        assert_eq!(r.datapath, Some(vec![suites::route::Datapath::Userspace]));
    }

    #[test]
    fn unknown_names_are_refused() {
        for bad in [
            &["--protocols", "aoe,fc"][..],
            &["--peers", "scst"],
            &["--suite", "macro"],
            &["--suite", "net,disk"],
            &["--mtu", "big"],
            &["--path", "direct,ospf"],
            &["--datapath", "dpdk"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
