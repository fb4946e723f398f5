# Self instructions per I/O by source line, our crates only (calls left
# out), from `callgrind_annotate --auto=yes PREFIX.60000 > ANN`:
#   python3 callgrind-by-line.py ANN 60000 [TOP]
# (divides by the run's I/Os: start-up lines are small beside 60k I/Os).
import re,sys
f=sys.argv[1]; div=float(sys.argv[2]); top=int(sys.argv[3]) if len(sys.argv)>3 else 40
sec=None; rows=[]; ln=0
for l in open(f):
    m=re.match(r'-- Auto-annotated source: (.*)',l)
    if m: sec=m.group(1).strip(); ln=0; continue
    if sec is None: continue
    m=re.match(r'\s*([\d,]+|\.)\s+(\([^)]*\)\s+)?(.*)$',l.rstrip('\n'))
    if not m: continue
    if m.group(1)=='.': continue
    n=int(m.group(1).replace(',',''))
    if "/work/main" in sec and not m.group(3).startswith("=>"): rows.append((n/div, sec.replace('/work/main/crates/',''), m.group(3)[:110]))
rows.sort(reverse=True)
for r in rows[:top]: print("%6.1f  %-32s %s"%r)
