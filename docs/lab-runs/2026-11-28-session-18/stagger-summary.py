import re,collections,sys
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    m=re.match(r'(\d) (\w+) K=(\w+) (\w+): target ([\d.]+) us/op  busy ([\d.]+) us/op idle ([\d.]+) us/op client: ([\d.]+) us per I/O (\d+) IOPS',l)
    if not m: print("?",l); continue
    r,rw,K,p,t,b,i,c,iops=m.groups()
    d[(rw,p,K)].append((float(t),float(c),100*float(i)/(float(b)+float(i)),int(iops)))
for k in sorted(d):
    v=d[k]; print("%-6s %-6s K=%-5s tgt %s client %s idle%% %s IOPS %s"%(k[0],k[1],k[2],[x[0] for x in v],[x[1] for x in v],[round(x[2]) for x in v],[x[3]//1000 for x in v]))
