//! The `blockwire` binary: serve disks, attach to them, measure them.

use anyhow::{bail, Context};
use bw_initiator::{Connected, TargetUrl};
use bw_workload::{BenchParams, Rw, VerifyParams};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use client_args::ClientArgs;
use std::time::Duration;

mod router;
mod attach;
mod client_args;
mod flowop;
mod generate;
mod ctl_text;
mod csi;
mod help;

#[derive(Parser)]
// `about` and the lists in serve's and lab's help are filled in from the
// registries that define them (help.rs).
#[command(name = "blockwire", version)]
struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    // Its help names the transports from their table: help.rs.
    Serve(ServeArgs),
    /// Write a deterministic pattern to a remote disk, read it back, compare.
    Verify(VerifyArgs),
    /// Measure IOPS, bandwidth, latency and client CPU against a remote disk.
    Bench(BenchArgs),
    /// Connect to a remote disk and print what it says it is (SCSI INQUIRY, NVMe Identify
    /// Controller, ATA IDENTIFY, NFS server and export), its size and block size. Reads nothing else.
    Identify(IdentifyArgs),
    /// Run a filebench-style personality on a directory (help.rs names them).
    Flowop(flowop::FlowopArgs),
    /// ATA over Ethernet tools.
    #[command(subcommand)]
    Aoe(AoeCmd),
    /// iSCSI tools.
    #[command(subcommand)]
    Iscsi(IscsiCmd),
    /// NVMe over TCP tools.
    #[command(subcommand)]
    Nvme(NvmeCmd),
    /// NFS tools: image files on an export (what the lab measures on a NAS).
    #[command(subcommand)]
    Nfs(NfsCmd),
    /// Run the same workloads over every protocol and peer; report speed, latency, CPU and wire bytes.
    Lab(bw_lab::LabArgs),
    /// Label-switching router (MPLS) on raw Ethernet ports, until SIGINT/SIGTERM.
    Router(router::RouterArgs),
    /// A remote volume as one file in a FUSE file system (optionally a loop device).
    Attach(attach::AttachArgs),
    /// Attach, create a loop device, optionally make a file system, and mount it.
    Mount(attach::MountArgs),
    /// Undo `mount` or `attach`: unmount, detach the loop device, unmount FUSE, log out.
    Umount(attach::UmountArgs),
    /// Man pages and shell completions (for packaging).
    #[command(subcommand, hide = true)]
    Generate(generate::GenerateCmd),
    /// Call a method on a running server's control socket (JSON-RPC; see docs/control.md).
    Ctl(CtlArgs),
    /// The Kubernetes CSI plugin (controller and node) over blockwire gateways (docs/kubernetes.md).
    Csi(csi::CsiArgs),
}

