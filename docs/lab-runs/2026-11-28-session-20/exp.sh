#!/bin/bash
# seqread-1m only: main against iSCSI-with-low-water, under BBR and cubic, interleaved.
for r in 1 2; do
  for cc in bbr cubic; do
    for b in main exp-iscsi-lowat; do
      BIN=/tmp/bw-$b; [ $b = main ] && BIN=/tmp/bw-main
      extra=""; [ $cc = cubic ] && extra="--tcp-congestion cubic"
      d=OUT/x-$b-$cc-$r
      echo "$(date +%T) start $d"
      flock /tmp/bw-bench.lock $BIN lab --quick --suite micro --micro-workloads seqread-1m --protocols iscsi,nvme --peers none --no-baseline --mtu 1500,9000 --repeat 5 $extra --out $d > $d.log 2>&1
      echo "$(date +%T) end rc=$?"
    done
  done
done
