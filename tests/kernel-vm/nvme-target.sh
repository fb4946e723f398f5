# Guest script for crates/cli/tests/integration/nvme_nvmet.rs: the kernel's own NVMe/TCP
# target (nvmet-tcp, configured through configfs) for blockwire's initiator
# on the host, reached through a qemu hostfwd to guest port 4420. The guest
# stays up until the host connects with host NQN $DONE (or a deadline).
: "${NQN:=nqn.2026-11.org.blockwire:nvmet}" "${DONE:=nqn.2026-11.org.blockwire:host-done}" "${LIMIT:=600}"
die() { echo "NVMET-FAIL: $*"; exit 1; }
modprobe nvmet 2>/dev/null || modprobe nvmet || die "no nvmet module"
modprobe nvmet-tcp 2>/dev/null || modprobe nvmet_tcp || die "no nvmet-tcp module"
grep -q " /sys/kernel/config " /proc/mounts || mount -t configfs none /sys/kernel/config || die "configfs"
# 64 MiB backing file on the guest's tmpfs; nvmet serves it with buffered I/O.
dd if=/dev/zero of=/tmp/disk bs=1M count=64 2>/dev/null
S=/sys/kernel/config/nvmet/subsystems/$NQN
mkdir $S || die "mkdir subsystem"
echo 1 > $S/attr_allow_any_host
mkdir $S/namespaces/1
echo -n /tmp/disk > $S/namespaces/1/device_path
echo 1 > $S/namespaces/1/buffered_io 2>/dev/null || true
echo 1 > $S/namespaces/1/enable || die "enable namespace"
P=/sys/kernel/config/nvmet/ports/1
mkdir $P
echo tcp > $P/addr_trtype
echo ipv4 > $P/addr_adrfam
echo 0.0.0.0 > $P/addr_traddr
echo 4420 > $P/addr_trsvcid
ln -s $S $P/subsystems/$NQN || die "link subsystem to port"
echo "NVMET-READY"
i=0
while [ $i -lt $LIMIT ]; do
  if dmesg | grep -q "$DONE"; then echo "NVMET-DONE"; exit 0; fi
  sleep 1; i=$((i + 1))
done
die "host never signalled completion"
