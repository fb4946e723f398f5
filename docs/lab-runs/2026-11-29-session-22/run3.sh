#!/bin/bash
# The lab command, 3 runs, main's build (lab default: auto congestion).
BIN=${BIN:-target/release/blockwire}; OUT=${OUT:?set OUT}
for i in 1 2 3; do
  echo "$(date +%T) start main-$i"
  flock /tmp/bw-bench.lock $BIN lab --quick --suite net,micro --protocols iscsi,nvme --peers tgt --mtu 1500,9000 --out $OUT/lab-main-$i > $OUT/lab-main-$i.log 2>&1
  echo "$(date +%T) end main-$i rc=$?"
done