#[derive(Args)]
struct CtlArgs {
    /// Method name (rpc_get_methods lists them), e.g. status, iscsi_lun_add, save_config.
    method: String,
    /// Parameters as one JSON object, e.g. '{"name": "d1", "size": "2G"}'.
    params: Option<String>,
    /// Print the JSON-RPC response as it came, instead of text.
    #[arg(long)]
    json: bool,
    /// The server's control socket.
    #[arg(long, value_name = "PATH", default_value = bw_control::socket::DEFAULT_PATH)]
    control: std::path::PathBuf,
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// A volume: NAME=BACKEND[,opts]; BACKEND is ram:SIZE, file:PATH, a device path or
    /// rbd:POOL/IMAGE; opts: size=SIZE (create a file or image), direct, sync, readonly,
    /// and for rbd conf=PATH, id=USER, timeout=SECS. Repeatable.
    #[arg(long = "volume", value_name = "NAME=BACKEND[,opts]")]
    volumes: Vec<String>,
    /// Export over AoE: IFACE,volume=NAME,shelf=N,slot=M[,buffers=N][,config=STR][,allow=MAC]...[,broadcast_writes=yes]. Repeatable.
    #[arg(long = "aoe", value_name = "IFACE,volume=NAME,shelf=N,slot=M")]
    aoe: Vec<String>,
    /// Serve iSCSI on ADDR[:PORT] (default port 3260). With no [[iscsi.target]] configured,
    /// every volume becomes a LUN of one default target. Repeatable.
    #[arg(long = "iscsi", value_name = "ADDR[:PORT]")]
    iscsi: Vec<String>,
    /// Serve NVMe/TCP on ADDR[:PORT] (default port 4420; discovery on 8009). With no
    /// [[nvme.subsystem]] configured, every volume becomes a namespace of one default subsystem. Repeatable.
    #[arg(long = "nvme", value_name = "ADDR[:PORT]")]
    nvme: Vec<String>,
    /// Serve NVMe/RDMA on ADDR[:PORT] (default port 4420), an address of an RDMA device's
    /// network interface (RoCE, iWARP, InfiniBand): the same subsystems as --nvme. Repeatable.
    #[arg(long = "nvme-rdma", value_name = "ADDR[:PORT]")]
    nvme_rdma: Vec<String>,
    /// TOML configuration file; flags add to it.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<String>,
    /// Most sessions each TCP front-end holds (iSCSI sessions, NVMe/TCP controllers).
    #[arg(long, value_name = "N")]
    max_sessions: Option<usize>,
    /// Most discovery sessions each TCP front-end holds (iSCSI SendTargets, NVMe/TCP discovery controllers).
    #[arg(long, value_name = "N")]
    max_discovery_sessions: Option<usize>,
    /// Seconds an iSCSI discovery session may go without a request.
    #[arg(long, value_name = "SECONDS")]
    discovery_idle_timeout: Option<u64>,
    /// Most connections each TCP front-end holds that have not logged in yet (all addresses together).
    #[arg(long, value_name = "N")]
    max_pending_logins: Option<usize>,
    /// Most TCP connections one initiator address may keep open per front-end.
    #[arg(long, value_name = "N")]
    max_connections_per_address: Option<usize>,
    /// Seconds a new connection has to complete its iSCSI login or NVMe/TCP Connect.
    #[arg(long, value_name = "SECONDS")]
    login_timeout: Option<u64>,
    /// [tuning] AoE receive threads per interface (0: by export kind).
    #[arg(long, value_name = "N", help_heading = "Tuning")]
    aoe_workers: Option<usize>,
    /// [tuning] I/O pool threads for device-backed AoE exports (0: off).
    #[arg(long, value_name = "N", help_heading = "Tuning")]
    aoe_io_threads: Option<usize>,
    /// [tuning] How AoE frames are spread over the workers: round-robin or cpu.
    #[arg(long, value_name = "MODE", help_heading = "Tuning")]
    aoe_fanout: Option<bw_serve::tuning::AoeFanout>,
    /// [tuning] Sockets AoE frames move through: auto (AF_XDP where it can be
    /// set up, else AF_PACKET), xdp (AF_XDP or fail), mmap (AF_PACKET with
    /// PACKET_MMAP rings) or packet (AF_PACKET).
    #[arg(long, value_name = "auto|xdp|mmap|packet", help_heading = "Tuning")]
    aoe_datapath: Option<bw_net::Datapath>,
    /// [tuning] One thread per iSCSI connection (false: tasks on the shared runtime).
    #[arg(long, value_name = "BOOL", help_heading = "Tuning")]
    iscsi_connection_threads: Option<bool>,
    /// [tuning] Smallest iSCSI or NVMe/TCP READ sent with sendfile (bytes, or with K/M suffix).
    #[arg(long, alias = "iscsi-zero-copy-min", value_name = "SIZE", value_parser = byte_count_arg, help_heading = "Tuning")]
    zero_copy_min: Option<usize>,
    /// [tuning] Shorter iSCSI and NVMe/TCP READs of memory-backed volumes sent from the
    /// volume's mapping, gathered with their headers (false: copied first).
    #[arg(long, value_name = "BOOL", help_heading = "Tuning")]
    mapped_reads: Option<bool>,
    /// [tuning] Largest iSCSI or NVMe/TCP READ/WRITE copy run on the connection's thread (bytes, or with K/M suffix).
    #[arg(long, alias = "iscsi-inline-max", value_name = "SIZE", value_parser = byte_count_arg, help_heading = "Tuning")]
    inline_max: Option<usize>,
    /// [tuning] iSCSI or NVMe/TCP commands taken from the receive buffer before answering (0: all buffered first).
    #[arg(long, alias = "iscsi-flush-every", value_name = "N", help_heading = "Tuning")]
    commands_per_send: Option<usize>,
    /// [tuning] TCP congestion control of iSCSI and NVMe/TCP connections:
    /// auto (the system's, but not timer-paced BBR to a host on this
    /// machine), system, or an algorithm such as cubic.
    #[arg(long, value_name = "auto|system|NAME", help_heading = "Tuning")]
    tcp_congestion: Option<bw_net::tcp::Congestion>,
    /// Write the effective configuration as JSON to FILE (mode 600) at start-up;
    /// secrets are redacted unless --show-secrets.
    #[arg(long, value_name = "FILE")]
    save_config: Option<String>,
    /// Print the effective configuration as JSON and exit without serving;
    /// secrets are redacted unless --show-secrets.
    #[arg(long)]
    print_config: bool,
    /// Include CHAP secrets (and any other keys) in --print-config and --save-config.
    #[arg(long)]
    show_secrets: bool,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (docs/metrics.md).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<std::net::SocketAddr>,
    /// Control socket for `blockwire ctl` (root only), or "none". Default:
    /// /run/blockwire/control.sock unless another server answers there.
    #[arg(long, value_name = "PATH|none")]
    control: Option<String>,
    /// Answer the control methods (and the SPDK-compatible ones) over HTTP
    /// on ADDR:PORT, as SPDK's rpc_http_proxy does; needs --rpc-http-credentials.
    #[arg(long, value_name = "ADDR:PORT", requires = "rpc_http_credentials")]
    rpc_http: Option<std::net::SocketAddr>,
    /// File of mode 600 holding one line USER:PASSWORD: HTTP basic
    /// authentication for --rpc-http.
    #[arg(long, value_name = "FILE", requires = "rpc_http")]
    rpc_http_credentials: Option<std::path::PathBuf>,
}

