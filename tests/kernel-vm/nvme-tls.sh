# Guest script for crates/cli/tests/integration/nvme_tls.rs
# (linux_host_and_nvmet_over_tls; after the helpers of nvme-host-lib.sh,
# which the test puts in front): NVMe/TCP over TLS 1.3 (TP 8011) between
# Linux 6.12 (tests/kernel-vm/kernel-6.12.sh) and blockwire, in ONE boot:
#   A. the Linux host (nvme-cli 2.13, tlshd, the kernel's TLS records) against
#      `blockwire serve` on the host (user-space record layer there: the
#      host's kernel has no kTLS): connect --tls, ext4 made, written, fsck
#      clean; connect-all from the discovery log; DH-HMAC-CHAP inside TLS;
#      a wrong PSK refused and the target still serving; plaintext refused
#      on the TLS-required port; a SHA-384 PSK (NVMeTLSkey-1:02), which this
#      tlshd binds with SHA-256 (TLS_CHACHA20_POLY1305_SHA256 results);
#   B. `blockwire serve` inside the guest with kTLS (tls_records = "kernel")
#      and the guest's own Linux host connecting to it over TLS (the SHA-384
#      PSK's host too: ChaCha20-Poly1305 on kTLS);
#   C. secure channel concatenation (--concat): what this kernel offers;
#   D. the kernel's nvmet requiring TLS on guest port 4430 for blockwire's
#      initiator on the host (qemu hostfwd), a SHA-384 PSK from the guest's
#      Linux host to it; then the host's `blockwire lab --tls on` over ssh
#      (nvmet and blockwire serve set up by the lab); the guest stays up
#      until the host connects with host NQN $DONE to the plaintext port 4431.
# The test prepends: PORT (host serve, TLS required), NQN, H1/K1 (TLS),
# H2/K2/D2 (TLS + DH-HMAC-CHAP secret D2), H3/K3 (the target has K3, the
# guest is given BAD), H5/K5 (a SHA-384 PSK), BW (blockwire in the guest), TNQN/TH/TK (nvmet's
# subsystem, host and PSK), TH5 (nvmet's host with K5), DONE. The host's
# KPORT reaches the second guest serve (B, port 4424, kTLS). Runs under `sh -e` (busybox).
: "${LIMIT:=600}"
T=10.0.2.2
DISC=nqn.2014-08.org.nvmexpress.discovery
PATH=/opt/trixie/bin:$PATH
step() { echo "TLS-STEP: $*"; }
ok() { echo "TLS-OK: $*"; }
die() { echo "TLS-FAIL: $*"; dmesg | grep -i "nvme\|tls" | tail -30; cat /tmp/tlshd.log 2>/dev/null | tail -20; exit 1; }

modprobe nvme-tcp 2>/dev/null || modprobe nvme_tcp || die "no nvme-tcp module"
modprobe nvme-auth 2>/dev/null || true
modprobe tls || die "no tls module (kTLS)"
[ -e /proc/net/tls_stat ] || die "no /proc/net/tls_stat after modprobe tls"
command -v tlshd >/dev/null || die "no tlshd in the image (tests/kernel-vm/vm trixie_tools)"
nvme connect --help 2>&1 | grep -q -- "--tls " || die "$(nvme version | head -1) has no --tls"
echo "kernel $(uname -r), $(nvme version | head -1), $(tlshd --version 2>&1 | head -1)"
echo "fabrics options: $(cat /dev/nvme-fabrics 2>&1)"

# tlshd does the kernel's handshakes with the PSKs of the .nvme keyring.
printf '[debug]\nloglevel=2\ntls=0\nnl=0\n[authenticate]\nkeyrings=.nvme\n' > /etc/tlshd.conf
tlshd -s -c /etc/tlshd.conf >/tmp/tlshd.log 2>&1 &
sleep 1

# insert KEY HOSTNQN SUBNQN: the retained PSK into the .nvme keyring, as
# `nvme check-tls-key --insert` derives it.
insert() {
  nvme check-tls-key --insert --keyring=.nvme --hostnqn="$2" --subsysnqn="$3" --keydata="$1" >/tmp/ins 2>&1 \
    || die "nvme check-tls-key --insert for $2 $3: $(cat /tmp/ins)"
  echo "inserted: $(tr '\n' ' ' </tmp/ins)"
}

