#!/bin/bash
# m.sh CMD...: run, print target (srv.pid) CPU, machine busy CPU (from /proc/stat), per op given OPS env
SP=$(cat /tmp/zs/srv.pid)
pt() { awk '{print $14+$15}' /proc/$SP/stat; }
ms() { awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat; }
t0=$(pt); read b0 i0 < <(ms)
"$@" > /tmp/zs/m.out 2>&1
t1=$(pt); read b1 i1 < <(ms)
ops=$(awk '$1=="write"||$1=="read"{print $NF} /^ops/{print $2}' /tmp/zs/m.out | head -1)
cl=$(grep -o "[0-9.]* us per I/O" /tmp/zs/m.out)
echo "ops $ops target $(echo "($t1-$t0)*10000/$ops" | bc -l | cut -c1-5) us/op  busy $(echo "($b1-$b0)*10000/$ops" | bc -l | cut -c1-5) us/op idle $(echo "($i1-$i0)*10000/$ops" | bc -l | cut -c1-5) us/op client: $cl $(grep -E '^(read|write) ' /tmp/zs/m.out | awk '{print $2" IOPS"}')"