#[derive(Args)]
struct IdentifyArgs {
    /// aoe://IFACE/SHELF.SLOT, iscsi://[USER[%SECRET]@]HOST[:PORT]/IQN/LUN, nvme+tcp://HOST[:PORT]/SUBNQN/NSID,
    /// nvme+rdma://HOST[:PORT]/SUBNQN/NSID or nfs://HOST[:PORT]/EXPORT/FILE
    url: String,
    /// Print one JSON object (url, identity, size_bytes, block_size).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Args)]
struct VerifyArgs {
    /// aoe://IFACE/SHELF.SLOT, iscsi://[USER[%SECRET]@]HOST[:PORT]/IQN/LUN, nvme+tcp://HOST[:PORT]/SUBNQN/NSID or nvme+rdma://HOST[:PORT]/SUBNQN/NSID
    url: String,
    /// Bytes to write and check (K/M/G suffixes).
    #[arg(long, value_parser = size_arg)]
    size: u64,
    /// Where to start, in bytes.
    #[arg(long, default_value = "0", value_parser = size_arg)]
    offset: u64,
    /// Pattern seed: the same seed writes the same data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bytes per request.
    #[arg(long, default_value = "1M", value_parser = size_arg)]
    chunk: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Repeat the whole check (write, flush, read back; the seed one higher
    /// each pass) for as long as FILE exists, reporting each pass as it
    /// ends; the pass under way when FILE goes is the last. For soak runs,
    /// and for tests that must keep I/O going across a fault they cause.
    #[arg(long, value_name = "FILE")]
    while_exists: Option<std::path::PathBuf>,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Args)]
struct BenchArgs {
    /// Target URL (see `blockwire verify --help`).
    url: String,
    /// read, write, randread, randwrite, randrw, rw
    #[arg(long, default_value = "randread")]
    rw: Rw,
    /// Block size per request (K/M suffixes).
    #[arg(long, default_value = "4k", value_parser = size_arg)]
    bs: u64,
    /// Requests in flight per job.
    #[arg(long, default_value_t = 1)]
    iodepth: usize,
    /// Jobs; all share one connection like fio jobs sharing one kernel device.
    #[arg(long, default_value_t = 1)]
    numjobs: usize,
    /// Percentage of reads for randrw / rw.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    rwmixread: u8,
    /// Seconds to run.
    #[arg(long, value_name = "SECS")]
    runtime: Option<f64>,
    /// Total requests to run (instead of, or as well as, --runtime).
    #[arg(long)]
    ios: Option<u64>,
    /// Region to use: start offset and size in bytes (size 0 = to the end).
    #[arg(long, default_value = "0", value_parser = size_arg)]
    offset: u64,
    #[arg(long, default_value = "0", value_parser = size_arg)]
    size: u64,
    /// Warm-up requests before the clock starts.
    #[arg(long, default_value_t = 0)]
    ramp_ios: u64,
    /// Start each job's I/O buffer this many bytes past a page boundary
    /// (0: page-aligned, as fio's; 16 is where a large heap buffer starts).
    #[arg(long, default_value_t = 0)]
    buf_offset: usize,
    /// Requests a job submits in a row before it lets the client send them
    /// (as fio's iodepth_batch_submit): larger makes fewer sends, smaller
    /// starts the target sooner; which costs less depends on the machine.
    #[arg(long, default_value_t = bw_workload::DEFAULT_SUBMIT_BATCH as u16, value_parser = clap::value_parser!(u16).range(1..))]
    submit_batch: u16,
    /// Seed for offsets and data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Subcommand)]
enum AoeCmd {
    /// Broadcast a Query Config on IFACE and list the targets that answer.
    Discover {
        iface: String,
        /// Seconds to wait for answers.
        #[arg(long, default_value_t = 1.0)]
        wait: f64,
    },
}

#[derive(Subcommand)]
enum IscsiCmd {
    /// List the targets a portal offers (SendTargets=All).
    Discover {
        /// [USER%SECRET@]HOST[:PORT] (default port 3260); USER%SECRET answer
        /// the portal's CHAP challenge when discovery requires one.
        portal: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand)]
enum NvmeCmd {
    /// Print the discovery log of a discovery controller.
    Discover {
        /// HOST[:PORT] (default port 8009).
        address: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand)]
enum NfsCmd {
    /// Make an image file of SIZE bytes of data on an NFSv3 export; an existing file is an error.
    Create {
        /// nfs://HOST[:PORT]/EXPORT/FILE
        url: String,
        /// Its size (K/M/G suffixes).
        #[arg(long, value_parser = size_arg)]
        size: u64,
        /// Seconds to wait for the server at each step.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
    /// Remove a file from an NFSv3 export.
    Remove {
        /// nfs://HOST[:PORT]/EXPORT/FILE
        url: String,
        /// Seconds to wait for the server at each step.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
}

fn size_arg(s: &str) -> Result<u64, String> {
    bw_block::parse_size(s)
}

/// `*setting = flag` if the flag was given.
fn set_if<T>(setting: &mut T, flag: Option<T>) {
    if let Some(v) = flag {
        *setting = v;
    }
}

/// [`size_arg`] as a `usize`.
fn byte_count_arg(s: &str) -> Result<usize, String> {
    usize::try_from(size_arg(s)?).map_err(|_| format!("{s}: too large"))
}

/// A portal address: `[USER%SECRET@]HOST[:PORT]` or `[V6]:PORT`.
struct Portal {
    host: String,
    port: u16,
    user: Option<String>,
    secret: Option<String>,
}

/// Parse a portal address the way the host part of an `iscsi://` URL is.
fn parse_portal(s: &str, default_port: u16) -> anyhow::Result<Portal> {
    let url = format!("iscsi://{s}/iqn.x:y/0");
    match TargetUrl::parse(&url) {
        Ok(TargetUrl::Iscsi { host, port, user, secret, .. }) => {
            let port = if s.ends_with(&format!(":{port}")) { port } else { default_port };
            Ok(Portal { host, port, user, secret })
        }
        _ => bail!("invalid address {:?}: expected [USER%SECRET@]HOST[:PORT]", bw_initiator::redact_url(&url).trim_start_matches("iscsi://").trim_end_matches("/iqn.x:y/0")),
    }
}

/// `HOST[:PORT]` or `[V6]:PORT`.
fn split_host_port(s: &str, default_port: u16) -> anyhow::Result<(String, u16)> {
    let p = parse_portal(s, default_port)?;
    if p.user.is_some() {
        bail!("invalid address {s:?}: expected HOST[:PORT] (no credentials here)");
    }
    Ok((p.host, p.port))
}

/// The client commands' runtime. One thread asked for: a current-thread
/// runtime on the calling thread, so a wakeup between a bench worker and
/// its connection's tasks is a push onto a local queue. The multi-thread
/// runtime with one worker ran the tasks on that worker and `block_on` on
/// the main thread, and paid its scheduler's atomics, injection queue and
/// unparks per I/O (issue 51, docs/notes/2026-11-27-h51s-client-runtime.md).
/// Nothing here needs a second thread: `spawn_blocking` has its pool on
/// either flavour and nothing calls `block_in_place`.
fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut b = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    Ok(b.enable_all().build()?)
}

/// The command line as users see it: the derive's, with its lists made
/// from the registries.
fn cli_command() -> clap::Command {
    help::command(Cli::command())
}

fn main() {
    let cli = Cli::from_arg_matches(&cli_command().get_matches()).unwrap_or_else(|e| e.exit());
    let default_level = match (cli.verbose, &cli.cmd) {
        (0, Cmd::Serve(_)) | (0, Cmd::Lab(_)) | (0, Cmd::Router(_)) => "info",
        (0, _) => "warn",
        (1, _) => "info",
        (2, _) => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_level))
        .format_timestamp_millis()
        .init();
    if let Err(e) = run(cli) {
        eprintln!("blockwire: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Serve(a) => serve(a),
        Cmd::Ctl(a) => ctl(a),
        Cmd::Attach(a) => attach::attach(a),
        Cmd::Mount(a) => attach::mount(a),
        Cmd::Umount(a) => attach::umount(a),
        Cmd::Csi(a) => csi::run(a),
        Cmd::Verify(a) => verify(a),
        Cmd::Bench(a) => bench(a),
        Cmd::Identify(a) => identify(a),
        Cmd::Aoe(AoeCmd::Discover { iface, wait }) => {
            let rt = runtime(1)?;
            let found = rt.block_on(bw_initiator::aoe::discover(&iface, Duration::from_secs_f64(wait.max(0.01))))?;
            print_discovered(found, &format!("no AoE targets answered on {iface}"))
        }
        Cmd::Iscsi(IscsiCmd::Discover { portal, client }) => {
            let p = parse_portal(&portal, 3260)?;
            let rt = runtime(client.threads)?;
            let (user, secret) = (p.user.as_deref(), p.secret.as_deref());
            let found = rt.block_on(bw_initiator::iscsi::discover(&p.host, p.port, user, secret, &client.options(1)))?;
            print_discovered(found, &format!("the portal {portal} offers no targets"))
        }
        Cmd::Nvme(NvmeCmd::Discover { address, client }) => {
            let (host, port) = split_host_port(&address, 8009)?;
            let rt = runtime(client.threads)?;
            let found = rt.block_on(bw_initiator::nvme::discover(&host, port, &client.options(1)))?;
            print_discovered(found, &format!("the discovery log at {address} is empty"))
        }
        Cmd::Nfs(c) => nfs(c),
        Cmd::Lab(a) => bw_lab::run(a),
        Cmd::Flowop(a) => flowop::run(a),
        Cmd::Router(a) => router::run(a),
        Cmd::Generate(g) => generate::run(g, cli_command()),
    }
}

/// `blockwire verify`: write the pattern, read it back, compare (pass
/// after pass while --while-exists's file is there).
fn verify(a: VerifyArgs) -> anyhow::Result<()> {
    let rt = runtime(a.client.threads)?;
    rt.block_on(async {
        let client = bw_initiator::connect(&a.url, &a.client.options(a.concurrency)).await?;
        let mut p = VerifyParams {
            offset: a.offset,
            size: a.size,
            seed: a.seed,
            chunk: a.chunk as usize,
            concurrency: a.concurrency,
        };
        let mut pass = 1u64;
        let r = loop {
            let r = bw_workload::verify(client.clone(), &p).await;
            let more = a.while_exists.as_deref().is_some_and(|f| f.exists());
            match r {
                Ok(r) if more => {
                    println!("verify pass {pass}: {} bytes at offset {} OK", r.size, r.offset);
                    pass += 1;
                    p.seed = p.seed.wrapping_add(1);
                }
                r => break r,
            }
        };
        let _ = client.close().await;
        let r = r?;
        let passes = if pass > 1 { format!(", {pass} passes") } else { String::new() };
        println!(
            "verify {}: {} bytes at offset {} OK (write {:.2} s, read {:.2} s{passes})",
            client.describe(),
            r.size,
            r.offset,
            r.write_s,
            r.read_s
        );
        Ok(())
    })
}

/// `blockwire bench`: one run, as a table or one JSON object.
fn bench(a: BenchArgs) -> anyhow::Result<()> {
    if a.runtime.is_none() && a.ios.is_none() {
        bail!("give --runtime SECS or --ios N");
    }
    let rt = runtime(a.client.threads)?;
    rt.block_on(async {
        let client = bw_initiator::connect_typed(&a.url, &a.client.options(a.iodepth * a.numjobs)).await?;
        let p = BenchParams {
            rw: a.rw,
            bs: a.bs as usize,
            iodepth: a.iodepth,
            numjobs: a.numjobs,
            rwmixread: a.rwmixread,
            runtime: a.runtime.map(Duration::from_secs_f64),
            ios: a.ios,
            offset: a.offset,
            size: a.size,
            seed: a.seed,
            ramp_ios: a.ramp_ios,
            buf_offset: a.buf_offset,
            submit_batch: a.submit_batch.into(),
        };
        // By the client's type where it has one: the workers then hold
        // each request's future instead of a box per request.
        let r = match &client {
            Connected::Nvme(c) => bw_workload::bench(c.clone(), &p).await,
            Connected::Iscsi(c) => bw_workload::bench(c.clone(), &p).await,
            Connected::Other(c) => bw_workload::bench(c.clone(), &p).await,
        };
        let _ = client.shared().close().await;
        let r = r?;
        if a.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            print!("{}", r.table());
        }
        Ok(())
    })
}

/// `blockwire identify`: what the disk says it is, its size and block size.
fn identify(a: IdentifyArgs) -> anyhow::Result<()> {
    let rt = runtime(a.client.threads)?;
    rt.block_on(async {
        let client = bw_initiator::connect(&a.url, &a.client.options(1)).await?;
        let (identity, size, block) = (client.identity(), client.size_bytes(), client.block_size());
        let _ = client.close().await;
        let url = bw_initiator::redact_url(&a.url);
        if a.json {
            println!("{}", serde_json::json!({ "url": url, "identity": identity, "size_bytes": size, "block_size": block }));
        } else {
            println!("{url}: {}, {size} bytes in {block}-byte blocks", identity.as_deref().unwrap_or("no identity"));
        }
        Ok(())
    })
}

/// `blockwire nfs create|remove`: an image file on an NFSv3 export.
fn nfs(c: NfsCmd) -> anyhow::Result<()> {
    let rt = runtime(1)?;
    match c {
        NfsCmd::Create { url, size, timeout } => {
            rt.block_on(bw_initiator::nfs::create_image(&TargetUrl::parse(&url)?, size, Duration::from_secs(timeout)))?
        }
        NfsCmd::Remove { url, timeout } => rt.block_on(bw_initiator::nfs::remove_image(&TargetUrl::parse(&url)?, Duration::from_secs(timeout)))?,
    }
    Ok(())
}

fn print_discovered(found: Vec<String>, none: &str) -> anyhow::Result<()> {
    if found.is_empty() {
        bail!("{none}");
    }
    for line in found {
        println!("{line}");
    }
    Ok(())
}

/// `blockwire ctl`: one call; the answer as text, or as JSON with --json.
/// An error answer exits with status 1.
fn ctl(a: CtlArgs) -> anyhow::Result<()> {
    let reply = bw_control::socket::call(&a.control, &a.method, a.params.as_deref())?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    }
    if let Some(e) = reply.get("error") {
        let msg = e["message"].as_str().unwrap_or("error");
        bail!("{}: {msg} (JSON-RPC error {})", a.method, e["code"]);
    }
    if !a.json {
        print!("{}", ctl_text::render(&reply["result"]));
    }
    Ok(())
}

/// The configuration `serve` runs: the file (if any), then the flags.
/// SIGHUP runs this again.
fn effective_config(a: &ServeArgs) -> anyhow::Result<bw_serve::ServeConfig> {
    let mut cfg = match &a.config {
        Some(path) => bw_serve::ServeConfig::from_toml_file(path)?,
        None => bw_serve::ServeConfig::default(),
    };
    for v in &a.volumes {
        cfg.add_volume_flag(v)?;
    }
    for x in &a.aoe {
        cfg.add_aoe_flag(x)?;
    }
    for x in &a.iscsi {
        cfg.add_iscsi_flag(x)?;
    }
    for x in &a.nvme {
        cfg.add_nvme_flag(x)?;
    }
    for x in &a.nvme_rdma {
        cfg.add_nvme_rdma_flag(x)?;
    }
    // Flags override the file.
    let l = &mut cfg.limits;
    set_if(&mut l.max_sessions, a.max_sessions);
    set_if(&mut l.max_discovery_sessions, a.max_discovery_sessions);
    set_if(&mut l.discovery_idle_timeout_s, a.discovery_idle_timeout);
    set_if(&mut l.max_pending_logins, a.max_pending_logins);
    set_if(&mut l.max_connections_per_address, a.max_connections_per_address);
    set_if(&mut l.login_timeout_s, a.login_timeout);
    let t = &mut cfg.tuning;
    set_if(&mut t.aoe_workers, a.aoe_workers);
    set_if(&mut t.aoe_io_threads, a.aoe_io_threads);
    set_if(&mut t.aoe_fanout, a.aoe_fanout);
    set_if(&mut t.aoe_datapath, a.aoe_datapath);
    set_if(&mut t.iscsi_connection_threads, a.iscsi_connection_threads);
    set_if(&mut t.zero_copy_min, a.zero_copy_min);
    set_if(&mut t.mapped_reads, a.mapped_reads);
    set_if(&mut t.inline_max, a.inline_max);
    set_if(&mut t.commands_per_send, a.commands_per_send);
    set_if(&mut t.tcp_congestion, a.tcp_congestion.clone());
    if let Some(listen) = a.metrics {
        cfg.metrics = Some(bw_serve::config::MetricsConfig { listen });
    }
    Ok(cfg)
}

fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let cfg = effective_config(&a)?;
    cfg.validate_start(a.control.as_deref() != Some("none"))?;
    let json = cfg.to_json(a.show_secrets);
    if a.print_config {
        println!("{json}");
        return Ok(());
    }
    if let Some(w) = a.config.as_deref().and_then(|p| bw_serve::config::permission_warning(p, &cfg)) {
        log::warn!("{w}");
    }
    if let Some(path) = &a.save_config {
        bw_serve::config::write_private(path, &json).with_context(|| format!("writing {path}"))?;
    }
    if let Some(i) = &cfg.iscsi {
        for t in &i.targets {
            log::info!("iSCSI target {} ({} LUNs) on {:?}", t.iqn, t.luns.len(), i.listen);
        }
    }
    if let Some(n) = &cfg.nvme {
        for s in &n.subsystems {
            log::info!("NVMe subsystem {} ({} namespaces) on {:?}", s.nqn, s.namespaces.len(), n.listen);
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let control = match a.control.as_deref() {
        None => bw_control::run::ControlPath::Default,
        Some("none") => bw_control::run::ControlPath::Off,
        Some(p) => bw_control::run::ControlPath::At(p.into()),
    };
    let persist = persist_path(&a)?;
    let again = a.clone();
    let reload: bw_control::live::Reload = Box::new(move || effective_config(&again));
    let rpc_http = a.rpc_http.zip(a.rpc_http_credentials.clone());
    rt.block_on(bw_control::run::serve(cfg, bw_control::run::Options { control, reload: Some(reload), persist, rpc_http }))
}

/// Where accepted changes are written: the `--config` file (resolved
/// once, so a symbolic link there keeps pointing at the file it names),
/// unless flags add volumes or exports on top of it: writing those into
/// the file would add them twice at the next start.
fn persist_path(a: &ServeArgs) -> anyhow::Result<Option<std::path::PathBuf>> {
    let Some(path) = &a.config else {
        return Ok(None);
    };
    if !(a.volumes.is_empty() && a.aoe.is_empty() && a.iscsi.is_empty() && a.nvme.is_empty() && a.nvme_rdma.is_empty()) {
        let flags = bw_serve::start::transport_flags();
        log::warn!("changes through the control socket are not written to {path}: --volume, {flags} flags add to it (save_config writes the running configuration)");
        return Ok(None);
    }
    Ok(Some(std::fs::canonicalize(path).with_context(|| format!("config {path}"))?))
}

#[cfg(test)]
mod tests {
    use tokio::runtime::RuntimeFlavor;

    /// `--threads 1` (the default, what bench/tcp-floor and the lab run):
    /// the client's tasks run on the calling thread, not on a worker of a
    /// multi-thread runtime beside it; more threads still get that.
    #[test]
    fn one_client_thread_is_the_calling_thread() {
        for threads in [0, 1] {
            assert_eq!(super::runtime(threads).unwrap().handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
        }
        let rt = super::runtime(3).unwrap();
        assert_eq!(rt.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
        assert_eq!(rt.metrics().num_workers(), 3);
    }
}
