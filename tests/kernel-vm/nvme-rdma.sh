# Guest script for crates/cli/tests/integration/nvme_rdma.rs (after the
# helpers of nvme-host-lib.sh, which the test puts in front): NVMe over RDMA
# on soft-RoCE (rxe0 on eth0), in ONE boot:
#   1. `blockwire serve --nvme-rdma` in the guest; the Linux nvme-rdma host
#      connects, mkfs.ext4, writes a checksummed tree, e2fsck -fn is clean,
#      the checksums match after a reconnect;
#   2. with that host still connected and mounted, $PROBE (the integration
#      test binary's guest half) sends bad input on queues of its own; the
#      Linux host's queues carry on (checksums again, a new file);
#   3. discovery: blockwire's discovery controller (TCP on $DPORT, and
#      over RDMA on $PORT) lists the RDMA port; `nvme discover` shows it,
#      `nvme connect-all` connects over RDMA through it;
#   4. admission limits on RDMA queues: a second blockwire (max_sessions 1,
#      max_pending_logins 2, login_timeout_s 10, an allow-list) refuses a
#      second host and a host not on the list; $PROBE_LIMITS checks the
#      pending-login bound and the login timeout on raw queues;
#   5. the kernel's nvmet-rdma target in the same guest; `blockwire verify
#      nvme+rdma://` against it and against blockwire, also as a host that
#      authenticates (DH-HMAC-CHAP both ways; a wrong secret or none refused).
# Before 1, $PROBE_LAB checks the lab's rule for its NVMe/RDMA subjects (an
# RDMA device on the link's interface) on this host, which has one.
# The test prepends BW, PROBE, PROBE_LIMITS, PROBE_LAB, PORT, DPORT, LPORT,
# KPORT, NQN, KNQN, HOSTNQN, AUTH_KEY, AUTH_CTRL_KEY, AUTH_BAD_KEY. Runs under `sh -e` with busybox.
: "${BW:=/usr/local/bin/blockwire}" "${PROBE:=}" "${PROBE_LIMITS:=}" "${PROBE_LAB:=}" "${PORT:=4420}" "${KPORT:=4421}"
: "${DPORT:=8009}" "${LPORT:=4422}"
: "${NQN:=nqn.2026-11.org.blockwire:rdma-test}" "${KNQN:=nqn.2026-11.org.linux:nvmet-rdma}"
: "${HOSTNQN:=nqn.2026-11.org.blockwire:kernel-vm}"
A=10.0.2.15
step() { echo "RDMA-STEP: $*"; }
ok() { echo "RDMA-OK: $*"; }
die() {
  echo "RDMA-FAIL: $*"
  dmesg | grep -i -E 'nvme|rdma|rxe' | tail -30
  [ -f /tmp/serve.log ] && tail -40 /tmp/serve.log
  exit 1
}

step "soft-RoCE on eth0"
modprobe rdma_rxe || die "no rdma_rxe module"
modprobe rdma_ucm || true
modprobe ib_uverbs || true
rdma link add rxe0 type rxe netdev eth0 || die "rdma link add"
ibv_devices | grep -q rxe0 || die "rxe0 not listed by ibv_devices"
ok "rxe0 on eth0 ($A)"
if [ -n "$PROBE_LAB" ]; then $PROBE_LAB || die "the lab's RDMA rule"; fi

connect_bw() {
  out=$(fabrics_connect "transport=rdma,traddr=$A,trsvcid=$PORT,nqn=$NQN,hostnqn=$HOSTNQN") || die "nvme-rdma connect"
  inst=$(instance_of "$out"); [ -n "$inst" ] || die "no instance in '$out'"
  [ "$(cat /sys/class/nvme/nvme$inst/transport)" = "rdma" ] || die "transport is not rdma"
  dev=$(wait_blockdev nvme$inst) || die "no namespace block device for nvme$inst"
}

