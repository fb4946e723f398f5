//! Help text that lists what a registry defines, made from that registry
//! so it cannot go stale: the transports serve speaks
//! (`bw_serve::start::TRANSPORTS`), the lab's peers and protocols
//! (`bw_lab::subjects`) and fs workloads (`bw_lab_results::fs::ALL`), and
//! flowop's personalities (`bw_workload::flowop::NAMES`). The derive in main.rs holds the rest; this fills
//! in the lists when the command line is built. The README, which must
//! stay hand-written, is compared with the same registries by
//! tests/integration/cli_basics.rs.

use bw_lab::plan::QUICK_FS;
use bw_lab::subjects::{PeerKind, Protocol};
use bw_workload::flowop;
use bw_serve::start::{prose_list, transport_names};

/// The whole command line, its lists filled in from the registries.
pub fn command(cli: clap::Command) -> clap::Command {
    let transports = transport_names();
    cli.about(format!("Serve, attach to and measure {transports} disks"))
        .mut_subcommand("serve", |c| {
            c.about(format!("Export volumes over {transports} until SIGINT/SIGTERM"))
                .long_about(format!(
                    "Export volumes over {transports} until SIGINT/SIGTERM. While serving, the control socket \
                     (`blockwire ctl`) and the SPDK-compatible JSON-RPC methods (also over HTTP with --rpc-http) \
                     add and remove volumes, exports, volume pools, snapshots and clones (docs/control.md)."
                ))
        })
        .mut_subcommand("lab", |c| {
            c.mut_arg("peers", |a| a.help(lab_peers_help()))
                .mut_arg("protocols", |a| a.help(lab_protocols_help()))
                .mut_arg("fs_workloads", |a| a.help(lab_fs_workloads_help()))
        })
        // Only the about: clap's `mut_arg` re-adds the argument it
        // changes, and the positional PERSONALITY then came after DIR.
        .mut_subcommand("flowop", |c| {
            c.about(format!("Run a filebench-style personality ({}) on a directory", prose_list(flowop::NAMES, "or")))
        })
}

/// `blockwire lab --fs-workloads`: every fs workload, and `--quick`'s.
pub fn lab_fs_workloads_help() -> String {
    let all: Vec<&str> = bw_lab::suites::fs::workloads::ALL.iter().map(|w| w.name()).collect();
    format!("fs suite: workloads ({}; default: all; --quick: {})", all.join(", "), QUICK_FS.join(","))
}

/// `blockwire lab --peers`: every peer of the subject registry with the
/// protocol it serves, and the default set.
pub fn lab_peers_help() -> String {
    let peers: Vec<String> = PeerKind::all().iter().map(|p| format!("{} ({})", p.name(), p.target().address().protocol_name())).collect();
    let default: Vec<&str> = PeerKind::all().iter().filter(|p| p.target().in_default_plan()).map(|p| p.name()).collect();
    format!(
        "Peer targets on the same backing file: {}, or none (default: {}). A peer serving files is measured through nfs://",
        prose_list(peers.iter().map(String::as_str), "or"),
        default.join(",")
    )
}

/// `blockwire lab --protocols`: the default set.
pub fn lab_protocols_help() -> String {
    let default: Vec<&str> = Protocol::ALL.iter().map(|p| p.name()).collect();
    format!("blockwire protocols to measure (default: {})", default.join(","))
}
