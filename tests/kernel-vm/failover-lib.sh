# Helpers for the guest scripts that fail a gateway over under I/O
# (rbd-gateways.sh, rbd-ha.sh); the host test puts this file in front of
# the script. Needs T (the host, 10.0.2.2) and CTL (the port on which the
# host test takes orders and answers "done ORDER" once carried out).
step() { echo "MP-STEP: $*"; }
ok() { echo "MP-OK: $*"; }
die() {
  echo "MP-FAIL: $*"
  touch /tmp/stop
  nvme list-subsys 2>&1 || true
  cat /sys/kernel/debug/aoe/* 2>/dev/null || true
  multipath -ll 2>/dev/null || true
  dmesg | grep -i -E "nvme|aoe|iscsi|sd |multipath|alua" | tail -40
  exit 1
}

# Ask the host test to do something and wait until it is done.
order() {
  r=$(echo "$1" | nc $T $CTL) || die "control channel: nc failed for $1"
  [ "$r" = "done $1" ] || die "host did not carry out '$1' (answered '$r')"
}

# ---- the paths ----
ctrl_of() { # the NVMe controller (nvmeN) connected to port $1
  for c in /sys/class/nvme/nvme*; do
    grep -q "trsvcid=$1," $c/address 2>/dev/null && { basename $c; return 0; }
  done
  return 1
}
# Wait until controllers $1 and $2 both have their namespace path.
wait_nvme_paths() {
  n=0
  while [ -z "$(ls -d /sys/class/nvme/$1/nvme*c*n1 /sys/class/nvme/$2/nvme*c*n1 2>/dev/null | sed -n 2p)" ]; do
    n=$((n + 1)); [ $n -lt 100 ] || die "namespace paths did not appear"; sleep 0.2
  done
}
path_of() { basename $(ls -d /sys/class/nvme/$1/nvme*c*n1 | head -1); } # controller $1's namespace path
# Connect to both gateways (ports PA and PB, subsystem NQN) and wait for
# both namespace paths; sets CA and CB (the controllers), PATHA and PATHB
# (their paths) and DEV (the multipath head, from A's path).
# ctrl-loss-tmo: keep reconnecting to a dead gateway for 2 minutes;
# reconnect-delay: try every second.
connect_both_gateways() {
  for p in $PA $PB; do
    nvme connect -t tcp -a $T -s $p -n $NQN --ctrl-loss-tmo=120 --reconnect-delay=1 || die "nvme connect to port $p"
  done
  CA=$(ctrl_of $PA) || die "no controller for gateway A"
  CB=$(ctrl_of $PB) || die "no controller for gateway B"
  wait_nvme_paths $CA $CB
  PATHA=$(path_of $CA); PATHB=$(path_of $CB)
  DEV=/dev/$(echo $PATHA | sed 's/c[0-9]*n/n/')
}
ana() { cat /sys/block/$1/ana_state; }
writes() { awk '{print $5}' /sys/block/$1/stat; } # writes completed on block device $1
disk_of() { # the sd disk of the iSCSI session through portal port $1
  iscsiadm -m session -P 3 2>/dev/null | awk -v p="$T:$1," '
    /Current Portal:/ { cur = index($0, p) > 0 }
    /Attached scsi disk/ && cur { print $4; exit }'
}

# ---- writers with a ledger of acknowledged writes ----
# writers DEV MARK FIRST: 4 writers, writer k writes blocks FIRST+k,
# FIRST+k+4, ... each 4 KiB block holding "MARK block NNNNNNNN"; after each
# acknowledged O_DIRECT write the block number and the time go to its ledger.
# Any failed write is an error the host was not supposed to see.
writer() {
  dev=$1 mark=$2 i=$3 led=/tmp/ledger.$4
  while [ ! -e /tmp/stop ]; do
    if ! printf '%s block %08d\n' $mark $i | dd of=$dev bs=4096 seek=$i count=1 conv=sync oflag=direct 2>/tmp/dd.err.$4; then
      echo "write of block $i failed: $(cat /tmp/dd.err.$4)" > /tmp/writer.error
      return 1
    fi
    echo "$i $(cut -d' ' -f1 /proc/uptime)" >> $led
    i=$((i + 4))
  done
}
start_writers() {
  rm -f /tmp/stop /tmp/writer.error /tmp/ledger.*
  WRITERS=""
  for k in 0 1 2 3; do
    : > /tmp/ledger.$k
    writer $1 $2 $(($3 + k)) $k &
    WRITERS="$WRITERS $!"
  done
}
acked() { cat /tmp/ledger.* | wc -l; }
# Wait until N more writes are acknowledged (or a writer failed).
wait_acked() {
  want=$(( $(acked) + $1 )); n=0
  while [ $(acked) -lt $want ]; do
    [ -e /tmp/writer.error ] && die "$(cat /tmp/writer.error)"
    n=$((n + 1)); [ $n -lt ${2:-600} ] || die "writes stalled at $(acked) (waited $((${2:-600} / 10)) s for $want)"
    sleep 0.1
  done
}
# The longest pause between two acknowledged writes whose ledger times are
# at or after $1 (uptime seconds; 0: all of them).
longest_gap() {
  cat /tmp/ledger.* | awk -v from=${1:-0} '$2 >= from { print $2 }' | sort -n | awk 'NR > 1 && $1 - p > g { g = $1 - p } { p = $1 } END { printf "%.2f", g }'
}
now() { cut -d' ' -f1 /proc/uptime; }
# Stop the writers; check every acknowledged block reads back; print the
# ledger (for the host's own check against the cluster) and the longest
# pause between two acknowledged writes.
stop_writers() {
  touch /tmp/stop
  for w in $WRITERS; do wait $w || true; done
  [ ! -e /tmp/writer.error ] || die "$(cat /tmp/writer.error)"
  for k in 0 1 2 3; do
    while read -r i t; do
      got=$(dd if=$1 bs=4096 skip=$i count=1 iflag=direct 2>/dev/null | head -c 28)
      [ "$got" = "$(printf '%s block %08d' $2 $i)" ] || die "block $i reads back as '$got' after an acknowledged write"
    done < /tmp/ledger.$k
    echo "$2-LEDGER: writer $k blocks $(head -1 /tmp/ledger.$k | cut -d' ' -f1) to $(tail -1 /tmp/ledger.$k | cut -d' ' -f1) step 4 count $(wc -l < /tmp/ledger.$k)"
  done
  echo "$2: $(acked) acknowledged writes all read back; longest pause between acknowledgements $(longest_gap) s"
}
