import sys, statistics as st, collections
a=collections.defaultdict(list)
for l in open(sys.argv[1]):
    f=l.split()
    if len(f)<6: continue
    a[f[1]].append((float(f[3]), float(f[4][:-2]) * (1000 if f[4].endswith('ms') else 1), float(f[5][:-2])*(1000 if f[5].endswith('ms') else 1), float(f[6])))
for k,v in a.items():
    print("%-22s n %d MiB/s med %.0f (%.0f-%.0f)  p50 %.0f  p99 %.0f  client us/op %.0f" % (k,len(v),st.median(x[0] for x in v),min(x[0] for x in v),max(x[0] for x in v),st.median(x[1] for x in v),st.median(x[2] for x in v),st.median(x[3] for x in v)))
