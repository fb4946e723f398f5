//! The shortest queue-depth-1 round trip a TCP target can give on this
//! machine: a responder that does nothing but answer each 48-byte request
//! (an iSCSI/NVMe command header) with a 4144-byte reply (a 48-byte header
//! and 4 KiB of data from memory), over loopback, with blocking sockets and
//! no storage access. Any real target adds its own work on top of this; the
//! client here adds almost nothing, so real clients (qemu-img) add theirs too.
//!
//! `tcp_rtt_floor [REQUESTS] [--same-cpu]` prints one JSON line: mean and
//! median round trip, and the responder's CPU time per request.
//! `--same-cpu` pins both ends to CPU 0. On a VM, the difference to the
//! default shows what the two cross-CPU wakeups per round trip cost.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

const REQUEST: usize = 48;
const REPLY: usize = 48 + 4096;

fn thread_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a plain struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn pin_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t with one bit set, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn respond(mut s: TcpStream, same_cpu: bool) -> std::io::Result<(u64, f64)> {
    if same_cpu {
        pin_to_cpu0();
    }
    s.set_nodelay(true)?;
    let c0 = thread_cpu_seconds();
    let mut req = [0u8; REQUEST];
    let reply = vec![0x5Au8; REPLY];
    let mut n = 0u64;
    loop {
        match s.read_exact(&mut req) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        s.write_all(&reply)?;
        n += 1;
    }
    Ok((n, thread_cpu_seconds() - c0))
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let same_cpu = args.iter().any(|a| a == "--same-cpu");
    let requests: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(50_000);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<(u64, f64)> {
        let (s, _) = listener.accept()?;
        respond(s, same_cpu)
    });
    if same_cpu {
        pin_to_cpu0();
    }
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let req = [0u8; REQUEST];
    let mut reply = vec![0u8; REPLY];
    let mut rtts = Vec::with_capacity(requests);
    let start = Instant::now();
    for _ in 0..requests {
        let t = Instant::now();
        c.write_all(&req)?;
        c.read_exact(&mut reply)?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let total = start.elapsed().as_secs_f64();
    drop(c);
    let (served, server_cpu) = server.join().map_err(|_| std::io::Error::other("responder panicked"))??;
    rtts.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{{\"requests\": {requests}, \"same_cpu\": {same_cpu}, \"rtt_mean_us\": {:.1}, \"rtt_p50_us\": {:.1}, \"responder_cpu_us_per_request\": {:.1}}}",
        total / requests as f64 * 1e6,
        rtts[rtts.len() / 2],
        server_cpu / served.max(1) as f64 * 1e6
    );
    Ok(())
}
