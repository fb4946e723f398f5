import csv, sys, statistics as st, collections
g=collections.defaultdict(list)
for f in sys.argv[1:]:
    for r in csv.DictReader(open(f)):
        if r['workload']=='seqread-1m': g[(r['mtu'],r['subject'])].append(r)
for k in sorted(g):
    v=g[k]
    print(k, "n",len(v),"MiB/s med %.0f"%st.median(float(r['bw_bytes'])/2**20 for r in v), "all", " ".join("%.0f"%(float(r['bw_bytes'])/2**20) for r in v),
      "| p50 %.0f"%st.median(float(r['lat_p50_ns'])/1e3 for r in v),"p99 %.0f"%st.median(float(r['lat_p99_ns'])/1e3 for r in v),
      "mean %.0f"%st.median(float(r['lat_mean_ns'])/1e3 for r in v),
      "tgt ms/op %.3f"%st.median(float(r['target_cpu_s'] or 'nan')*1e3/float(r['ios']) for r in v),
      "cli %.3f"%st.median((float(r['initiator_cpu_user_s'])+float(r['initiator_cpu_sys_s']))*1e3/float(r['ios']) for r in v))
