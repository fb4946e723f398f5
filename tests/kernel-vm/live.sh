# Guest side of control::kernel_initiators_follow_live_changes: open-iscsi
# and nvme-tcp stay connected to `blockwire serve` on the host (10.0.2.2)
# while the test changes it with `blockwire ctl`. The guest tells the host
# which phase it reached by writing one line to the first sector of NVMe
# namespace 1 (the host reads that volume's file); an O_DIRECT write, read
# and compare loop on iSCSI LUN 0 runs throughout and must keep going.
# The test prepends IPORT, NPORT, IQN, NQN, HOSTNQN.
T=10.0.2.2
step() { echo "LIVE-STEP: $*"; }
die() { echo "LIVE-FAIL: $*"; dmesg | tail -40; exit 1; }
# Poll (0.5 s apart, at most $1 tries) until "$2" succeeds.
poll() { n=0; while ! eval "$2" >/dev/null 2>&1; do n=$((n + 1)); [ $n -lt $1 ] || return 1; sleep 0.5; done; }

modprobe iscsi_tcp; modprobe sd_mod 2>/dev/null; modprobe nvme-tcp 2>/dev/null || modprobe nvme_tcp
iscsid; sleep 1

# The sd device of LUN $1 of the one iSCSI session.
lun_dev() { for d in /sys/class/scsi_disk/*:$1; do [ -d "$d/device/block" ] && ls "$d/device/block" && return 0; done; return 1; }
# The block device of namespace $2 of controller nvme$1 (with multipath the
# path nvme0c0n2 has the head nvme0n2).
ns_dev() {
  for d in /sys/class/nvme/nvme$1/nvme*n$2 /sys/class/nvme/nvme$1/nvme*c*n$2; do
    [ -e "$d" ] || continue
    n=$(basename "$d"); h=$(echo "$n" | sed 's/c[0-9]*n/n/')
    [ -b /dev/$h ] && { echo $h; return 0; }
    [ -b /dev/$n ] && { echo $n; return 0; }
  done
  return 1
}

step "login and connect"
iscsiadm -m node -o new -T $IQN -p $T:$IPORT >/dev/null || die "node record"
iscsiadm -m node -T $IQN -p $T:$IPORT --login >/dev/null || die "iSCSI login"
poll 100 "lun_dev 0" || die "no disk for LUN 0"
DATA=/dev/$(lun_dev 0)
exec 3<>/dev/nvme-fabrics
echo "transport=tcp,traddr=$T,trsvcid=$NPORT,nqn=$NQN,hostnqn=$HOSTNQN" >&3 || die "nvme connect"
read -r line <&3; exec 3>&-
inst=$(echo "$line" | sed -n 's/.*instance=\([0-9]*\).*/\1/p')
poll 100 "ns_dev $inst 1" || die "no namespace 1"
MBOX=/dev/$(ns_dev $inst 1)
step "iSCSI LUN 0 is $DATA, NVMe controller nvme$inst, mailbox $MBOX"

dd if=/dev/urandom of=/tmp/pat bs=1M count=4 2>/dev/null
(
  n=0
  while [ ! -e /tmp/stop ]; do
    if dd if=/tmp/pat of=$DATA bs=1M count=4 oflag=direct 2>/dev/null &&
       dd if=$DATA of=/tmp/back bs=1M count=4 iflag=direct 2>/dev/null && cmp -s /tmp/pat /tmp/back; then
      n=$((n + 1)); echo $n > /tmp/io.ok
    else
      echo "round $n failed" >> /tmp/io.fail
    fi
  done
) &
io() { cat /tmp/io.ok 2>/dev/null || echo 0; }
last=0
# Tell the host we reached phase $1, once the I/O loop has made progress
# since the last phase.
mark() {
  [ ! -e /tmp/io.fail ] || die "I/O on LUN 0 failed: $(cat /tmp/io.fail)"
  poll 240 "[ \$(io) -gt $last ]" || die "I/O on LUN 0 stopped before $1 (at round $(io))"
  last=$(io)
  step "$1 (I/O round $last)"
  printf '%-511s\n' "$1" | dd of=$MBOX bs=512 count=1 oflag=direct 2>/dev/null || die "mailbox write"
}
mark P1

step "waiting for LUN 1 (unit attention, then a rescan) and namespace 2 (no action)"
poll 240 "iscsiadm -m session -R; lun_dev 1" || die "LUN 1 not found after rescans"
# The I/O loop on LUN 0 meets the unit attention on its next command, which
# may end after the rescan has found LUN 1 (a 4 MiB direct transfer takes a
# while in this emulated guest: 2026-11-28, the rescan won by ~0.1 s and a
# single look at dmesg failed), so wait for it as for the rest.
poll 240 "dmesg | grep -q 'LUN assignments on this target have changed'" || die "no REPORTED LUNS DATA HAS CHANGED unit attention seen"
poll 240 "ns_dev $inst 2" || die "namespace 2 did not appear"
LUN1=$(lun_dev 1); NS2=$(ns_dev $inst 2)
step "LUN 1 is /dev/$LUN1 ($(cat /sys/block/$LUN1/size) sectors), namespace 2 is /dev/$NS2 ($(cat /sys/block/$NS2/size) sectors)"
mark P2

step "waiting for the resize to 48 MiB (98304 sectors)"
rescan() { iscsiadm -m session -R; echo 1 > /sys/class/scsi_disk/*:1/device/rescan; }
poll 240 "[ \$(cat /sys/block/$NS2/size) = 98304 ]" || die "nvme-tcp did not see the resize by itself ($(cat /sys/block/$NS2/size))"
poll 240 "rescan; [ \$(cat /sys/block/$LUN1/size) = 98304 ]" || die "open-iscsi did not see the resize after a rescan ($(cat /sys/block/$LUN1/size))"
mark P3

step "waiting for namespace 2 to go"
poll 240 "! ns_dev $inst 2" || die "namespace 2 is still there"
mark P4

step "waiting for the controller to be lost (its host was removed)"
poll 240 "[ \$(cat /sys/class/nvme/nvme$inst/state) != live ]" || die "controller nvme$inst still live"
step "controller nvme$inst is $(cat /sys/class/nvme/nvme$inst/state)"
before=$(io)
poll 240 "[ \$(io) -gt $before ]" || die "I/O on LUN 0 stopped after the controller loss"
touch /tmp/stop; wait
[ ! -e /tmp/io.fail ] || die "I/O on LUN 0 failed: $(cat /tmp/io.fail)"
echo 1 > /sys/class/nvme/nvme$inst/delete_controller
iscsiadm -m node -T $IQN -p $T:$IPORT --logout >/dev/null
echo "LIVE-OK: $(io) rounds of I/O on LUN 0 throughout"