# the controller's TLS as sysfs says (tls_key, tls_configured_key, tls_keyring)
tls_of() { for f in tls_key tls_configured_key tls_keyring; do [ -e /sys/class/nvme/$1/$f ] && printf '%s=%s ' $f "$(cat /sys/class/nvme/$1/$f)"; done; echo; }

# ext4 on DEV: made, a file written and read back, fsck clean.
ext4_round() {
  mkfs.ext4 -q -F $1 >/tmp/mkfs 2>&1 || die "mkfs.ext4 $1: $(cat /tmp/mkfs)"
  mkdir -p /mnt/t && mount -t ext4 $1 /mnt/t || die "mount $1"
  dd if=/dev/urandom of=/tmp/pat bs=1M count=4 2>/dev/null
  cp /tmp/pat /mnt/t/pat && sync && umount /mnt/t || die "write on $1"
  mount -t ext4 $1 /mnt/t && cmp /tmp/pat /mnt/t/pat || die "read back on $1"
  umount /mnt/t
  e2fsck -fn $1 >/tmp/fsck 2>&1 || die "fsck $1 not clean: $(cat /tmp/fsck)"
}

# connect ADDR PORT SUBNQN HOSTNQN [options]: nvme connect --tls; prints nvmeN
connect() {
  a=$1; p=$2; s=$3; h=$4; shift 4
  nvme connect -t tcp -a $a -s $p -n $s --hostnqn=$h --hostid=$(cat /proc/sys/kernel/random/uuid) "$@" >/tmp/conn 2>&1 && ctrl_of $h $s
}

# run_step F: F in a subshell; a failure is reported and the next steps run
# (the guest still ends with TLS-FAIL).
FAILED=""
run_step() { ( $1 ) || { echo "TLS-FAIL: $1"; FAILED="$FAILED $1"; }; }

# ---- A. the Linux host against blockwire serve on the host ----------------
step "A1 nvme connect --tls, ext4"
insert "$K1" $H1 $NQN
insert "$K1" $H1 $DISC
insert "$K2" $H2 $NQN
insert "$BAD" $H3 $NQN
insert "$K5" $H5 $NQN
keyctl show %:.nvme 2>&1 | sed 's/^/keyring: /' | head -10
c=$(connect $T $PORT $NQN $H1 --tls) || die "nvme connect --tls as $H1: $(cat /tmp/conn)"
dev=$(wait_blockdev $c) || die "no namespace on $c"
echo "controller $c: $(tls_of $c)"
nvme list-subsys 2>&1 | sed 's/^/list-subsys: /'
ext4_round $dev
disconnect $c
ok "nvme connect --tls, ext4 made, written, fsck clean, disconnected"

# connect-all runs in B: this log names the host's 127.0.0.1, which is
# the guest's own loopback here (qemu user networking).
step "A2 discovery log over TLS"
nvme discover -t tcp -a $T -s $PORT --hostnqn=$H1 --tls >/tmp/disc 2>&1 || die "nvme discover --tls: $(cat /tmp/disc)"
sed 's/^/discovery: /' /tmp/disc
grep -q "sectype: tls13" /tmp/disc || die "the discovery log does not say sectype tls13"
grep -q "treq:.*required" /tmp/disc || die "the discovery log does not say TLS is required"
ok "the discovery log says TLS 1.3 is required"

stepA3() {
step "A3 DH-HMAC-CHAP inside TLS"
dmesg -c >/dev/null
c=$(connect $T $PORT $NQN $H2 --tls --dhchap-secret="$D2" --nr-write-queues=1) || die "nvme connect --tls --dhchap-secret as $H2: $(cat /tmp/conn)"
dev=$(wait_blockdev $c) || die "no namespace on $c"
dmesg | grep -i authenticated || true
dmesg | grep -q "qid 0: authenticated" || die "the kernel did not log the admin queue's authentication"
ext4_round $dev
disconnect $c
ok "TLS with DH-HMAC-CHAP, ext4 fsck clean"

}
run_step stepA3

