//! `--metrics`: the exposition passes `promtool check metrics`, counts what
//! a bench did on each protocol and a failed CHAP login, and a real
//! Prometheus server (started here in a temp dir, ended by PID) scrapes it
//! and answers a query with the bench's operations.

use crate::common;
use common::*;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-11.org.blockwire:metrics";
const IQN_CHAP: &str = "iqn.2026-11.org.blockwire:metrics-chap";
const NQN: &str = "nqn.2026-11.org.blockwire:metrics";

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// A Prometheus server scraping 127.0.0.1:`target` every second; stopped
/// by PID on drop.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Prometheus {
    fn start(target: u16) -> Prometheus {
        let dir = TempDir::new("prometheus");
        let port = free_port();
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: blockwire\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package prometheus)");
        Prometheus { child, port, _dir: dir }
    }

    /// The value of an instant query with one result, if it has one yet.
    fn query(&self, q: &str) -> Option<f64> {
        let r = http_get(&format!("127.0.0.1:{}", self.port), &format!("/api/v1/query?query={}", percent_encode(q))).ok()?;
        let at = r.find("\"value\":[")?;
        let rest = &r[at..];
        let v = rest.split('"').nth(3)?;
        v.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by PID.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn promtool_accepts_the_exposition_and_prometheus_queries_a_bench() {
    require_root();
    let (iport, nport, dport, mport) = (free_port(), free_port(), free_port(), free_port());
    let dir = TempDir::new("metrics");
    let toml = format!(
        "[[volume]]\nname = \"d0\"\nbackend = \"ram:32M\"\n\
         [[volume]]\nname = \"q0\"\nbackend = \"ram:4M\"\nqos = {{ rw_ios_per_sec = 20 }}\n\
         [iscsi]\nlisten = [\"127.0.0.1:{iport}\"]\n\
         [[iscsi.target]]\niqn = \"{IQN}\"\nluns = [{{ lun = 0, volume = \"d0\" }}]\n\
         [[iscsi.target]]\niqn = \"{IQN_CHAP}\"\nluns = [{{ lun = 0, volume = \"d0\" }}]\nchap = {{ user = \"bob\", secret = \"0123456789ab\" }}\n\
         [nvme]\nlisten = [\"127.0.0.1:{nport}\"]\ndiscovery_listen = \"127.0.0.1:{dport}\"\n\
         [[nvme.subsystem]]\nnqn = \"{NQN}\"\nnamespaces = [{{ nsid = 1, volume = \"d0\" }}, {{ nsid = 2, volume = \"q0\" }}]\n\
         [metrics]\nlisten = \"127.0.0.1:{mport}\"\n"
    );
    let serve = Serve::with_config(&dir, &toml, &[]);
    let iscsi = format!("iscsi://127.0.0.1:{iport}/{IQN}/0");
    blockwire_ok(None, &["bench", &iscsi, "--rw", "randrw", "--ios", "300", "--iodepth", "4"]);
    let nvme = format!("nvme+tcp://127.0.0.1:{nport}/{NQN}/1");
    blockwire_ok(None, &["bench", &nvme, "--rw", "randwrite", "--bs", "8k", "--ios", "200", "--iodepth", "4"]);
    // 40 I/Os under a limit of 20 per second: all but a burst's wait.
    let limited = format!("nvme+tcp://127.0.0.1:{nport}/{NQN}/2");
    blockwire_ok(None, &["bench", &limited, "--rw", "randread", "--ios", "40", "--iodepth", "4"]);
    let wrong = format!("iscsi://bob%wrong-secret@127.0.0.1:{iport}/{IQN_CHAP}/0");
    let refused = blockwire(None, &["bench", &wrong, "--ios", "1", "--initiator-name", "iqn.2026-11.org.example:intruder"]);
    assert!(!refused.status.success(), "a wrong CHAP secret logged in");

    let text = scrape_metrics(&format!("127.0.0.1:{mport}"));
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus)");
    promtool.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}\n{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let sample = metric_sample;
    let ops = |proto: &str, op: &str| sample(&text, &format!("blockwire_volume_operations_total{{volume=\"d0\",protocol=\"{proto}\",op=\"{op}\"}}"));
    let iscsi_ops = ops("iscsi", "read") + ops("iscsi", "write");
    // The bench's 300, and whatever the initiator reads when it connects.
    assert!(iscsi_ops >= 300.0 && ops("iscsi", "read") > 0.0 && ops("iscsi", "write") > 0.0, "{text}");
    assert!(ops("nvme-tcp", "write") >= 200.0, "{text}");
    let written = sample(&text, "blockwire_volume_bytes_total{volume=\"d0\",protocol=\"nvme-tcp\",op=\"write\"}");
    assert_eq!(written, ops("nvme-tcp", "write") * 8192.0);
    let count = sample(&text, "blockwire_volume_latency_seconds_count{volume=\"d0\",protocol=\"iscsi\",op=\"read\"}");
    let inf = sample(&text, "blockwire_volume_latency_seconds_bucket{volume=\"d0\",protocol=\"iscsi\",op=\"read\",le=\"+Inf\"}");
    assert_eq!((count, inf), (ops("iscsi", "read"), ops("iscsi", "read")));
    assert_eq!(sample(&text, &format!("blockwire_target_logins_total{{protocol=\"iscsi\",target=\"{IQN}\",initiator=")), 1.0);
    assert_eq!(
        sample(&text, &format!("blockwire_target_auth_failures_total{{protocol=\"iscsi\",target=\"{IQN_CHAP}\",initiator=\"iqn.2026-11.org.example:intruder\"}}")),
        1.0
    );
    // QoS: the limit set, what it held back (reads: the bench's; its
    // burst of 100 ms lets about 3 of 40 through at once; a client stalled
    // for longer than a burst may send a few more unheld), and nothing for d0.
    assert_eq!(sample(&text, "blockwire_volume_qos_limit{volume=\"q0\",limit=\"rw_ios_per_sec\"}"), 20.0);
    assert!(!text.contains("blockwire_volume_qos_limit{volume=\"d0\""), "{text}");
    let delayed = sample(&text, "blockwire_volume_qos_delayed_total{volume=\"q0\",op=\"read\"}");
    let waited = sample(&text, "blockwire_volume_qos_delay_seconds_total{volume=\"q0\",op=\"read\"}");
    assert!(delayed >= 20.0 && waited > 0.0, "delayed {delayed}, waited {waited} s");
    assert_eq!(sample(&text, "blockwire_volume_qos_delayed_total{volume=\"d0\",op=\"read\"}"), 0.0);
    assert!(sample(&text, "process_resident_memory_bytes") > 0.0);
    let other = http_get(&format!("127.0.0.1:{mport}"), "/nothing").unwrap();
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");

    let prom = Prometheus::start(mport);
    let q = "sum(blockwire_volume_operations_total{protocol=\"iscsi\"})";
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = None;
    while Instant::now() < deadline {
        last = prom.query(q);
        if last == Some(iscsi_ops) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(last, Some(iscsi_ops), "Prometheus's answer to {q}");
    drop(prom);
    assert!(serve.stop().success());
}
