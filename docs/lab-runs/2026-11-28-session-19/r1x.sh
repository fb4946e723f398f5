#!/bin/bash
# r1x.sh ROUNDS BIN:PROTO...: 1 MiB QD1 reads, alternating, --runtime 1
R=$1; shift
for r in $(seq $R); do for x in "$@"; do b=${x%%:*}; p=${x##*:}
  U=nvme+tcp://198.19.93.1/nqn.2026-11.org.blockwire:vm/1; [ $p = iscsi ] && U=iscsi://198.19.93.1/iqn.2026-11.org.blockwire:vm/0
  o=$(ip netns exec zsc $b bench $U --rw read --bs ${BS:-1048576} --iodepth ${QD:-1} --runtime 1 --size ${SIZE:-134217728} 2>&1)
  echo "$r $x $(echo "$o" | awk '$1=="read"{print $2, $3, $4, $5}') $(echo "$o" | grep -o '[0-9.]* us per I/O')"
done; done
