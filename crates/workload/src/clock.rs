//! The clock a bench reads once per request, for its latency.

/// Nanosecond timestamps for per-request latency: the CPU's time-stamp
/// counter where the kernel keeps time with it itself, else
/// `CLOCK_MONOTONIC`.
///
/// Why not always `clock_gettime`: at 4 KiB QD32 the one reading per
/// request was 48-61 ns of the client's ~1,800 ns per read over NVMe/TCP
/// (`perf record`, MTU 9000, 2026-11-28), where `rdtsc` takes ~11 ns
/// (28 ns against 11 in a tight loop on the same machine); the floor's load
/// generator reads no clock per request. fio reads the TSC for the same
/// reason (its `clocksource=cpu`, the default where the TSC is reliable).
///
/// Why only where the kernel's clocksource is `tsc`: the kernel chooses it
/// only once it has found the counter invariant and in step on every CPU
/// (a worker may move between CPUs between its two readings); where it
/// did not (kvm-clock on some hosts, HPET), the counter is not trusted
/// here either.
pub(crate) enum LatencyClock {
    /// The TSC, scaled to nanoseconds by `quanta`'s calibration against
    /// the monotonic clock (made once per process, at most 200 ms).
    Tsc(quanta::Clock),
    Monotonic,
}

const CLOCKSOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";

impl LatencyClock {
    /// The counter where the kernel trusts it (see the type). Calibrates
    /// on first use in the process: call before any timing starts.
    pub(crate) fn new() -> LatencyClock {
        let kernel_uses_tsc = std::fs::read_to_string(CLOCKSOURCE).is_ok_and(|s| s.trim() == "tsc");
        if kernel_uses_tsc {
            LatencyClock::Tsc(quanta::Clock::new())
        } else {
            LatencyClock::Monotonic
        }
    }

    /// A reading, in the clock's own units: only [`LatencyClock::ns_between`]
    /// of two readings means anything.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match self {
            LatencyClock::Tsc(c) => c.raw(),
            LatencyClock::Monotonic => monotonic_ns(),
        }
    }

    /// Nanoseconds from `start` to `end` (0 if `end` is not later).
    #[inline]
    pub(crate) fn ns_between(&self, start: u64, end: u64) -> u64 {
        match self {
            LatencyClock::Tsc(c) => c.delta_as_nanos(start, end),
            LatencyClock::Monotonic => end.saturating_sub(start),
        }
    }
}

/// The monotonic clock (`Instant`'s) in nanoseconds: a latency is then one
/// subtraction, where `Instant::saturating_duration_since` and
/// `Duration::as_nanos` were ~60 instructions per request, ~3% of the
/// client's user-space work at 4 KiB QD32 (callgrind, 2026-11-28).
#[inline]
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a timespec to write; CLOCK_MONOTONIC
    // cannot fail on Linux (and a zero reading would only make one
    // latency 0, floored at 100 ns by the recorder).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Both clocks agree with `Instant` over a sleep (no bound on how long
    /// anything takes is asserted: only that the clocks agree).
    #[test]
    fn measures_what_instant_measures() {
        for clock in [LatencyClock::new(), LatencyClock::Monotonic] {
            let t = Instant::now();
            let a = clock.now();
            std::thread::sleep(Duration::from_millis(20));
            let b = clock.now();
            let outer = t.elapsed().as_nanos() as u64;
            let ns = clock.ns_between(a, b);
            // At least the sleep, and inside Instant's interval (read
            // around it), give or take a calibration error. quanta stops
            // calibrating early only once its estimate holds within 10 ns
            // over 500 samples (ppm); 5% leaves room for a calibration cut
            // short at its 200 ms deadline on a loaded machine.
            assert!(ns >= 19_000_000, "{ns} ns measured over a 20 ms sleep");
            assert!(ns <= outer + outer / 20, "{ns} ns measured inside {outer} ns");
        }
    }

    #[test]
    fn a_later_start_is_zero() {
        let c = LatencyClock::new();
        let a = c.now();
        assert_eq!(c.ns_between(a + 1_000_000, a), 0);
        assert_eq!(LatencyClock::Monotonic.ns_between(5, 3), 0);
    }
}
