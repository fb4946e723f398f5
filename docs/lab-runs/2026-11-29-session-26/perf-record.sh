#!/bin/bash
# usage: perf-record.sh target|client BIN nvme|iscsi randread|randwrite OUT
# Samples (cpu-clock, 4 kHz, call graphs) the target (`serve`) or the client
# (`bench`, 4 KiB QD32, 12 s) for 5 s over loopback on a 512 MiB /dev/shm
# file; writes OUT.bench, OUT.data and OUT.top (perf report by symbol).
set -e
SIDE=$1; BIN=$2; P=$3; RW=$4; OUT=$5; D=$(mktemp -d); VOL=/dev/shm/pf-vol-$$
truncate -s 512M $VOL
cat > $D/serve.toml <<T
[[volume]]
name = "d"
backend = "file:$VOL"
[iscsi]
listen = ["127.0.0.1:13261"]
[[iscsi.target]]
iqn = "iqn.2026-11.pf:d"
luns = [{ lun = 0, volume = "d" }]
[nvme]
listen = ["127.0.0.1:14421"]
discovery_listen = "127.0.0.1:18019"
[[nvme.subsystem]]
nqn = "nqn.2026-11.pf:d"
namespaces = [{ nsid = 1, volume = "d" }]
T
SP=; BP=
trap '[ -n "$BP" ] && kill $BP 2>/dev/null; [ -n "$SP" ] && kill $SP 2>/dev/null; wait 2>/dev/null; rm -f $VOL; rm -rf $D' EXIT
[ $P = nvme ] && URL=nvme+tcp://127.0.0.1:14421/nqn.2026-11.pf:d/1 || URL=iscsi://127.0.0.1:13261/iqn.2026-11.pf:d/0
$BIN serve --config $D/serve.toml 2>$D/serve.log & SP=$!
for i in $(seq 600); do grep -q ready $D/serve.log && break; sleep 0.1; done
$BIN bench $URL --rw $RW --bs 4096 --iodepth 32 --runtime 12 --size 536870912 > $OUT.bench 2>&1 & BP=$!
sleep 3
[ $SIDE = target ] && PID=$SP || PID=$BP
perf record -e cpu-clock -F 4000 -g -p $PID -o $OUT.data -- sleep 5 2>/dev/null >/dev/null
wait $BP; BP=
perf report -i $OUT.data --no-children --sort dso,sym --stdio 2>/dev/null | grep -v "^$" | grep "%" | head -60 > $OUT.top
