#!/bin/sh
# Guest side of crates/cli/tests/integration/iscsi_kernel.rs: Linux open-iscsi + iscsi_tcp
# against `blockwire serve --iscsi` on the host (reached as 10.0.2.2).
# The test substitutes @PORT@, @IQN@, @IQN_CHAP@, @USER@, @SECRET@,
# @MUSER@, @MSECRET@ and the discovery secrets @DUSER@, @DSECRET@, @DMUSER@,
# @DMSECRET@ before booting.
set -e
PORTAL=10.0.2.2:@PORT@
IQN=@IQN@
IQN_CHAP=@IQN_CHAP@
modprobe iscsi_tcp
modprobe sd_mod 2>/dev/null || true
modprobe ext4 2>/dev/null || true
iscsid
sleep 1

step() { echo "iscsi-guest: $*"; }

step "discovery without CHAP must be refused"
if iscsiadm -m discovery -t sendtargets -p $PORTAL > /tmp/disc0 2>&1; then
  cat /tmp/disc0; echo "iscsi-guest: discovery without CHAP succeeded"; exit 1
fi
step "discovery with mutual CHAP"
disc() { iscsiadm -m discoverydb -t sendtargets -p $PORTAL "$@"; }
disc -o new >/dev/null 2>&1 || true
disc -o update -n discovery.sendtargets.auth.authmethod -v CHAP
disc -o update -n discovery.sendtargets.auth.username -v @DUSER@
disc -o update -n discovery.sendtargets.auth.password -v @DSECRET@
disc -o update -n discovery.sendtargets.auth.username_in -v @DMUSER@
disc -o update -n discovery.sendtargets.auth.password_in -v @DMSECRET@
disc --discover > /tmp/disc
cat /tmp/disc
grep -q " $IQN\$" /tmp/disc
grep -q " $IQN_CHAP\$" /tmp/disc

# SendTargets lists the host's own address (127.0.0.1); the guest reaches it
# through 10.0.2.2, so make node records for that portal.
node() { iscsiadm -m node -T "$1" -p $PORTAL "$@"; }
disk_of() {
  # Wait for the SCSI disk of the session to appear; print its /dev name.
  for i in $(seq 1 50); do
    d=$(iscsiadm -m session -P 3 2>/dev/null | sed -n 's/.*Attached scsi disk \([a-z]*\).*/\1/p' | head -1)
    if [ -n "$d" ] && [ -b /dev/$d ]; then echo /dev/$d; return 0; fi
    sleep 0.2
  done
  return 1
}

step "login (no CHAP)"
iscsiadm -m node -o new -T $IQN -p $PORTAL >/dev/null
iscsiadm -m node -T $IQN -p $PORTAL --login
DEV=$(disk_of)
step "disk $DEV: $(cat /sys/block/${DEV#/dev/}/size) sectors"

step "writes need no R2T: ImmediateData=Yes, InitialR2T=No, FirstBurstLength >= 4096"
iscsiadm -m session -P 2 > /tmp/sess
grep -E "ImmediateData|InitialR2T|FirstBurstLength" /tmp/sess
grep -q "ImmediateData: Yes" /tmp/sess
grep -q "InitialR2T: No" /tmp/sess
[ "$(sed -n 's/.*FirstBurstLength: \([0-9]*\).*/\1/p' /tmp/sess | head -1)" -ge 4096 ]

step "O_DIRECT write/read/compare 8 MiB"
dd if=/dev/urandom of=/tmp/pattern bs=1M count=8 2>/dev/null
dd if=/tmp/pattern of=$DEV bs=1M count=8 oflag=direct 2>/dev/null
dd if=$DEV of=/tmp/back bs=1M count=8 iflag=direct 2>/dev/null
cmp /tmp/pattern /tmp/back
# Odd offset: 4 KiB blocks starting 3 blocks into the second MiB.
dd if=/tmp/pattern of=$DEV bs=4096 count=5 seek=259 oflag=direct 2>/dev/null
dd if=$DEV of=/tmp/back2 bs=4096 count=5 skip=259 iflag=direct 2>/dev/null
dd if=/tmp/pattern of=/tmp/want2 bs=4096 count=5 2>/dev/null
cmp /tmp/want2 /tmp/back2

step "ext4 mkfs + mount + write + fsck"
mkfs.ext4 -q -F $DEV
mkdir -p /mnt/t
mount -t ext4 $DEV /mnt/t
dd if=/tmp/pattern of=/mnt/t/file bs=1M count=8 2>/dev/null
sync
cmp /tmp/pattern /mnt/t/file
umount /mnt/t
e2fsck -fn $DEV
step "logout"
iscsiadm -m node -T $IQN -p $PORTAL --logout

step "login with mutual CHAP"
iscsiadm -m node -o new -T $IQN_CHAP -p $PORTAL >/dev/null
set_auth() { iscsiadm -m node -T $IQN_CHAP -p $PORTAL -o update -n "$1" -v "$2"; }
set_auth node.session.auth.authmethod CHAP
set_auth node.session.auth.username @USER@
set_auth node.session.auth.password WRONG-secret-x
step "wrong CHAP secret must be refused"
if iscsiadm -m node -T $IQN_CHAP -p $PORTAL --login; then
  echo "iscsi-guest: login with a wrong secret succeeded"; exit 1
fi
set_auth node.session.auth.password @SECRET@
set_auth node.session.auth.username_in @MUSER@
set_auth node.session.auth.password_in @MSECRET@
iscsiadm -m node -T $IQN_CHAP -p $PORTAL --login
DEV=$(disk_of)
dd if=/tmp/pattern of=$DEV bs=1M count=2 oflag=direct 2>/dev/null
dd if=$DEV of=/tmp/back3 bs=1M count=2 iflag=direct 2>/dev/null
dd if=/tmp/pattern of=/tmp/want3 bs=1M count=2 2>/dev/null
cmp /tmp/want3 /tmp/back3
iscsiadm -m node -T $IQN_CHAP -p $PORTAL --logout
step "ALL OK"
