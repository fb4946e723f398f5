# Guest script for crates/cli/tests/integration/nvme_kernel.rs: the Linux nvme-tcp host
# against `blockwire serve --nvme`, in ONE boot. The test prepends the
# settings below (PORT, DPORT, NQN, HOSTNQN, BADNQN) and the helpers of
# nvme-host-lib.sh; defaults are for running it by hand with `kernel-vm run`
# (that file in front). Runs under `sh -e` with busybox.
: "${PORT:=4420}" "${DPORT:=8009}" "${NQN:=nqn.2026-11.org.blockwire:test}"
: "${HOSTNQN:=nqn.2026-11.org.blockwire:kernel-vm}" "${BADNQN:=nqn.2026-11.org.blockwire:intruder}"
T=10.0.2.2
step() { echo "NVME-STEP: $*"; }
ok() { echo "NVME-OK: $*"; }
die() { echo "NVME-FAIL: $*"; dmesg | grep -i nvme | tail -20; exit 1; }

modprobe nvme-tcp 2>/dev/null || modprobe nvme_tcp || die "no nvme-tcp module"
[ -c /dev/nvme-fabrics ] || die "/dev/nvme-fabrics missing"

dd if=/dev/urandom of=/tmp/pat bs=1M count=8 2>/dev/null

# O_DIRECT write / read / compare of 8 MiB, plus small (in-capsule) writes.
direct_io() {
  dev=$1
  dd if=/tmp/pat of=$dev bs=1M count=8 oflag=direct 2>/dev/null || die "O_DIRECT write to $dev"
  dd if=$dev of=/tmp/back bs=1M count=8 iflag=direct 2>/dev/null || die "O_DIRECT read from $dev"
  cmp /tmp/pat /tmp/back || die "8 MiB read back differs on $dev"
  dd if=/tmp/pat of=$dev bs=4k count=8 seek=5000 oflag=direct 2>/dev/null || die "4k write"
  dd if=$dev of=/tmp/small bs=4k count=8 skip=5000 iflag=direct 2>/dev/null || die "4k read"
  dd if=/tmp/pat of=/tmp/small.want bs=4k count=8 2>/dev/null
  cmp /tmp/small /tmp/small.want || die "4k writes read back differ"
  rm -f /tmp/back /tmp/small /tmp/small.want
}

step "connect without digests"
out=$(fabrics_connect "transport=tcp,traddr=$T,trsvcid=$PORT,nqn=$NQN,hostnqn=$HOSTNQN") || die "connect (no digests)"
inst=$(instance_of "$out"); [ -n "$inst" ] || die "no instance in '$out'"
[ "$(cat /sys/class/nvme/nvme$inst/subsysnqn)" = "$NQN" ] || die "subsysnqn mismatch"
[ "$(cat /sys/class/nvme/nvme$inst/transport)" = "tcp" ] || die "transport"
dev=$(wait_blockdev nvme$inst) || die "no namespace block device for nvme$inst"
echo "controller nvme$inst ($out) namespace $dev size $(cat /sys/block/$(basename $dev)/size) sectors"
direct_io $dev
ok "no-digest O_DIRECT 8 MiB write/read/compare"
disconnect nvme$inst
ok "disconnect (no digests)"

# A host that disables SQ flow control (Connect CATTR bit 2) lets the
# target complete a successful read with the SUCCESS flag on its last
# C2HData PDU instead of a response capsule (NVMe/TCP 1.0, 3.6.2.6); nvme-cli
# asks for it by itself when the discovery log entry's TREQ offers it, as
# ours does. With and without data digests (the host ends the request after
# the digest then).
for opts in disable_sqflow disable_sqflow,data_digest; do
  step "connect with $opts"
  out=$(fabrics_connect "transport=tcp,traddr=$T,trsvcid=$PORT,nqn=$NQN,hostnqn=$HOSTNQN,$opts") || die "connect ($opts)"
  inst=$(instance_of "$out"); [ -n "$inst" ] || die "no instance in '$out'"
  dev=$(wait_blockdev nvme$inst) || die "no namespace block device for nvme$inst"
  direct_io $dev
  dd if=$dev of=/dev/null bs=1M count=64 iflag=direct 2>/dev/null || die "64 MiB O_DIRECT read ($opts)"
  dmesg | grep -i "nvme$inst" | grep -qi "SUCCESS set but not last\|error recovery\|unexpected\|not found" && die "host complained: $(dmesg | grep -i nvme$inst | tail -5)"
  ok "$opts O_DIRECT 8 MiB write/read/compare"
  disconnect nvme$inst
done

step "connect with header and data digests"
out=$(fabrics_connect "transport=tcp,traddr=$T,trsvcid=$PORT,nqn=$NQN,hostnqn=$HOSTNQN,hdr_digest,data_digest") || die "connect (digests)"
inst=$(instance_of "$out"); [ -n "$inst" ] || die "no instance in '$out'"
dev=$(wait_blockdev nvme$inst) || die "no namespace block device for nvme$inst"
direct_io $dev
ok "digest O_DIRECT 8 MiB write/read/compare"
modprobe ext4 2>/dev/null || true
mkfs.ext4 -q -F $dev || die "mkfs.ext4"
mkdir -p /mnt/bw && mount -t ext4 $dev /mnt/bw || die "mount"
dd if=/dev/urandom of=/mnt/bw/file bs=1M count=4 2>/dev/null
want=$(md5sum < /mnt/bw/file)
sync
umount /mnt/bw || die "umount"
mount -t ext4 $dev /mnt/bw || die "remount"
[ "$(md5sum < /mnt/bw/file)" = "$want" ] || die "file changed across remount"
umount /mnt/bw
e2fsck -fn $dev || die "e2fsck found problems"
ok "ext4 mkfs/mount/write/e2fsck clean"
disconnect nvme$inst
ok "disconnect (digests)"

step "host NQN outside the allow list"
if fabrics_connect "transport=tcp,traddr=$T,trsvcid=$PORT,nqn=$NQN,hostnqn=$BADNQN" >/tmp/bad 2>&1; then
  die "connect with a host NQN outside the allow list succeeded: $(cat /tmp/bad)"
fi
ok "disallowed host refused"

step "discovery controller on port $DPORT"
out=$(fabrics_connect "transport=tcp,traddr=$T,trsvcid=$DPORT,nqn=nqn.2014-08.org.nvmexpress.discovery,hostnqn=$HOSTNQN") || die "discovery connect"
inst=$(instance_of "$out"); [ -n "$inst" ] || die "no instance in '$out'"
[ "$(cat /sys/class/nvme/nvme$inst/subsysnqn)" = "nqn.2014-08.org.nvmexpress.discovery" ] || die "discovery subsysnqn"
disconnect nvme$inst
ok "discovery controller connect/disconnect"
echo "NVME-ALL-OK"
