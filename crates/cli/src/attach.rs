//! `blockwire attach`, `mount` and `umount`: their arguments and what they
//! print. The lifecycle (daemon, state file, loop device, mkfs, undo) is
//! bw_attach's.

use crate::client_args::ClientArgs;
use anyhow::{bail, Context};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

#[derive(Args)]
pub struct AttachArgs {
    /// Target URL (see `blockwire verify --help`), or null://SIZE: a volume
    /// answered at once without network or storage, for measuring the FUSE
    /// and loop path itself.
    pub url: String,
    /// Empty directory to mount the FUSE file system on.
    pub dir: PathBuf,
    /// Name of the file that is the volume.
    #[arg(long = "file", default_value = "disk")]
    pub file: String,
    /// Refuse writes.
    #[arg(long)]
    pub readonly: bool,
    /// Also create a loop device (direct I/O) on the file and print it.
    #[arg(long = "loop")]
    pub make_loop: bool,
    /// Return once attached, leaving the daemon running.
    #[arg(long)]
    pub background: bool,
    /// How FUSE requests reach the daemon: `dev` (/dev/fuse), `uring` (FUSE
    /// over io_uring, needs /sys/module/fuse/parameters/enable_uring = Y) or
    /// `auto` (uring when the kernel allows it). The default is `dev`: it
    /// is as fast at 4 KiB and faster for large writes (crates/attach/README.md).
    #[arg(long, value_enum, default_value = "dev")]
    pub fuse: FuseTransport,
    /// Recorded for `blockwire umount` (set by `blockwire mount`).
    #[arg(long, hide = true)]
    pub mountpoint: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum FuseTransport {
    Auto,
    Dev,
    Uring,
}

/// Ring entries per CPU queue: the deepest queue one CPU's requests reach
/// without waiting in the kernel (loop submits from one worker at a time).
const URING_PER_QUEUE: usize = 64;

fn transport(t: FuseTransport) -> anyhow::Result<bw_attach::Transport> {
    Ok(match t {
        FuseTransport::Dev => bw_attach::Transport::Dev,
        FuseTransport::Uring => bw_attach::Transport::Uring {
            per_queue: URING_PER_QUEUE,
        },
        FuseTransport::Auto if bw_attach::uring_enabled() => bw_attach::Transport::Uring {
            per_queue: URING_PER_QUEUE,
        },
        FuseTransport::Auto => bw_attach::Transport::Dev,
    })
}

#[derive(Args)]
pub struct MountArgs {
    /// Target URL (see `blockwire verify --help`).
    pub url: String,
    /// Directory to mount the file system on.
    pub mountpoint: PathBuf,
    /// Make a file system first (destroys what is on the volume).
    #[arg(long, value_enum)]
    pub mkfs: Option<Mkfs>,
    /// One more argument for mkfs (repeat for several), e.g.
    /// --mkfs-option=-J --mkfs-option=size=64.
    #[arg(long = "mkfs-option", value_name = "ARG", allow_hyphen_values = true, requires = "mkfs")]
    pub mkfs_options: Vec<String>,
    /// Mount options, passed to mount(8).
    #[arg(short = 'o', value_name = "OPTS")]
    pub options: Option<String>,
    #[arg(long)]
    pub readonly: bool,
    /// How FUSE requests reach the daemon (see `blockwire attach --help`).
    #[arg(long, value_enum, default_value = "dev")]
    pub fuse: FuseTransport,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Mkfs {
    Ext4,
    Xfs,
    Btrfs,
}

#[derive(Args)]
pub struct UmountArgs {
    /// Mount point of `blockwire mount`, or the directory of `blockwire attach`.
    pub target: PathBuf,
    /// Seconds to wait for the loop device to be let go by whoever else still
    /// holds it (a process with it open, or a copy of the mount in a mount
    /// namespace made while it was mounted); then fail and name them.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_LOOP_WAIT.as_secs())]
    pub wait: u64,
}

/// How long `umount` (and a failed `mount` undoing itself) waits for the
/// loop device by default.
const DEFAULT_LOOP_WAIT: Duration = Duration::from_secs(30);

fn require_root() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("must run as root (FUSE mount, loop devices)");
    }
    Ok(())
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))
}

