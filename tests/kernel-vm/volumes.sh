# Guest side of volumes::kernel_initiator_reads_snapshots_and_clones: the
# Linux nvme-tcp host reads pool volumes the test made through blockwire's
# control socket (an origin, a snapshot of it, a clone of the snapshot),
# all namespaces of one subsystem on the host (10.0.2.2). The test wrote
# pattern A (4 MiB at 0) before the snapshot and pattern B (1 MiB at
# 1 MiB) to the origin after it, and prepends:
#   PORT NQN HOSTNQN   where to connect
#   NS_ORIGIN NS_SNAP NS_CLONE   the nsids
#   SUM_A        sha256 of A (4 MiB)
#   SUM_B        sha256 of B (1 MiB)
#   SUM_A_AT_1M  sha256 of A's second MiB (what the snapshot holds there)
# Runs under `sh -e` with busybox; prints VOL-OK per check, VOL-ALL-OK at the end.
T=10.0.2.2
step() { echo "VOL-STEP: $*"; }
ok() { echo "VOL-OK: $*"; }
die() { echo "VOL-FAIL: $*"; dmesg | grep -i nvme | tail -20; exit 1; }

modprobe nvme-tcp 2>/dev/null || modprobe nvme_tcp || die "no nvme-tcp module"

step "connect to $NQN"
exec 3<>/dev/nvme-fabrics
echo "transport=tcp,traddr=$T,trsvcid=$PORT,nqn=$NQN,hostnqn=$HOSTNQN" >&3 || die "connect"
read -r line <&3 || true
exec 3>&-
inst=$(echo "$line" | sed -n 's/.*instance=\([0-9]*\).*/\1/p')
[ -n "$inst" ] || die "no controller instance in '$line'"

# The block device (head, with multipath) of namespace ID $1 of nvme$inst,
# found by the namespace's `nsid` attribute: device names count
# namespaces in the order the host found them, not by NSID.
ns_dev() {
  for d in /sys/class/nvme/nvme$inst/nvme*; do
    [ -r "$d/nsid" ] && [ "$(cat "$d/nsid")" = "$1" ] || continue
    n=$(basename "$d"); h=$(echo "$n" | sed 's/c[0-9]*n/n/')
    [ -b /dev/$h ] && { echo /dev/$h; return 0; }
    [ -b /dev/$n ] && { echo /dev/$n; return 0; }
  done
  return 1
}
wait_ns() {
  i=0
  while ! ns_dev $1 >/dev/null; do
    i=$((i + 1)); [ $i -lt 150 ] || die "no block device for namespace $1 of nvme$inst"
    sleep 0.2
  done
  ns_dev $1
}
ORIGIN=$(wait_ns $NS_ORIGIN); SNAP=$(wait_ns $NS_SNAP); CLONE=$(wait_ns $NS_CLONE)
step "origin $ORIGIN, snapshot $SNAP, clone $CLONE"

# sha256 of $3 MiB of device $1 from MiB $2, read with O_DIRECT (from the
# target, not the page cache).
sum_of() { dd if=$1 bs=1M skip=$2 count=$3 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1; }

[ "$(sum_of $SNAP 0 4)" = "$SUM_A" ] || die "the snapshot does not hold what was written before it"
ok "snapshot holds the data written before it"
[ "$(sum_of $CLONE 0 4)" = "$SUM_A" ] || die "the clone does not hold its snapshot's data"
ok "clone holds the snapshot's data"
[ "$(sum_of $ORIGIN 1 1)" = "$SUM_B" ] || die "the origin lacks the write made after the snapshot"
[ "$(sum_of $SNAP 1 1)" = "$SUM_A_AT_1M" ] || die "the snapshot holds a write made after it"
ok "the origin's write after the snapshot is not in the snapshot"

step "the snapshot refuses writes"
b=$(basename $SNAP)
[ "$(cat /sys/block/$b/ro)" = 1 ] || die "the host does not see $SNAP as read-only (NSATTR write protected)"
if dd if=/dev/zero of=$SNAP bs=4k count=1 oflag=direct 2>/tmp/dd.err; then die "dd wrote to the snapshot"; fi
echo "dd: $(cat /tmp/dd.err)"
# Past the block layer's read-only check: a Write command passed through
# to the target must come back Namespace Is Write Protected.
if command -v nvme >/dev/null; then
  dd if=/dev/zero of=/tmp/zero bs=4k count=1 2>/dev/null
  if nvme write $SNAP --start-block=0 --block-count=7 --data-size=4096 --data=/tmp/zero >/tmp/nvme.out 2>&1; then
    cat /tmp/nvme.out; die "a Write passed through to the snapshot succeeded"
  fi
  cat /tmp/nvme.out
  grep -qi "write.protected" /tmp/nvme.out || die "the passed-through Write failed, but not as write protected"
  ok "passthrough Write to the snapshot: write protected"
fi
[ "$(sum_of $SNAP 0 4)" = "$SUM_A" ] || die "the snapshot changed"
ok "snapshot read-only"

step "the clone takes writes"
[ "$(cat /sys/block/$(basename $CLONE)/ro)" = 0 ] || die "the clone is read-only"
dd if=/dev/urandom of=/tmp/w bs=1M count=1 2>/dev/null
dd if=/tmp/w of=$CLONE bs=1M seek=8 count=1 oflag=direct 2>/dev/null || die "write to the clone"
[ "$(sum_of $CLONE 8 1)" = "$(sha256sum < /tmp/w | cut -d' ' -f1)" ] || die "the clone's write read back differs"
echo "VOL-CLONE-WRITE: $(sha256sum < /tmp/w | cut -d' ' -f1)"
ok "clone written and read back"

echo 1 > /sys/class/nvme/nvme$inst/delete_controller
echo "VOL-ALL-OK"
