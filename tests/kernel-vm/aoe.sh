# Guest side of the Linux aoe driver test (run by kernel-vm with --tap; the
# host serves e1.1 on the tap with `blockwire serve --aoe TAP,...`).
# 8 MiB O_DIRECT write + read back + compare, then ext4: mkfs, mount,
# write a file, umount, e2fsck -fn must be clean.
set -e
modprobe aoe aoe_iflist=eth1
ip link set eth1 up
D=/dev/etherd/e1.1
i=0
while [ ! -b "$D" ]; do
  i=$((i + 1))
  [ $i -le 60 ] || { echo "AOE: $D never appeared"; ls -l /dev/etherd || true; cat /dev/etherd/err 2>/dev/null & sleep 1; exit 1; }
  echo 1 > /dev/etherd/discover 2>/dev/null || true
  sleep 1
done
echo "AOE: found $D, $(cat /sys/block/etherd!e1.1/size) sectors"
# Linux reads the size from IDENTIFY words 100-103: 64 MiB = 131072 sectors.
[ "$(cat /sys/block/etherd!e1.1/size)" = 131072 ]
dd if=/dev/urandom of=/tmp/pattern bs=1M count=8 2>/dev/null
dd if=/tmp/pattern of="$D" bs=1M count=8 oflag=direct 2>/dev/null
dd if="$D" of=/tmp/back bs=1M count=8 iflag=direct 2>/dev/null
cmp /tmp/pattern /tmp/back
echo "AOE: 8 MiB O_DIRECT write/read back matches"
mkfs.ext4 -q -F "$D"
mkdir -p /mnt/aoe
mount -t ext4 "$D" /mnt/aoe
echo "hello from the kernel aoe driver" > /mnt/aoe/hello.txt
dd if=/tmp/pattern of=/mnt/aoe/data bs=1M count=2 2>/dev/null
sync
umount /mnt/aoe
e2fsck -fn "$D"
echo "AOE-KERNEL-OK"