step "A4 wrong PSK, then the target still serves"
if nvme connect -t tcp -a $T -s $PORT -n $NQN --hostnqn=$H3 --tls >/tmp/conn 2>&1; then die "a wrong PSK connected"; fi
echo "wrong PSK: $(tr '\n' ' ' </tmp/conn)"
! ctrl_of $H3 $NQN >/dev/null || die "a controller is left for the wrong PSK"
c=$(connect $T $PORT $NQN $H1 --tls) || die "nvme connect --tls as $H1: $(cat /tmp/conn)"
disconnect $c
ok "wrong PSK refused, the next host served"

step "A5 plaintext on the TLS-required port"
if nvme connect -t tcp -a $T -s $PORT -n $NQN --hostnqn=$H1 >/tmp/conn 2>&1; then die "plaintext connected"; fi
echo "plaintext: $(tr '\n' ' ' </tmp/conn)"
ok "plaintext refused on the TLS-required port"

# rw_round DEV: 1 MiB written at 1 MiB and read back, direct
rw_round() {
  dd if=/dev/urandom of=/tmp/pat1 bs=1M count=1 2>/dev/null
  dd if=/tmp/pat1 of=$1 bs=1M seek=1 count=1 oflag=direct 2>/dev/null || die "write on $1"
  dd if=$1 of=/tmp/back1 bs=1M skip=1 count=1 iflag=direct 2>/dev/null || die "read on $1"
  cmp /tmp/pat1 /tmp/back1 || die "read back on $1 differs"
}

# tlshd 1.0 (GnuTLS credentials without a hash) binds a SHA-384 PSK with
# SHA-256 and offers TLS_AES_256_GCM_SHA384 and
# TLS_CHACHA20_POLY1305_SHA256: the target must pick the latter.
stepA6() {
step "A6 a SHA-384 PSK"
c=$(connect $T $PORT $NQN $H5 --tls) || die "nvme connect --tls with a SHA-384 PSK as $H5: $(cat /tmp/conn)"
dev=$(wait_blockdev $c) || die "no namespace on $c"
echo "controller $c: $(tls_of $c)"
rw_round $dev
disconnect $c
ok "a SHA-384 PSK connects, 1 MiB written and read back"
}
run_step stepA6

