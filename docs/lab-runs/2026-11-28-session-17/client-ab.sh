#!/bin/bash
# ab.sh ROUNDS BIN_A BIN_B [rw]: client CPU per I/O, interleaved, server = BIN_A
R=$1; A=$2; B=$3; RW=${4:-randread}
ip netns exec zst $A serve --volume disk0=file:/dev/shm/zs.img --iscsi 198.19.93.1 --nvme 198.19.93.1 >/tmp/zs/srv.log 2>&1 & SP=$!; sleep 2
for r in $(seq $R); do for p in nvme iscsi; do for x in A B; do
  if [ $p = nvme ]; then U=nvme+tcp://198.19.93.1/nqn.2026-11.org.blockwire:vm/1; else U=iscsi://198.19.93.1/iqn.2026-11.org.blockwire:vm/0; fi
  bin=$A; [ $x = B ] && bin=$B
  o=$(ip netns exec zsc $bin bench $U --rw $RW --bs 4096 --iodepth 32 --ios 400000 --size 536870912 2>&1)
  iops=$(echo "$o" | awk '$1=="read"||$1=="write"{print $2}'); cpu=$(echo "$o" | grep "client cpu" | sed 's/.*, \([0-9.]*\) us per I\/O/\1/')
  echo "$r $p $x $iops $cpu"
done; done; done
kill -INT $SP; wait $SP
