#!/bin/bash
# usage: callgrind-client.sh BIN PROTO(nvme|iscsi) RW(randread|randwrite) -> instructions per I/O of the client
set -e
BIN=$1; P=$2; RW=$3; D=$(mktemp -d)
truncate -s 512M /dev/shm/cg-vol-$$
cat > $D/serve.toml <<T
[[volume]]
name = "d"
backend = "file:/dev/shm/cg-vol-$$"
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
$BIN serve --config $D/serve.toml 2>$D/serve.log & SP=$!
trap 'kill $SP 2>/dev/null; wait $SP 2>/dev/null; rm -f /dev/shm/cg-vol-$$; rm -rf $D' EXIT
for i in $(seq 100); do grep -q ready $D/serve.log && break; sleep 0.1; done
[ $P = nvme ] && URL=nvme+tcp://127.0.0.1:14420/nqn.2026-11.cg:d/1 || URL=iscsi://127.0.0.1:13260/iqn.2026-11.cg:d/0
for n in 20000 60000; do
  valgrind --tool=callgrind --callgrind-out-file=$D/cg.$n $BIN bench $URL --rw $RW --bs 4096 --iodepth 32 --ios $n --size 536870912 >/dev/null 2>$D/vg.$n
  grep -o "Collected : [0-9]*" $D/vg.$n | awk '{print $3}' > $D/ir.$n
done
a=$(cat $D/ir.20000); b=$(cat $D/ir.60000)
echo "$P $RW $(( (b - a) / 40000 )) instr/IO"
[ -n "$KEEP" ] && cp $D/cg.60000 $KEEP.60000 && cp $D/cg.20000 $KEEP.20000
true