# start_bw CONFIG LOG: blockwire serve in the background (pid in BW_PID),
# once it listens on RDMA.
start_bw() {
  "$BW" serve --config "$1" --control none -v >"$2" 2>&1 &
  BW_PID=$!
  i=0
  while ! grep -q "on rdma" "$2" && [ $i -lt 150 ]; do sleep 0.2; i=$((i + 1)); done
  grep -q "on rdma" "$2" || { cat "$2"; die "blockwire ($1) did not start listening"; }
}

step "blockwire serve --nvme-rdma"
cat >/tmp/bw.toml <<EOF
[[volume]]
name = "d0"
backend = "ram:192M"
[nvme]
rdma_listen = ["$A:$PORT"]
discovery_listen = "$A:$DPORT"
[[nvme.subsystem]]
nqn = "$NQN"
namespaces = [{ nsid = 1, volume = "d0" }]
allowed_hosts = ["$HOSTNQN"]
[[nvme.subsystem.host]]
nqn = "$HOSTNQN.auth"
dhchap_secret = "$AUTH_KEY"
dhchap_ctrl_secret = "$AUTH_CTRL_KEY"
EOF
start_bw /tmp/bw.toml /tmp/serve.log
SERVE=$BW_PID
ok "blockwire listens on $A:$PORT (rdma)"

step "Linux nvme-rdma host: connect, ext4, checksummed tree"
modprobe nvme-rdma || die "no nvme-rdma module"
connect_bw
echo "controller nvme$inst ($out) namespace $dev"
mkfs.ext4 -q -F $dev || die "mkfs.ext4"
mkdir -p /mnt/t
mount -t ext4 $dev /mnt/t || die "mount"
for d in a b c; do
  mkdir -p /mnt/t/$d/deep
  for i in 1 2 3 4 5 6; do
    dd if=/dev/urandom of=/mnt/t/$d/f$i bs=1k count=$((i * 13)) 2>/dev/null
    dd if=/dev/urandom of=/mnt/t/$d/deep/s$i bs=100 count=$i 2>/dev/null
  done
done
dd if=/dev/urandom of=/mnt/t/big bs=1M count=6 2>/dev/null
(cd /mnt/t && find . -type f | sort | xargs sha256sum) >/tmp/sums
umount /mnt/t
e2fsck -fn $dev || die "e2fsck -fn found problems"
ok "ext4 mkfs, checksummed tree, e2fsck -fn clean"
disconnect nvme$inst
connect_bw
mount -t ext4 $dev /mnt/t || die "mount after reconnect"
(cd /mnt/t && sha256sum -c -s /tmp/sums) || die "checksums differ after reconnect"
ok "checksums match after a reconnect"

if [ -n "$PROBE" ]; then
  step "bad input on other queues"
  BW_RDMA_TARGET="$A:$PORT" BW_RDMA_NQN="$NQN" BW_RDMA_HOSTNQN="$HOSTNQN" $PROBE || die "bad-input probe"
  kill -0 $SERVE || die "blockwire died"
  sync
  (cd /mnt/t && sha256sum -c -s /tmp/sums) || die "checksums differ after the bad input"
  dd if=/dev/urandom of=/mnt/t/after bs=64k count=16 2>/dev/null || die "write after the bad input"
  sync
  echo 3 >/proc/sys/vm/drop_caches
  (cd /mnt/t && sha256sum -c -s /tmp/sums) || die "checksums differ after drop_caches"
  ok "the Linux host's queues carried on"
fi
umount /mnt/t
e2fsck -fn $dev || die "e2fsck -fn at the end"
disconnect nvme$inst
ok "disconnect"

