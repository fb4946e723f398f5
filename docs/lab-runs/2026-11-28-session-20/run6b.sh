#!/bin/bash
# The new build (iSCSI low-water, lab auto): its default against --tcp-congestion system (BBR), 3 each, interleaved.
BIN=/tmp/bw-new
for i in 1 2 3; do
  for cc in auto system; do
    extra=""; [ $cc = system ] && extra="--tcp-congestion system"
    echo "$(date +%T) start new-$cc-$i"
    flock /tmp/bw-bench.lock $BIN lab --quick --suite net,micro --protocols iscsi,nvme --peers tgt --mtu 1500,9000 $extra --out OUT/new-$cc-$i > OUT/new-$cc-$i.log 2>&1
    echo "$(date +%T) end new-$cc-$i rc=$?"
  done
done
