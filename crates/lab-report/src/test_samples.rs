//! Records the tests of several sections build their results from (a
//! leaf: each test imports it, it imports none of them).

/// A route sample for the report's and the findings' tests: `mbs` MB/s
/// for 1 s over `path`, 200 frames per MiB, 0.1 s each of client and
/// target CPU, no routers.
pub(crate) fn route_sample(round: u32, path: &str, protocol: &str, workload: &str, mbs: f64) -> bw_lab_results::route::RouteSample {
    bw_lab_results::route::RouteSample {
        round,
        path: path.into(),
        protocol: protocol.into(),
        workload: workload.into(),
        bw_bytes: mbs * 1e6,
        iops: 0.0,
        mean_lat_us: 0.0,
        wall_s: 1.0,
        bytes: mbs * 1e6,
        frames_per_mib: 200.0,
        routers: vec![],
        cpu: bw_lab_results::route::CpuAccount { client_s: 0.1, target_s: 0.1, ..Default::default() },
        load1: 3.0,
    }
}
