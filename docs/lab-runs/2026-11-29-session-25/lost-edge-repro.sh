#!/bin/bash
# A lost read edge in the TCP initiators (docs/notes/2026-11-29-lost-read-edge.md):
# the Cinder session's calls on an xfs pool, then `verify` against both
# subsystems in turn, N times; a verify still running after 4 s has its sockets
# (ss, SO_RCVLOWAT) and threads saved in $WORK/hang-I.txt. Stops after MAXF
# failures. Root; run from the repository. Env: BIN, N (500), NP (port), WORK.
set -u
B=${BIN:-target/release/blockwire}
W=${WORK:-/tmp/lost-edge-repro}; rm -rf $W; mkdir -p $W/mnt
truncate -s 8G $W/fs.img; mkfs.xfs -q -m reflink=1 $W/fs.img; mount -o loop $W/fs.img $W/mnt
NP=${NP:-24471}
cat > $W/serve.toml <<T
[[pool]]
name = "lvs0"
path = "$W/mnt/lvs0"
[nvme]
listen = ["127.0.0.1:$NP"]
T
mkdir -p $W/mnt/lvs0
$B serve --config $W/serve.toml --control $W/ctl.sock > $W/serve.log 2>&1 &
SP=$!
for i in $(seq 50); do [ -S $W/ctl.sock ] && break; sleep 0.1; done
ctl() { $B ctl --control $W/ctl.sock --json "$@"; }
U1=$(ctl bdev_lvol_create '{"lvol_name":"v1","size":1073741824,"lvs_name":"lvs0"}')
echo "$U1"
ctl nvmf_create_subsystem '{"nqn":"nqn.2016-06.io.spdk:cnode1","allow_any_host":true}'
ctl nvmf_subsystem_add_listener '{"nqn":"nqn.2016-06.io.spdk:cnode1","listen_address":{"trtype":"tcp","traddr":"127.0.0.1","trsvcid":"'$NP'"}}'
ctl nvmf_subsystem_add_ns '{"nqn":"nqn.2016-06.io.spdk:cnode1","namespace":{"bdev_name":"lvs0/v1","nsid":1}}'
URL1=nvme+tcp://127.0.0.1:$NP/nqn.2016-06.io.spdk:cnode1/1
$B verify $URL1 --size 2M --timeout 10 || echo VERIFY1 FAILED
ctl bdev_lvol_snapshot '{"lvol_name":"lvs0/v1","snapshot_name":"s1"}'
ctl bdev_lvol_inflate '{"name":"lvs0/v1"}'
$B verify $URL1 --size 1M --seed 2 --timeout 10 || echo VERIFY2 FAILED
ctl bdev_lvol_clone '{"snapshot_name":"lvs0/s1","clone_name":"c1"}'
ctl bdev_lvol_resize '{"name":"lvs0/c1","size_in_mib":2048}'
ctl nvmf_create_subsystem '{"nqn":"nqn.2016-06.io.spdk:cnode2","allow_any_host":true}'
ctl nvmf_subsystem_add_listener '{"nqn":"nqn.2016-06.io.spdk:cnode2","listen_address":{"trtype":"tcp","traddr":"127.0.0.1","trsvcid":"'$NP'"}}'
ctl nvmf_subsystem_add_ns '{"nqn":"nqn.2016-06.io.spdk:cnode2","namespace":{"bdev_name":"lvs0/c1","nsid":1}}'
URL2=nvme+tcp://127.0.0.1:$NP/nqn.2016-06.io.spdk:cnode2/1
fails=0
for i in $(seq ${N:-500}); do
  for u in $URL2 $URL1; do
    timeout 60 $B verify $u --size 1M --seed $i --timeout 10 --threads 2 --chunk 128K --concurrency 16 > $W/v.log 2>&1 &
    VP=$!
    for t in $(seq 40); do kill -0 $VP 2>/dev/null || break; sleep 0.1; done
    if kill -0 $VP 2>/dev/null; then
      sleep 1; { date; ss -tnpie "sport = :$NP or dport = :$NP"; for tp in /proc/$SP/task/*; do echo "$tp $(cat $tp/comm) $(cat $tp/wchan) $(cat $tp/stat | cut -d' ' -f3)"; done; } > $W/hang-$i.txt 2>&1
      CPID=$(pgrep -P $VP); for tp in /proc/$CPID/task/*; do echo "client $tp $(cat $tp/comm) $(cat $tp/wchan)"; done >> $W/hang-$i.txt; python3 "$(dirname "$0")/lowat.py" $CPID >> $W/hang-$i.txt 2>&1
    fi
    if ! wait $VP; then
      fails=$((fails+1)); echo "iteration $i $u FAILED"; cat $W/v.log; cp $W/serve.log $W/serve-fail-$fails.log
      [ $fails -ge ${MAXF:-3} ] && break 2
    fi
  done
  [ $((i % 50)) = 0 ] && echo "iteration $i"
done
kill $SP; wait $SP
umount $W/mnt; rm -f $W/fs.img
echo "done, $fails failures"
