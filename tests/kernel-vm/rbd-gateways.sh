# Guest script for crates/cli/tests/integration/rbd_gateways.rs: the Linux
# host against two `blockwire serve` gateways exporting one rbd image, in one
# boot, over each protocol:
#  1. NVMe/TCP with native multipath: one namespace, two paths; gateway A
#     reports ANA optimized, B non-optimized, and I/O follows that; A is
#     killed under writes (they go on through B, none lost), restarted
#     (the host reconnects and uses A again).
#  2. iSCSI through open-iscsi logins to both gateways: sg_inq (TPGS),
#     sg_vpd (relative target port, target port group, one LU) and sg_rtpg
#     (each gateway reports its own group and state).
#  3. AoE: shelf 7 slot 1 answered from two MACs on eth1; the aoe driver
#     keeps both as targets of one device; A killed under writes, they go
#     on through B.
# The test prepends PA, PB (NVMe ports), IA, IB (iSCSI ports), NQN, IQN,
# MACA, MACB (the gateways' AoE MACs, 12 hex digits) and CTL, a port on
# which the host test takes orders ("kill-a", "start-a") and answers
# "done ORDER" once carried out. Runs under `sh -e` with busybox, after
# tests/kernel-vm/failover-lib.sh.
: "${PA:=4420}" "${PB:=4421}" "${IA:=3260}" "${IB:=3261}" "${CTL:=9999}"
: "${NQN:=nqn.2026-11.org.blockwire:rbd-mp}" "${IQN:=iqn.2026-11.org.blockwire.test:rbd-mp}"
: "${MACA:=000000000000}" "${MACB:=000000000000}"
T=10.0.2.2
# step, ok, die, order and the writers with their ledgers: failover-lib.sh.

