#!/bin/bash
# usage: callgrind.sh client|target BIN PROTO(nvme|iscsi) RW(randread|randwrite)
# Instructions per 4 KiB QD32 I/O of the client (`blockwire bench` under
# callgrind, serve native) or of the target (`blockwire serve` under
# callgrind, bench native), over loopback, on a 512 MiB /dev/shm file:
# (60k-I/O run - 20k-I/O run) / 40k, so start-up costs cancel. KEEP=PREFIX
# keeps both outputs as PREFIX.20000 and PREFIX.60000 for
# callgrind-by-function.py.
set -e
SIDE=$1; BIN=$2; P=$3; RW=$4; D=$(mktemp -d); VOL=/dev/shm/cg-vol-$$
truncate -s 512M $VOL
cat > $D/serve.toml <<T
[[volume]]
name = "d"
backend = "file:$VOL"
[iscsi]
listen = ["127.0.0.1:13260"]
[[iscsi.target]]
iqn = "iqn.2026-11.cg:d"
luns = [{ lun = 0, volume = "d" }]
[nvme]
listen = ["127.0.0.1:14420"]
discovery_listen = "127.0.0.1:18009"
[[nvme.subsystem]]
nqn = "nqn.2026-11.cg:d"
namespaces = [{ nsid = 1, volume = "d" }]
T
SP=
trap '[ -n "$SP" ] && kill $SP 2>/dev/null; wait 2>/dev/null; rm -f $VOL; rm -rf $D' EXIT
[ $P = nvme ] && URL=nvme+tcp://127.0.0.1:14420/nqn.2026-11.cg:d/1 || URL=iscsi://127.0.0.1:13260/iqn.2026-11.cg:d/0
serve() { "$@" serve --config $D/serve.toml 2>$D/serve.log & SP=$!; for i in $(seq 600); do grep -q ready $D/serve.log && break; sleep 0.1; done; }
bench() { "$@" bench $URL --rw $RW --bs 4096 --iodepth 32 --ios $n --size 536870912 >/dev/null 2>$D/bench.log; }
[ $SIDE = client ] && serve $BIN
for n in 20000 60000; do
  VG="valgrind --tool=callgrind --callgrind-out-file=$D/cg.$n"
  if [ $SIDE = client ]; then
    bench $VG $BIN; LOG=$D/bench.log
  else
    serve $VG $BIN; bench $BIN; kill -TERM $SP; wait $SP || true; SP=; LOG=$D/serve.log
  fi
  grep -o "Collected : [0-9]*" $LOG | awk '{print $3}' > $D/ir.$n
done
echo "$SIDE $P $RW $(( ($(cat $D/ir.60000) - $(cat $D/ir.20000)) / 40000 )) instructions per I/O"
[ -z "$KEEP" ] || { cp $D/cg.60000 $KEEP.60000; cp $D/cg.20000 $KEEP.20000; }
