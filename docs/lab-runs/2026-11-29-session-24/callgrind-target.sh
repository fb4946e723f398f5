#!/bin/bash
# usage: callgrind-target.sh BIN PROTO RW -> target instructions per I/O (serve under callgrind)
set -e
BIN=$1; P=$2; RW=$3; D=$(mktemp -d)
truncate -s 512M /dev/shm/cgt-vol-$$
cat > $D/serve.toml <<T
[[volume]]
name = "d"
backend = "file:/dev/shm/cgt-vol-$$"
[iscsi]
listen = ["127.0.0.1:13261"]
[[iscsi.target]]
iqn = "iqn.2026-11.cg:d"
luns = [{ lun = 0, volume = "d" }]
[nvme]
listen = ["127.0.0.1:14421"]
discovery_listen = "127.0.0.1:18010"
[[nvme.subsystem]]
nqn = "nqn.2026-11.cg:d"
namespaces = [{ nsid = 1, volume = "d" }]
T
trap 'rm -f /dev/shm/cgt-vol-$$; rm -rf $D' EXIT
[ $P = nvme ] && URL=nvme+tcp://127.0.0.1:14421/nqn.2026-11.cg:d/1 || URL=iscsi://127.0.0.1:13261/iqn.2026-11.cg:d/0
for n in 20000 60000; do
  valgrind --tool=callgrind --callgrind-out-file=$D/cg.$n $BIN serve --config $D/serve.toml 2>$D/serve.$n & SP=$!
  for i in $(seq 600); do grep -q ready $D/serve.$n && break; sleep 0.1; done
  $BIN bench $URL --rw $RW --bs 4096 --iodepth 32 --ios $n --size 536870912 >/dev/null
  kill -TERM $SP; wait $SP || true
  grep -o "Collected : [0-9]*" $D/serve.$n | awk '{print $3}' > $D/ir.$n
done
a=$(cat $D/ir.20000); b=$(cat $D/ir.60000)
echo "target $P $RW $(( (b - a) / 40000 )) instr/IO"
[ -n "$KEEP" ] && cp $D/cg.60000 $KEEP.60000 && cp $D/cg.20000 $KEEP.20000
true
