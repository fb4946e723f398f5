# Guest script for crates/cli/tests/integration/nvme_auth.rs: the Linux nvme-tcp
# host (Linux 6.12: tests/kernel-vm/kernel-6.12.sh) with nvme-cli against
# `blockwire serve` requiring DH-HMAC-CHAP, in ONE boot. The test prepends
# PORT, NQN and the host NQNs and secrets below, and the helpers of
# nvme-host-lib.sh. Runs under `sh -e` (busybox).
#   H1/K1          one-way, key used as is (DHHC-1:00)
#   H2/K2, C2      bidirectional; K2 SHA-512-transformed, C2 SHA-384-transformed
#   H3/K3          one-way, SHA-256 transformed; the target offers only sha384 + null group
#   BAD            a valid secret that is nobody's
T=10.0.2.2
step() { echo "AUTH-STEP: $*"; }
ok() { echo "AUTH-OK: $*"; }
die() { echo "AUTH-FAIL: $*"; dmesg | grep -i nvme | tail -30; exit 1; }

modprobe nvme-tcp 2>/dev/null || modprobe nvme_tcp || die "no nvme-tcp module"
modprobe nvme-auth 2>/dev/null || true
grep -q "^nvme_auth " /proc/modules || die "kernel $(uname -r) has no nvme-auth (CONFIG_NVME_AUTH)"
nvme connect --help 2>&1 | grep -q -- --dhchap-ctrl-secret || die "nvme-cli $(nvme version | head -1) lacks --dhchap-ctrl-secret"
echo "kernel $(uname -r), $(nvme version | head -1)"

for k in "$K1" "$K2" "$C2" "$K3" "$BAD"; do
  nvme check-dhchap-key --key="$k" >/tmp/chk 2>&1 || die "nvme check-dhchap-key rejects $k: $(cat /tmp/chk)"
done
ok "nvme check-dhchap-key accepts every secret"

dd if=/dev/urandom of=/tmp/pat bs=1M count=8 2>/dev/null

# connect HOSTNQN [nvme connect options...]: connect, 8 MiB O_DIRECT
# write/read/compare at offset $OFF MiB, disconnect.
io_round() {
  host=$1; shift
  nvme connect -t tcp -a $T -s $PORT -n $NQN --hostnqn=$host --hostid=$(cat /proc/sys/kernel/random/uuid) "$@" >/tmp/conn 2>&1 \
    || die "nvme connect as $host failed: $(cat /tmp/conn)"
  c=$(ctrl_of $host) || die "no controller for $host after connect: $(cat /tmp/conn)"
  dev=$(wait_blockdev $c) || die "no namespace block device on $c"
  dd if=/tmp/pat of=$dev bs=1M count=8 seek=$OFF oflag=direct 2>/dev/null || die "O_DIRECT write to $dev"
  dd if=$dev of=/tmp/back bs=1M count=8 skip=$OFF iflag=direct 2>/dev/null || die "O_DIRECT read from $dev"
  cmp /tmp/pat /tmp/back || die "8 MiB read back differs on $dev"
  echo "$host: $c $dev, $(cat /sys/class/nvme/$c/queue_count 2>/dev/null || echo '?') queues"
  disconnect $c
}

# refused HOSTNQN WHAT [nvme connect options...]: the connect must fail and
# leave no controller behind.
refused() {
  host=$1; what=$2; shift 2
  if nvme connect -t tcp -a $T -s $PORT -n $NQN --hostnqn=$host --hostid=$(cat /proc/sys/kernel/random/uuid) "$@" >/tmp/conn 2>&1; then
    die "$what: nvme connect succeeded: $(cat /tmp/conn)"
  fi
  sleep 1
  ! ctrl_of $host >/dev/null || die "$what: a controller for $host is left"
  echo "$what: $(tr '\n' ' ' </tmp/conn)"
}

step "one-way (DHHC-1:00), two I/O queues"
dmesg -c >/dev/null
OFF=0 io_round $H1 --dhchap-secret="$K1" --nr-write-queues=1
dmesg | grep -i "authenticated" || true
dmesg | grep -q "qid 0: authenticated" || die "the kernel did not log the admin queue's authentication"
ok "one-way authentication, I/O on two queues"

step "bidirectional (host DHHC-1:03, controller DHHC-1:02)"
dmesg -c >/dev/null
OFF=8 io_round $H2 --dhchap-secret="$K2" --dhchap-ctrl-secret="$C2"
dmesg | grep -i "authenticated" || true
dmesg | grep -q "qid 0: controller authenticated" || die "the kernel did not log that the controller authenticated"
ok "bidirectional authentication and I/O"

step "sha384 and the null group only"
dmesg -c >/dev/null
OFF=16 io_round $H3 --dhchap-secret="$K3"
dmesg | grep -i "authenticated" || true
dmesg | grep -q "hash hmac(sha384) dhgroup null" || die "expected hmac(sha384) with the null group"
ok "sha384 with the null DH group"

step "wrong host secret"
refused $H1 "wrong host secret" --dhchap-secret="$BAD"
ok "wrong host secret refused"

step "wrong controller secret"
refused $H2 "wrong controller secret" --dhchap-secret="$K2" --dhchap-ctrl-secret="$BAD"
ok "wrong controller secret detected by the host"

step "no secret"
refused $H1 "no secret"
ok "host without a secret refused"

echo "AUTH-ALL-OK"