# ================= 1. NVMe/TCP: ANA and native multipath =================
modprobe nvme-tcp 2>/dev/null || modprobe nvme_tcp || die "no nvme-tcp module"
[ "$(cat /sys/module/nvme_core/parameters/multipath)" = Y ] || die "native NVMe multipath is off"
step "connect to both gateways"
connect_both_gateways
[ "$DEV" = "/dev/$(echo $PATHB | sed 's/c[0-9]*n/n/')" ] || die "the gateways' namespaces did not join one multipath head ($PATHA, $PATHB)"
[ -b $DEV ] || die "$DEV missing"
heads=$(ls /sys/block | grep -c '^nvme[0-9]*n[0-9]*$')
[ "$heads" = 1 ] || die "expected one multipath namespace, found $heads: $(ls /sys/block)"
nvme list-subsys
nvme list-subsys -o json > /tmp/subsys.json
[ "$(grep -c '"Name":"nvme[0-9]' /tmp/subsys.json)" = 2 ] || die "list-subsys does not show two paths: $(cat /tmp/subsys.json)"
echo "gateway A: $CA ($PATHA, cntlid $(cat /sys/class/nvme/$CA/cntlid)), gateway B: $CB ($PATHB, cntlid $(cat /sys/class/nvme/$CB/cntlid)), head $DEV"
ok "one multipath namespace $DEV with two paths"

[ "$(ana $PATHA)" = optimized ] || die "path A ANA state is '$(ana $PATHA)', not optimized"
[ "$(ana $PATHB)" = non-optimized ] || die "path B ANA state is '$(ana $PATHB)', not non-optimized"
nvme ana-log /dev/$CA > /tmp/ana.a || die "nvme ana-log on A"
nvme ana-log /dev/$CB > /tmp/ana.b || die "nvme ana-log on B"
grep -q "state.*:[[:space:]]*optimized" /tmp/ana.a && grep -q "state.*:[[:space:]]*non-optimized" /tmp/ana.b \
  || die "nvme ana-log: A says '$(grep state /tmp/ana.a)', B says '$(grep state /tmp/ana.b)'"
ok "ANA states: A optimized, B non-optimized (sysfs and nvme ana-log)"

wa=$(writes $PATHA); wb=$(writes $PATHB)
dd if=/dev/zero of=$DEV bs=4k count=20 seek=16000 oflag=direct 2>/dev/null || die "20 writes"
da=$(( $(writes $PATHA) - wa )); db=$(( $(writes $PATHB) - wb ))
echo "20 writes: $da on A, $db on B"
[ $da -ge 20 ] && [ $db = 0 ] || die "I/O did not follow ANA: $da writes on the optimized path, $db on the non-optimized one"
ok "I/O goes to the optimized path"

start_writers $DEV nvme 0
wait_acked 40
ok "writers running through A"

step "gateway A killed"
wb=$(writes $PATHB); before=$(acked)
order kill-a
n=0
while [ "$(cat /sys/class/nvme/$CA/state)" = live ]; do
  n=$((n + 1)); [ $n -lt 100 ] || die "controller $CA still live 10 s after gateway A died"; sleep 0.1
done
echo "A's controller is $(cat /sys/class/nvme/$CA/state)"
wait_acked 60
db=$(( $(writes $PATHB) - wb ))
echo "after the kill: $(( $(acked) - before )) writes acknowledged, $db on B, A is $(cat /sys/class/nvme/$CA/state)"
[ $db -ge 60 ] || die "only $db writes went through B"
ok "I/O continues through B while A is down"

step "gateway A restarted"
order start-a
n=0
while [ "$(cat /sys/class/nvme/$CA/state)" != live ]; do
  n=$((n + 1)); [ $n -lt 300 ] || die "controller $CA did not reconnect within 30 s (state $(cat /sys/class/nvme/$CA/state))"; sleep 0.1
done
n=0
while [ "$(ana $PATHA)" != optimized ]; do
  n=$((n + 1)); [ $n -lt 100 ] || die "path A is '$(ana $PATHA)' after reconnecting"; sleep 0.1
done
echo "A reconnected ($(cat /sys/class/nvme/$CA/state), cntlid $(cat /sys/class/nvme/$CA/cntlid), $(ana $PATHA))"
sleep 0.5 # requests already queued on B when A came back finish there
wa=$(writes $PATHA); wb=$(writes $PATHB)
wait_acked 60
da=$(( $(writes $PATHA) - wa )); db=$(( $(writes $PATHB) - wb ))
echo "after the reconnect: $da writes on A, $db on B"
[ $da -ge 60 ] && [ $db = 0 ] || die "I/O did not return to the optimized path A ($da on A, $db on B)"
ok "A is used again after it returns"
stop_writers $DEV nvme
nvme disconnect -n $NQN > /dev/null || die "disconnect"
ok "NVMe multipath done"

# ================= 2. iSCSI: implicit ALUA on both gateways =================
step "iSCSI logins to both gateways"
modprobe iscsi_tcp; modprobe sd_mod 2>/dev/null || true
iscsid; sleep 1
for p in $IA $IB; do
  iscsiadm -m node -o new -T $IQN -p $T:$p > /dev/null
  iscsiadm -m node -T $IQN -p $T:$p --login > /dev/null || die "iSCSI login to port $p"
done
n=0
while [ -z "$(disk_of $IA)" ] || [ -z "$(disk_of $IB)" ] || [ ! -b /dev/$(disk_of $IA) ] || [ ! -b /dev/$(disk_of $IB) ]; do
  n=$((n + 1)); [ $n -lt 100 ] || die "no disks for the iSCSI sessions: $(iscsiadm -m session -P 3)"; sleep 0.2
done
SA=/dev/$(disk_of $IA); SB=/dev/$(disk_of $IB)
echo "gateway A: $SA, gateway B: $SB"
for d in $SA $SB; do
  sg_inq $d > /tmp/inq || die "sg_inq $d"
  grep -q "TPGS=1" /tmp/inq || die "$d: INQUIRY does not report implicit ALUA (TPGS=1): $(grep TPGS /tmp/inq)"
done
ok "sg_inq: TPGS=1 (implicit ALUA) on both"
vpd() { sg_vpd -p di $1 > /tmp/vpd.$2 || die "sg_vpd -p di $1"; }
vpd $SA a; vpd $SB b
field() { sed -n "s/.*$1: *\(0x[0-9a-fA-F]*\).*/\1/p" /tmp/vpd.$2 | head -1; }
naa() { grep -i -A1 "designator.type: NAA" /tmp/vpd.$1 | sed -n 2p | tr -d ' '; }
echo "A: relative target port $(field 'Relative target port' a), group $(field 'Target port group' a), LU $(naa a)"
echo "B: relative target port $(field 'Relative target port' b), group $(field 'Target port group' b), LU $(naa b)"
[ "$(field 'Relative target port' a)" = 0x1 ] && [ "$(field 'Relative target port' b)" = 0x2 ] \
  || die "relative target ports: A $(field 'Relative target port' a), B $(field 'Relative target port' b) (want 0x1, 0x2)"
[ "$(field 'Target port group' a)" = 0x1 ] && [ "$(field 'Target port group' b)" = 0x2 ] || die "target port groups in VPD 0x83"
[ -n "$(naa a)" ] && [ "$(naa a)" = "$(naa b)" ] || die "the gateways name different LUs: $(naa a) / $(naa b)"
ok "sg_vpd: one LU, relative target ports 1 and 2, groups 1 and 2"
rtpg() { sg_rtpg $1 > /tmp/rtpg.$2 || die "sg_rtpg $1"; cat /tmp/rtpg.$2; }
rtpg $SA a; rtpg $SB b
# Asymmetric access state codes: 0x00 active/optimized, 0x01 active/non-optimized.
grep -q "target port group id : 0x1" /tmp/rtpg.a && grep -q "asymmetric access state : 0x00" /tmp/rtpg.a \
  || die "sg_rtpg on A: not group 1 active/optimized"
grep -q "target port group id : 0x2" /tmp/rtpg.b && grep -q "asymmetric access state : 0x01" /tmp/rtpg.b \
  || die "sg_rtpg on B: not group 2 active/non-optimized"
grep -A1 "Relative target port ids" /tmp/rtpg.a | grep -q "0x01" && grep -A1 "Relative target port ids" /tmp/rtpg.b | grep -q "0x02" \
  || die "sg_rtpg: relative target port ids"
ok "sg_rtpg: A reports group 1 active/optimized with port 1, B group 2 active/non-optimized with port 2"
dd if=/dev/urandom of=/tmp/pat bs=64k count=4 2>/dev/null
dd if=/tmp/pat of=$SA bs=64k count=4 seek=300 oflag=direct 2>/dev/null || die "write through A"
dd if=$SB of=/tmp/back bs=64k count=4 skip=300 iflag=direct 2>/dev/null || die "read through B"
cmp /tmp/pat /tmp/back || die "data written through A reads back differently through B"
ok "written through A, read back through B"
iscsiadm -m node -T $IQN --logout > /dev/null || die "iSCSI logout"

# ================= 3. AoE: one shelf.slot from two MACs =================
step "AoE e7.1 from two gateways"
mount -t debugfs none /sys/kernel/debug 2>/dev/null || true
modprobe aoe aoe_iflist=eth1
ip link set eth1 up
AOE=/dev/etherd/e7.1
targets() { grep -c -E "^($MACA|$MACB):" /sys/kernel/debug/aoe/e7.1 2>/dev/null || true; }
n=0
while [ ! -b $AOE ] || [ "$(targets)" != 2 ]; do
  n=$((n + 1)); [ $n -lt 60 ] || die "e7.1 with two targets never appeared: $(cat /sys/kernel/debug/aoe/e7.1 2>&1)"
  echo 1 > /dev/etherd/discover 2>/dev/null || true
  sleep 0.5
done
cat /sys/kernel/debug/aoe/e7.1
aoe-stat 2>/dev/null || true
ok "one AoE device e7.1, two targets ($MACA, $MACB)"
# Write packets sent to each target (the "w:" line under its MAC).
wpkts() { awk -v m="$1" '/^[0-9a-f]+:/ { cur = index($0, m ":") == 1 } cur && /w:/ { sub(/.*w:/, ""); print; exit }' /sys/kernel/debug/aoe/e7.1; }
start_writers $AOE aoe 8192
wait_acked 40
echo "frames written: A $(wpkts $MACA), B $(wpkts $MACB)"
[ "$(wpkts $MACA)" -gt 0 ] && [ "$(wpkts $MACB)" -gt 0 ] || die "the aoe driver does not use both targets"
ok "writes go to both gateways"
step "gateway A killed"
order kill-a
wb=$(wpkts $MACB)
wait_acked 60 1200
echo "frames written to B since: $(( $(wpkts $MACB) - wb ))"
cat /sys/kernel/debug/aoe/e7.1
ok "AoE writes continue through B while A is down"
stop_writers $AOE aoe
echo "MP-ALL-OK"
