# Self instructions per I/O by function from two callgrind outputs of one run pair
# (PREFIX.20000, PREFIX.60000: `KEEP=PREFIX callgrind.sh ...`); with a
# second PREFIX, A against B, largest differences first.
import re,subprocess,sys
def load(f):
    out=subprocess.run(["callgrind_annotate","--inclusive=no","--threshold=100","--auto=no",f],capture_output=True,text=True).stdout
    d={}
    for l in out.splitlines():
        m=re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$",l)
        if m and "PROGRAM TOTALS" not in l:
            k=re.sub(r"\s*\[[^\]]*\]$","",m.group(2)); k=k.split(":",1)[-1] if ":" in k else k
            d[k]=d.get(k,0)+int(m.group(1).replace(",",""))
    return d
def per_io(pfx):
    a=load(pfx+".20000"); b=load(pfx+".60000")
    return {k:(b.get(k,0)-a.get(k,0))/40000 for k in set(a)|set(b)}
x=per_io(sys.argv[1])
if len(sys.argv)>2:
    y=per_io(sys.argv[2])
    rows=sorted(set(x)|set(y),key=lambda k:-abs(y.get(k,0)-x.get(k,0)))
    print("total A %.0f B %.0f"%(sum(x.values()),sum(y.values())))
    for k in rows[:40]: print("%7.1f %7.1f %7.1f  %s"%(x.get(k,0),y.get(k,0),y.get(k,0)-x.get(k,0),k[:150]))
else:
    print("total %.0f"%sum(x.values()))
    for k,v in sorted(x.items(),key=lambda kv:-kv[1])[:60]: print("%7.1f  %s"%(v,k[:160]))
