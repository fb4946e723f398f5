#!/bin/bash
# Interleaved quick labs: BBR (system default) and cubic, 3 each.
BIN=target/release/blockwire
for i in 1 2 3; do
  for cc in bbr cubic; do
    extra=""; [ $cc = cubic ] && extra="--tcp-congestion cubic"
    echo "$(date +%T) start $cc-$i"
    flock /tmp/bw-bench.lock $BIN lab --quick --suite net,micro --protocols iscsi,nvme --peers tgt --mtu 1500,9000 $extra --out OUT/$cc-$i > OUT/$cc-$i.log 2>&1
    echo "$(date +%T) end $cc-$i rc=$?"
  done
done
