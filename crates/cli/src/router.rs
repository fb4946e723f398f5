//! `blockwire router`: command line and signals around `bw_router::run`.

use anyhow::Context;
use clap::Args;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args)]
pub struct RouterArgs {
    /// A name for log lines.
    #[arg(long, default_value = "router")]
    name: String,
    /// A port: NAME=INTERFACE. Repeatable.
    #[arg(long = "port", value_name = "NAME=INTERFACE", required = true)]
    ports: Vec<String>,
    /// Edge: carry every frame from port CUSTOMER to the core as an Ethernet pseudowire,
    /// pushing labels ROUTE (top) and LABEL (bottom, the customer) and sending to next hop MAC;
    /// frames popped with LABEL below a --pop label go back out on CUSTOMER. Repeatable.
    #[arg(
        long = "pseudowire",
        value_name = "customer=PORT,core=PORT,route=N,label=N,via=MAC"
    )]
    pseudowires: Vec<String>,
    /// Switch: swap incoming top label IN for OUT, decrement its TTL, send on PORT to MAC. Repeatable.
    #[arg(long = "swap", value_name = "in=N,out=N,port=PORT,via=MAC")]
    swaps: Vec<String>,
    /// Edge: a label that ends here (popped together with the customer label below it). Repeatable.
    #[arg(long = "pop", value_name = "LABEL")]
    pops: Vec<u32>,
    /// Who forwards: `bpf` (tc and XDP programs in the kernel, Linux 6.6+) or
    /// `userspace` (AF_PACKET sockets and the bw-mpls state machine).
    #[arg(long, value_enum, default_value_t = Datapath::Bpf)]
    datapath: Datapath,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Datapath {
    Bpf,
    Userspace,
}

pub fn run(a: RouterArgs) -> anyhow::Result<()> {
    let spec = bw_router::parse(&a.ports, &a.pseudowires, &a.swaps, &a.pops, |i| {
        bw_net::interface_info(i).map(|x| x.mac)
    })?;
    // Block SIGINT/SIGTERM in every thread; this one waits for them.
    // SAFETY: sigset operations on a local set; pthread_sigmask on this thread.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: waits on a valid set; the signals are blocked in all threads.
        unsafe { libc::sigwait(&set, &mut sig) };
        stop2.store(true, Ordering::Relaxed);
    });
    let ports: Vec<String> = spec.ports.iter().map(|(n, i)| format!("{n}={i}")).collect();
    log::info!("router {}: ports {}", a.name, ports.join(" "));
    let st = match a.datapath {
        Datapath::Userspace => bw_router::run(&spec, stop).map_err(anyhow::Error::from),
        Datapath::Bpf => bw_router::bpf::run(&spec, stop).map_err(anyhow::Error::from),
    }
    .with_context(|| format!("router {}", a.name))?;
    log::info!("router {}: {}", a.name, st.line());
    Ok(())
}