# ---- B. blockwire serve in the guest, kTLS records ------------------------
stepB() {
step "B kTLS: blockwire serve in the guest"
mkdir -p /tmp/bw && cat > /tmp/bw/serve.toml <<EOF
[[volume]]
name = "g0"
backend = "ram:64M"
[nvme]
listen = ["127.0.0.1:4421"]
tls = "required"
[[nvme.subsystem]]
nqn = "$NQN"
namespaces = [{ nsid = 1, volume = "g0" }]
[[nvme.subsystem.host]]
nqn = "$H1"
tls_psk = "$K1"
[[nvme.subsystem.host]]
nqn = "$H5"
tls_psk = "$K5"
[tuning]
tls_records = "kernel"
EOF
$BW serve --config /tmp/bw/serve.toml --control /tmp/bw/ctl.sock -v >/tmp/bw/serve.log 2>&1 &
BWPID=$!
i=0; while [ ! -S /tmp/bw/ctl.sock ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
[ -S /tmp/bw/ctl.sock ] || { cat /tmp/bw/serve.log; die "guest serve did not start"; }
c=$(connect 127.0.0.1 4421 $NQN $H1 --tls) || die "nvme connect --tls to the guest serve: $(cat /tmp/conn)"
dev=$(wait_blockdev $c) || die "no namespace on $c"
ext4_round $dev
$BW ctl --control /tmp/bw/ctl.sock --json session_list >/tmp/bw/sl 2>&1 || die "session_list: $(cat /tmp/bw/sl)"
echo "guest session_list: $(cat /tmp/bw/sl)"
grep -q '"tls": *"TLS_AES_[0-9]*_GCM_SHA[0-9]* ktls"' /tmp/bw/sl || die "the guest serve's session is not on kTLS"
sed 's/^/tls_stat: /' /proc/net/tls_stat
disconnect $c
c=$(connect 127.0.0.1 4421 $NQN $H5 --tls) || die "nvme connect --tls with a SHA-384 PSK to the guest serve: $(cat /tmp/conn)"
dev=$(wait_blockdev $c) || die "no namespace on $c"
rw_round $dev
$BW ctl --control /tmp/bw/ctl.sock --json session_list >/tmp/bw/sl 2>&1 || die "session_list: $(cat /tmp/bw/sl)"
grep -q '"tls": *"TLS_CHACHA20_POLY1305_SHA256 ktls"' /tmp/bw/sl || die "the SHA-384 PSK's session is not ChaCha20-Poly1305 on kTLS: $(cat /tmp/bw/sl)"
disconnect $c
ok "a SHA-384 PSK on kTLS (ChaCha20-Poly1305)"
nvme connect-all -t tcp -a 127.0.0.1 -s 4421 --hostnqn=$H1 --tls >/tmp/ca 2>&1 || die "nvme connect-all --tls: $(cat /tmp/ca)"
c=$(ctrl_of $H1 $NQN) || die "connect-all made no controller for $NQN: $(cat /tmp/ca)"
dev=$(wait_blockdev $c) || die "no namespace on $c"
echo "connect-all: $c $(tls_of $c)"
nvme list-subsys 2>&1 | sed 's/^/list-subsys: /'
dd if=$dev of=/dev/null bs=1M count=4 iflag=direct 2>/dev/null || die "read on $c"
disconnect $c
ok "connect-all over TLS from the discovery log"
kill $BWPID; wait $BWPID 2>/dev/null || true
grep -i "tls" /tmp/bw/serve.log | sed 's/^/guest serve: /' | head -10
ok "kTLS record layer: Linux host to blockwire serve in the guest"
# The same serve on eth0 (qemu forwards the host's KPORT there), left
# running for the host's KeyUpdate on kTLS receive (checked in stepKU).
sed 's/127.0.0.1:4421/10.0.2.15:4424/' /tmp/bw/serve.toml > /tmp/bw/serve2.toml
$BW serve --config /tmp/bw/serve2.toml --control /tmp/bw/ctl2.sock -v >/tmp/bw/serve2.log 2>&1 &
echo $! > /tmp/bw/serve2.pid
i=0; while [ ! -S /tmp/bw/ctl2.sock ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
[ -S /tmp/bw/ctl2.sock ] || { cat /tmp/bw/serve2.log; die "the second guest serve did not start"; }
}
run_step stepB

# ---- C. secure channel concatenation --------------------------------------
step "C secure channel concatenation"
if grep -q concat /dev/nvme-fabrics 2>/dev/null; then
  echo "CONCAT: this kernel's host supports concat"
else
  echo "CONCAT: this kernel's host has no concat option (fabrics options lack it)"
fi

# ---- B2 (after the host's turn): a KeyUpdate on kTLS receive -------------
# The host's raw TLS client sent a KeyUpdate to the second guest serve
# (kTLS records) and saw the connection end, then verified as host 1. Linux
# 6.12's kTLS hands such a record only to a read with a control buffer
# (a plain read fails with EIO): serve's log must say it was a KeyUpdate.
stepKU() {
step "B2 KeyUpdate on kTLS receive"
pid=$(cat /tmp/bw/serve2.pid) || die "no second guest serve"
kill -0 $pid 2>/dev/null || die "the second guest serve is gone: $(tail -5 /tmp/bw/serve2.log)"
grep -i "keyupdate\|ended\|records" /tmp/bw/serve2.log | sed 's/^/guest serve 2: /' | head -10
grep -q "records ktls" /tmp/bw/serve2.log || die "the host's connections to the second guest serve were not on kTLS"
grep -q "KeyUpdate is not supported on kTLS receive" /tmp/bw/serve2.log || die "the guest serve's log does not say the connection ended for a KeyUpdate"
kill $pid; wait $pid 2>/dev/null || true
ok "a KeyUpdate on kTLS receive ends that connection, the log says why"
}

# ---- D. nvmet requiring TLS, for blockwire's initiator on the host --------
# (guest ports 4430 and 4431: the lab's run over ssh, below, takes 4420,
# 4422 and 8009 on eth0.)
step "D nvmet over TLS"
modprobe nvmet 2>/dev/null || modprobe nvmet || die "no nvmet module"
modprobe nvmet-tcp 2>/dev/null || modprobe nvmet_tcp || die "no nvmet-tcp module"
grep -q " /sys/kernel/config " /proc/mounts || mount -t configfs none /sys/kernel/config || die "configfs"
dd if=/dev/zero of=/tmp/disk bs=1M count=32 2>/dev/null
N=/sys/kernel/config/nvmet
S=$N/subsystems/$TNQN
mkdir $S || die "mkdir subsystem"
echo 0 > $S/attr_allow_any_host
mkdir $S/namespaces/1
echo -n /tmp/disk > $S/namespaces/1/device_path
echo 1 > $S/namespaces/1/buffered_io 2>/dev/null || true
echo 1 > $S/namespaces/1/enable || die "enable namespace"
for h in $TH $TH5 $DONE; do mkdir $N/hosts/$h && ln -s $N/hosts/$h $S/allowed_hosts/$h || die "host $h"; done
insert "$TK" $TH $TNQN
insert "$K5" $TH5 $TNQN
P=$N/ports/1
mkdir $P
echo tcp > $P/addr_trtype
echo ipv4 > $P/addr_adrfam
echo 0.0.0.0 > $P/addr_traddr
echo 4430 > $P/addr_trsvcid
[ -e $P/addr_tsas ] || die "nvmet has no addr_tsas (CONFIG_NVME_TARGET_TCP_TLS)"
echo tls1.3 > $P/addr_tsas || die "addr_tsas tls1.3"
echo required > $P/addr_treq || die "addr_treq required"
echo "port: tsas=$(cat $P/addr_tsas) treq=$(cat $P/addr_treq)"
ln -s $S $P/subsystems/$TNQN || die "link subsystem to port"
# port 2 (4431) is plaintext: the host's done signal comes there
P2=$N/ports/2
mkdir $P2
echo tcp > $P2/addr_trtype; echo ipv4 > $P2/addr_adrfam
echo 0.0.0.0 > $P2/addr_traddr; echo 4431 > $P2/addr_trsvcid
ln -s $S $P2/subsystems/$TNQN || die "link subsystem to port 2"
# A SHA-384 PSK between the guest's Linux host and nvmet: tlshd makes
# both ends' handshakes (client and server); what they agree on is in
# tlshd's session descriptions.
stepD384() {
step "D2 a SHA-384 PSK, Linux host to nvmet (tlshd on both ends)"
n0=$(wc -l < /tmp/tlshd.log)
c=$(connect 127.0.0.1 4430 $TNQN $TH5 --tls) || die "nvme connect --tls with a SHA-384 PSK to nvmet: $(cat /tmp/conn)"
dev=$(wait_blockdev $c) || die "no namespace on $c"
echo "controller $c: $(tls_of $c)"
rw_round $dev
disconnect $c
tail -n +$((n0 + 1)) /tmp/tlshd.log | sed 's/^/tlshd (D2): /'
ok "a SHA-384 PSK from the Linux host to nvmet: $(tail -n +$((n0 + 1)) /tmp/tlshd.log | grep -o 'Session description: [^ ]*' | sort -u | tr '\n' ' ')"
}
run_step stepD384
# The host's `blockwire lab --tls on` comes over ssh (dropbear, KVM_SSH_KEY)
# as to a user's server: Debian 13's nvme-cli, tlshd and keyctl where a
# server has them, and bash as sh (as tests/kernel-vm users of the lab do).
for p in nvme tlshd keyctl; do
  for d in /usr/sbin /bin; do [ -e $d/$p ] && ln -sf /opt/trixie/bin/$p $d/$p; done
  ln -sf /opt/trixie/bin/$p /sbin/$p
done
ln -sf bash /bin/sh
[ -z "$FAILED" ] || echo "TLS-FAILED-STEPS:$FAILED"
echo "NVMET-READY"
i=0
while [ $i -lt $LIMIT ]; do
  if dmesg | grep -q "$DONE"; then
    dmesg | grep -i "nvmet" | tail -20
    sed 's/^/tlshd: /' /tmp/tlshd.log | tail -20
    run_step stepKU
    [ -z "$FAILED" ] || die "failed:$FAILED"
    echo "TLS-ALL-OK"; exit 0
  fi
  sleep 1; i=$((i + 1))
done
die "host never signalled completion"