pub fn attach(a: AttachArgs) -> anyhow::Result<()> {
    require_root()?;
    bw_attach::check_file_name(&a.file)?;
    let dir = absolute(&a.dir)?;
    bw_attach::check_dir(&dir)?;
    if a.background {
        let (_, line) = bw_attach::daemon::spawn(daemon_command(&a, &dir)?)?;
        println!("{line}");
        return Ok(());
    }
    let running = bw_attach::daemon::start(bw_attach::DaemonOptions {
        url: a.url.clone(),
        connect: a.client.options(128),
        dir: dir.clone(),
        fs: bw_attach::AttachOptions {
            file_name: a.file.clone(),
            readonly: a.readonly,
            source: format!("blockwire:{}", bw_attach::redact(&a.url)),
            transport: transport(a.fuse)?,
        },
        make_loop: a.make_loop,
        mountpoint: a.mountpoint.clone(),
    })?;
    println!("{}", running.ready_line());
    std::io::Write::flush(&mut std::io::stdout())?;
    running.serve_until_signalled()
}

/// `blockwire attach` without --background, with the arguments of `a` for
/// the FUSE directory `dir`: the daemon `bw_attach::daemon::spawn` starts.
fn daemon_command(a: &AttachArgs, dir: &Path) -> anyhow::Result<Command> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("attach")
        .arg(&a.url)
        .arg(dir)
        .arg("--file")
        .arg(&a.file);
    if a.readonly {
        cmd.arg("--readonly");
    }
    if a.make_loop {
        cmd.arg("--loop");
    }
    cmd.arg("--fuse")
        .arg(format!("{:?}", a.fuse).to_lowercase());
    if let Some(m) = &a.mountpoint {
        cmd.arg("--mountpoint").arg(m);
    }
    let c = &a.client;
    cmd.args([
        "--queues",
        &c.queues.to_string(),
        "--timeout",
        &c.timeout.to_string(),
        "--threads",
        &c.threads.to_string(),
    ]);
    if let Some(n) = &c.initiator_name {
        cmd.args(["--initiator-name", n]);
    }
    if c.header_digest {
        cmd.arg("--header-digest");
    }
    if c.data_digest {
        cmd.arg("--data-digest");
    }
    cmd.args(["--tcp-congestion", &c.tcp_congestion.to_string()]);
    cmd.args(["--aoe-datapath", &c.aoe_datapath.to_string()]);
    cmd.args(["--tls-identity", &c.tls_identity.to_string()]);
    // Secrets go through the environment, not the daemon's visible
    // arguments (a PSK file is read here, so the daemon needs no access).
    let psk = c.tls_psk()?;
    for (var, v) in [
        ("BLOCKWIRE_DHCHAP_SECRET", &c.dhchap_secret),
        ("BLOCKWIRE_DHCHAP_CTRL_SECRET", &c.dhchap_ctrl_secret),
        ("BLOCKWIRE_TLS_PSK", &psk),
    ] {
        match v {
            Some(s) => cmd.env(var, s),
            None => cmd.env_remove(var),
        };
    }
    Ok(cmd)
}

pub fn mount(a: MountArgs) -> anyhow::Result<()> {
    require_root()?;
    let mp = absolute(&a.mountpoint)?;
    let opts = bw_attach::MountOptions {
        mountpoint: mp.clone(),
        mkfs: a.mkfs.map(|f| match f {
            Mkfs::Ext4 => bw_attach::FileSystem::Ext4,
            Mkfs::Xfs => bw_attach::FileSystem::Xfs,
            Mkfs::Btrfs => bw_attach::FileSystem::Btrfs,
        }),
        mkfs_options: a.mkfs_options.clone(),
        options: a.options.clone(),
        readonly: a.readonly,
        loop_wait: DEFAULT_LOOP_WAIT,
    };
    let state = bw_attach::mount(&opts, |fuse_dir| {
        let daemon = AttachArgs {
            url: a.url.clone(),
            dir: fuse_dir.to_path_buf(),
            file: "disk".into(),
            readonly: a.readonly,
            make_loop: true,
            background: true,
            fuse: a.fuse,
            mountpoint: Some(mp.clone()),
            client: a.client.clone(),
        };
        bw_attach::daemon::spawn(daemon_command(&daemon, fuse_dir)?)
    })?;
    println!(
        "mounted {} on {} ({})",
        bw_attach::redact(&a.url),
        mp.display(),
        state.loop_dev.as_deref().unwrap_or_default()
    );
    Ok(())
}

pub fn umount(a: UmountArgs) -> anyhow::Result<()> {
    require_root()?;
    let target = std::fs::canonicalize(&a.target).unwrap_or(a.target.clone());
    if bw_attach::umount(&target, Duration::from_secs(a.wait))? {
        println!("detached {}", target.display());
    } else {
        println!("nothing attached at {}", target.display());
    }
    Ok(())
}
