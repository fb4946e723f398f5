#!/bin/sh
# Inside the kernel VM: mount nfs-ganesha's export (on the host, reached over
# eth1, a tap in ganesha's namespace) with the kernel's NFS client, NFSv3 and
# NFSv4.1, and run one file workload on it (blockwire flowop varmail, given
# with --with; the test prepends BLOCKWIRE=PATH). A file written over v3 must read back the same over v4.1.
set -e
SERVER=10.254.80.1
ip link set eth1 up
ip addr add 10.254.80.2/30 dev eth1
for m in nfs nfsv3 nfsv4; do modprobe $m; done
mkdir -p /mnt/v3 /mnt/v41
# nolock: NFSv3 locking needs rpc.statd on both sides; nothing here locks.
mount.nfs $SERVER:/bwlab-nfs /mnt/v3 -o vers=3,proto=tcp,nolock
echo "mounted NFSv3"
mount.nfs $SERVER:/bwlab-nfs /mnt/v41 -o vers=4.1
echo "mounted NFSv4.1"
grep ' nfs' /proc/mounts
dd if=/dev/urandom of=/mnt/v3/probe bs=64k count=64 2>/dev/null
sync
a=$(md5sum < /mnt/v3/probe)
b=$(md5sum < /mnt/v41/probe)
[ "$a" = "$b" ] || { echo "probe differs between v3 and v4.1: $a $b"; exit 1; }
echo "probe written over v3 reads back the same over v4.1"
mkdir -p /mnt/v41/mail
"${BLOCKWIRE:?the test sets BLOCKWIRE, the binary it passes with --with}" flowop varmail /mnt/v41/mail --runtime 2
umount /mnt/v41
umount /mnt/v3
echo NFS-KERNEL-OK
