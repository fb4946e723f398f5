# Self instructions per I/O by source file (inlined code counts where its
# source is), from the two outputs of one callgrind.sh pair (session 24's;
# KEEP=PREFIX): python3 callgrind-by-file.py PREFIX
import re,subprocess,sys
def load(f):
    out=subprocess.run(["callgrind_annotate","--inclusive=no","--threshold=100","--auto=no",f],capture_output=True,text=True).stdout
    d={}
    for l in out.splitlines():
        m=re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$",l)
        if m and "PROGRAM TOTALS" not in l:
            k=m.group(2).split(":",1)[0]
            k=re.sub(r"^/work/main/crates/","",k); k=re.sub(r"^/root/.cargo/registry/src/[^/]+/","",k); k=re.sub(r"^/rustc/[0-9a-f]+/library/","std:",k)
            d[k]=d.get(k,0)+int(m.group(1).replace(",",""))
    return d
a=load(sys.argv[1]+".20000"); b=load(sys.argv[1]+".60000")
x={k:(b.get(k,0)-a.get(k,0))/40000 for k in set(a)|set(b)}
print("total %.0f"%sum(x.values()))
for k,v in sorted(x.items(),key=lambda kv:-kv[1])[:45]: print("%7.1f  %s"%(v,k))
