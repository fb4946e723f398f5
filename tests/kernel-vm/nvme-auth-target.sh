# Guest script for crates/cli/tests/integration/nvme_auth.rs: the kernel's own
# NVMe/TCP target (nvmet-tcp, Linux 6.12 with CONFIG_NVME_TARGET_AUTH) requiring
# DH-HMAC-CHAP, for blockwire's initiator on the host through a qemu hostfwd to
# guest port 4420. The test prepends NQN, DONE and, per host, the NQN, keys,
# hash and DH group:
#   H1: K1 + controller key C1 (bidirectional), hmac(sha512), ffdhe4096
#   H2: K2 only, hmac(sha384), null group
# The guest stays up until the host connects with host NQN $DONE.
: "${LIMIT:=600}"
die() { echo "NVMET-FAIL: $*"; exit 1; }
modprobe nvmet 2>/dev/null || modprobe nvmet || die "no nvmet module"
modprobe nvmet-tcp 2>/dev/null || modprobe nvmet_tcp || die "no nvmet-tcp module"
grep -q " /sys/kernel/config " /proc/mounts || mount -t configfs none /sys/kernel/config || die "configfs"
dd if=/dev/zero of=/tmp/disk bs=1M count=64 2>/dev/null
N=/sys/kernel/config/nvmet
S=$N/subsystems/$NQN
mkdir $S || die "mkdir subsystem"
echo 0 > $S/attr_allow_any_host
mkdir $S/namespaces/1
echo -n /tmp/disk > $S/namespaces/1/device_path
echo 1 > $S/namespaces/1/buffered_io 2>/dev/null || true
echo 1 > $S/namespaces/1/enable || die "enable namespace"
# host NQN, host key, controller key (or -), hash, DH group
add_host() {
  mkdir $N/hosts/$1 || die "mkdir host $1"
  [ -e $N/hosts/$1/dhchap_key ] || die "nvmet has no dhchap_key (CONFIG_NVME_TARGET_AUTH)"
  echo -n "$2" > $N/hosts/$1/dhchap_key || die "dhchap_key of $1"
  [ "$3" = - ] || { echo -n "$3" > $N/hosts/$1/dhchap_ctrl_key || die "dhchap_ctrl_key of $1"; }
  echo -n "$4" > $N/hosts/$1/dhchap_hash || die "dhchap_hash $4"
  echo -n "$5" > $N/hosts/$1/dhchap_dhgroup || die "dhchap_dhgroup $5"
  ln -s $N/hosts/$1 $S/allowed_hosts/$1 || die "allow $1"
}
add_host "$H1" "$K1" "$C1" "hmac(sha512)" ffdhe4096
add_host "$H2" "$K2" - "hmac(sha384)" null
P=$N/ports/1
mkdir $P
echo tcp > $P/addr_trtype
echo ipv4 > $P/addr_adrfam
echo 0.0.0.0 > $P/addr_traddr
echo 4420 > $P/addr_trsvcid
ln -s $S $P/subsystems/$NQN || die "link subsystem to port"
echo "NVMET-READY"
i=0
while [ $i -lt $LIMIT ]; do
  if dmesg | grep -q "$DONE"; then
    dmesg | grep -i "nvmet" | grep -i "auth\|fail\|mismatch" | tail -20
    echo "NVMET-DONE"; exit 0
  fi
  sleep 1; i=$((i + 1))
done
die "host never signalled completion"