step "discovery lists the RDMA port"
# One entry, the RDMA port, in the log read over TCP ($DPORT) and over RDMA.
check_rdma_entry() {
  echo "$1" | grep -q "trtype: *rdma" || die "$2: no rdma entry"
  echo "$1" | grep -q "traddr: *$A" || die "$2: no traddr $A"
  echo "$1" | grep -q "trsvcid: *$PORT" || die "$2: no trsvcid $PORT"
  echo "$1" | grep -q "subnqn: *$NQN" || die "$2: no subnqn"
  echo "$1" | grep -q "adrfam: *ipv4" || die "$2: adrfam is not ipv4"
  echo "$1" | grep -q "rdma_qptype: *connected" || die "$2: rdma_qptype is not connected"
  echo "$1" | grep -q "rdma_prtype: *not specified" || die "$2: rdma_prtype is not 'not specified'"
  echo "$1" | grep -q "rdma_cms: *rdma-cm" || die "$2: rdma_cms is not rdma-cm"
  if echo "$1" | grep -q "trtype: *tcp"; then die "$2: a tcp entry, with no NVMe/TCP port"; fi
}
out=$(nvme discover -t tcp -a $A -s $DPORT -q $HOSTNQN 2>&1) || die "nvme discover -t tcp: $out"
echo "$out"
check_rdma_entry "$out" "discovery over tcp"
out=$(nvme discover -t rdma -a $A -s $PORT -q $HOSTNQN 2>&1) || die "nvme discover -t rdma: $out"
check_rdma_entry "$out" "discovery over rdma"
ok "nvme discover (tcp $DPORT and rdma $PORT) lists the RDMA port"
# Over RDMA: nvme-cli connects only to entries of the discovery
# controller's own transport.
nvme connect-all -t rdma -a $A -s $PORT -q $HOSTNQN || die "nvme connect-all"
inst=
for c in /sys/class/nvme/nvme*; do
  [ "$(cat $c/subsysnqn 2>/dev/null)" = "$NQN" ] || continue
  inst=${c##*/nvme}
done
[ -n "$inst" ] || die "connect-all made no controller for $NQN"
[ "$(cat /sys/class/nvme/nvme$inst/transport)" = "rdma" ] || die "connect-all did not use rdma"
dev=$(wait_blockdev nvme$inst) || die "no namespace block device after connect-all"
e2fsck -fn $dev || die "e2fsck -fn after connect-all"
disconnect nvme$inst
ok "nvme connect-all connects over rdma through the discovery log"

step "admission limits on RDMA queues"
cat >/tmp/bw2.toml <<EOF2
[[volume]]
name = "d1"
backend = "ram:16M"
[limits]
max_sessions = 1
max_pending_logins = 2
login_timeout_s = 10
[nvme]
rdma_listen = ["$A:$LPORT"]
[[nvme.subsystem]]
nqn = "$NQN"
namespaces = [{ nsid = 1, volume = "d1" }]
allowed_hosts = ["$HOSTNQN", "$HOSTNQN.second"]
EOF2
start_bw /tmp/bw2.toml /tmp/serve2.log
SERVE2=$BW_PID
# One I/O queue: its connection waits for its Connect (max_pending_logins 2).
out=$(fabrics_connect "transport=rdma,traddr=$A,trsvcid=$LPORT,nqn=$NQN,hostnqn=$HOSTNQN,nr_io_queues=1") || die "first host on the limited target"
inst=$(instance_of "$out"); [ -n "$inst" ] || die "no instance in '$out'"
if fabrics_connect "transport=rdma,traddr=$A,trsvcid=$LPORT,nqn=$NQN,hostnqn=$HOSTNQN.second" >/dev/null 2>&1; then
  die "a second host connected past max_sessions 1"
fi
grep -q "max_sessions" /tmp/serve2.log || die "no max_sessions refusal in the target's log"
ok "a second host over max_sessions refused"
if fabrics_connect "transport=rdma,traddr=$A,trsvcid=$LPORT,nqn=$NQN,hostnqn=nqn.2026-11.org.example:stranger" >/dev/null 2>&1; then
  die "a host not on the allow-list connected"
fi
grep -q "stranger is not allowed" /tmp/serve2.log || die "no allow-list refusal in the target's log"
ok "a host not on the allow-list refused"
if [ -n "$PROBE_LIMITS" ]; then
  BW_RDMA_TARGET="$A:$LPORT" $PROBE_LIMITS || die "admission probe"
fi
wait_blockdev nvme$inst >/dev/null || die "the first host lost its namespace"
disconnect nvme$inst
kill -0 $SERVE2 || die "the limited blockwire died"
kill $SERVE2
grep -E "refused|closed:" /tmp/serve2.log | sed 's/^/TARGET2-LOG: /'

step "kernel nvmet-rdma target, blockwire initiator"
modprobe nvmet-rdma || die "no nvmet-rdma module"
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
dd if=/dev/zero of=/tmp/knvmet.img bs=1M count=0 seek=64 2>/dev/null
S=/sys/kernel/config/nvmet/subsystems/$KNQN
mkdir $S
echo 1 > $S/attr_allow_any_host
mkdir $S/namespaces/1
echo -n /tmp/knvmet.img > $S/namespaces/1/device_path
echo 1 > $S/namespaces/1/buffered_io
echo 1 > $S/namespaces/1/enable || die "nvmet namespace enable"
P=/sys/kernel/config/nvmet/ports/1
mkdir $P
echo rdma > $P/addr_trtype
echo ipv4 > $P/addr_adrfam
echo $A > $P/addr_traddr
echo $KPORT > $P/addr_trsvcid
ln -s $S $P/subsystems/$KNQN || die "nvmet port link"
"$BW" verify "nvme+rdma://$A:$KPORT/$KNQN/1" --size 16M || die "blockwire verify against nvmet-rdma"
ok "blockwire verify against the kernel's nvmet-rdma"
"$BW" verify "nvme+rdma://$A:$PORT/$NQN/1" --size 8M --initiator-name "$HOSTNQN" || die "blockwire verify against blockwire"
ok "blockwire verify against blockwire over rdma"
# DH-HMAC-CHAP on every RDMA queue (both ways), with blockwire's initiator
# (this kernel, 6.1, has no NVMe in-band authentication of its own).
BLOCKWIRE_DHCHAP_SECRET="$AUTH_KEY" BLOCKWIRE_DHCHAP_CTRL_SECRET="$AUTH_CTRL_KEY" \
  "$BW" verify "nvme+rdma://$A:$PORT/$NQN/1" --size 4M --queues 2 --initiator-name "$HOSTNQN.auth" || die "verify with DH-HMAC-CHAP over rdma"
grep -q "$HOSTNQN.auth authenticated (DH-HMAC-CHAP .*bidirectional)" /tmp/serve.log || die "the target logged no bidirectional authentication"
if BLOCKWIRE_DHCHAP_SECRET="$AUTH_BAD_KEY" "$BW" verify "nvme+rdma://$A:$PORT/$NQN/1" --size 1M --initiator-name "$HOSTNQN.auth" >/tmp/badauth 2>&1; then
  die "verify with a wrong DH-HMAC-CHAP secret succeeded"
fi
grep -q "authentication of $HOSTNQN.auth failed" /tmp/serve.log || die "the target logged no failed authentication: $(cat /tmp/badauth)"
if "$BW" verify "nvme+rdma://$A:$PORT/$NQN/1" --size 1M --initiator-name "$HOSTNQN.auth" >/tmp/noauth 2>&1; then
  die "verify without the DH-HMAC-CHAP secret succeeded"
fi
ok "DH-HMAC-CHAP over rdma: both ways with the secrets, refused with a wrong one or none"
kill $SERVE
# How the target saw each queue end (the test checks the reasons).
grep -E "refused|closed:|torn down" /tmp/serve.log | sed 's/^/TARGET-LOG: /'
echo RDMA-ALL-OK
