#!/usr/bin/env python3
"""Per lab run: the issue's lab goals (ratios of medians).

Usage: goals.py lab-bbr-1 ... (reads PREFIX-results.csv and PREFIX-iperf3.txt)."""
import csv, re, statistics, sys, os
med = statistics.median
for d in sys.argv[1:]:
    rows = list(csv.reader(open(d + "-results.csv")))
    h = rows[0]; last = {k: i for i, k in enumerate(h)}; first = {}
    for i, k in enumerate(h): first.setdefault(k, i)
    g = {}
    for r in rows[1:]:
        if r[first["suite"]] != "micro": continue
        k = (r[first["mtu"]], r[first["workload"]], r[first["subject"]])
        x = g.setdefault(k, {"iops": [], "mib": [], "p50": [], "p99": []})
        x["iops"].append(float(r[last["iops"]])); x["mib"].append(float(r[last["mib_s"]]))
        x["p50"].append(float(r[last["lat_p50_us"]])); x["p99"].append(float(r[last["lat_p99_us"]]))
    ip = {}
    for line in open(d + "-iperf3.txt"):
        m = re.search(r"^iperf3\s+(\d+) 1 stream\(s\)\s+([0-9.]+) Gbit", line)
        if m: ip.setdefault(m.group(1), []).append(float(m.group(2)) * 1e9 / 8 / 2**20)
    M = lambda mtu, w, s, f="iops": med(g[(mtu, w, s)][f])
    out = []
    for mtu in ("1500", "9000"):
        q = [M(mtu, w, "blockwire-iscsi") / M(mtu, w, "blockwire-nvme") for w in ("randread-4k-qd32", "randwrite-4k-qd32")]
        p50 = M(mtu, "randread-4k-qd1", "blockwire-iscsi", "p50") / M(mtu, "randread-4k-qd1", "blockwire-nvme", "p50")
        tgt = min(M(mtu, w, "blockwire-iscsi") / M(mtu, w, "tgt-iscsi") for w in ("randread-4k-qd32", "randwrite-4k-qd32"))
        ni, nn = M(mtu, "seqread-1m", "blockwire-iscsi", "mib"), M(mtu, "seqread-1m", "blockwire-nvme", "mib")
        i3 = med(ip[mtu]) if mtu in ip else float("nan")
        out.append(f"{mtu}: iscsi/nvme qd32 r {q[0]:.2f} w {q[1]:.2f} | qd1 p50 {p50:.2f} | iscsi/tgt >= {tgt:.1f} | 1m nvme {nn:.0f} iscsi {ni:.0f} nvme/iscsi {nn/ni:.2f} | iperf3 {i3:.0f}: iscsi {ni/i3:.2f} nvme {nn/i3:.2f} | 1m p99 nvme {M(mtu,'seqread-1m','blockwire-nvme','p99'):.0f} iscsi {M(mtu,'seqread-1m','blockwire-iscsi','p99'):.0f}")
    print(f"== {d}"); print("\n".join(out))
