# Guest script for crates/cli/tests/integration/rbd_ha.rs: two `blockwire
# serve` gateways on one rbd image, as a cluster uses them, in one boot:
#  1. SCSI persistent reservations across the gateways (sg_persist over
#     open-iscsi sessions to A and to B): registered and reserved through
#     A, B refuses a conflicting write; preempted and released through B,
#     A sees it (a unit attention, then no reservation); A killed and
#     restarted still reports the reservation.
#  2. The same with NVMe reservations (nvme resv-*) over two NVMe/TCP
#     controllers of two hosts (two host NQNs and IDs), plus the
#     reservation notification log page at the preempted host.
#  3. Planned failover under writes (NVMe/TCP native multipath): ctl
#     ana_set moves the optimized path from A to B, the writes follow
#     (per-path counters), ctl drain makes A inaccessible; then back to A
#     and A killed (the unplanned failover, for comparison). No write
#     fails; every acknowledged block reads back (here and, from the
#     ledgers, in rbd export on the host).
#  4. iSCSI through dm-multipath with multipathd (ALUA, path checker TUR):
#     ctl tpg_set moves the writes to B and back (planned); then gateway
#     A killed under writes; they go on through B once the session's
#     replacement timeout and the path checker fail A; none is lost.
# The test prepends PA, PB (NVMe ports), IA, IB (iSCSI ports), NQN, IQN and
# CTL (the order port: "kill-a", "start-a", "ctl a|b METHOD JSON").
# Runs under `sh -e` with busybox, after tests/kernel-vm/failover-lib.sh.
: "${PA:=4420}" "${PB:=4421}" "${IA:=3260}" "${IB:=3261}" "${CTL:=9999}"
: "${NQN:=nqn.2026-11.org.blockwire:rbd-mp}" "${IQN:=iqn.2026-11.org.blockwire.test:rbd-mp}"
T=10.0.2.2

# Poll up to $1 tenths of a second for the command $2... to succeed.
until_ok() {
  n=0; lim=$1; shift
  while ! "$@" > /tmp/until.out 2>&1; do
    n=$((n + 1)); [ $n -lt $lim ] || return 1; sleep 0.1
  done
}

# ================= 1. SCSI persistent reservations =================
step "iSCSI logins to both gateways"
modprobe iscsi_tcp; modprobe sd_mod 2>/dev/null || true
iscsid; sleep 1
for p in $IA $IB; do
  iscsiadm -m node -o new -T $IQN -p $T:$p > /dev/null
  # Quick relogin after gateway A's restart.
  iscsiadm -m node -T $IQN -p $T:$p -o update -n node.session.timeo.replacement_timeout -v 120 > /dev/null
  iscsiadm -m node -T $IQN -p $T:$p --login > /dev/null || die "iSCSI login to port $p"
done
n=0
while [ -z "$(disk_of $IA)" ] || [ -z "$(disk_of $IB)" ] || [ ! -b /dev/$(disk_of $IA) ] || [ ! -b /dev/$(disk_of $IB) ]; do
  n=$((n + 1)); [ $n -lt 100 ] || die "no disks for the iSCSI sessions: $(iscsiadm -m session -P 3)"; sleep 0.2
done
SA=/dev/$(disk_of $IA); SB=/dev/$(disk_of $IB)
echo "gateway A: $SA, gateway B: $SB"
dd if=/dev/zero of=/tmp/blk bs=512 count=1 2>/dev/null
# WRITE(10) / READ(10) of block 0 through sg_raw: its output names the status.
w10() { sg_raw -s 512 -i /tmp/blk $1 2a 00 00 00 00 00 00 00 01 00 2>&1; }
r10() { sg_raw -r 512 $1 28 00 00 00 00 00 00 00 01 00 2>&1 >/dev/null; }
conflicts() { w10 $1 | grep -qi "reservation conflict"; }
writes_ok() { out=$(w10 $1) && ! echo "$out" | grep -qi "conflict\|check condition"; }
resv() { sg_persist --in -r $1 2>&1; }
keys() { sg_persist --in -k $1 2>&1; }

sg_persist --out --register --param-sark=0xa1 $SA > /dev/null || die "register through A"
sg_persist --out --reserve --param-rk=0xa1 --prout-type=1 $SA > /dev/null || die "reserve through A"
resv $SB | tee /tmp/r.b
grep -q "Key=0xa1" /tmp/r.b && grep -qi "Write Exclusive" /tmp/r.b || die "B does not report A's reservation"
conflicts $SB || die "B let an unregistered nexus write under A's Write Exclusive reservation: $(w10 $SB)"
r10 $SB || die "B refused a read under Write Exclusive"
writes_ok $SA || die "A refused the holder's write: $(w10 $SA)"
ok "SCSI: reserved through A; B reports it and refuses a conflicting write with RESERVATION CONFLICT"

sg_persist --out --register --param-sark=0xb2 $SB > /dev/null || die "register through B"
sg_persist --out --preempt --param-rk=0xb2 --param-sark=0xa1 --prout-type=1 $SB > /dev/null || die "preempt through B"
# A's nexus lost its registration: its next command gets the unit attention.
sg_turs $SA > /tmp/tur.a 2>&1 || true
cat /tmp/tur.a
grep -qi "registrations preempted" /tmp/tur.a || die "A raised no REGISTRATIONS PREEMPTED unit attention: $(cat /tmp/tur.a)"
conflicts $SA || die "A let the preempted initiator write: $(w10 $SA)"
writes_ok $SB || die "B refused its own write after preempting"
sg_persist --out --release --param-rk=0xb2 --prout-type=1 $SB > /dev/null || die "release through B"
resv $SA | tee /tmp/r.a
grep -qi "no reservation" /tmp/r.a || die "A still reports a reservation after the release through B"
keys $SA | grep -q "0xb2" || die "A does not list B's key"
ok "SCSI: preempted and released through B; A raised REGISTRATIONS PREEMPTED and sees no reservation"

sg_persist --out --reserve --param-rk=0xb2 --prout-type=3 $SB > /dev/null || die "reserve (Exclusive Access) through B"
step "gateway A killed and restarted"
order kill-a
order start-a
until_ok 600 sg_persist --in -r $SA || die "A did not answer within 60 s of its restart: $(cat /tmp/until.out)"
resv $SA | tee /tmp/r.a
grep -q "Key=0xb2" /tmp/r.a && grep -qi "Exclusive Access" /tmp/r.a || die "restarted A does not report the reservation"
r10 $SA && die "restarted A let a non-registrant read under Exclusive Access"
conflicts $SA || die "restarted A let a non-registrant write"
ok "SCSI: gateway A restarted reports the reservation and enforces it"
sg_persist --out --clear --param-rk=0xb2 $SB > /dev/null || die "clear through B"
iscsiadm -m node -T $IQN --logout > /dev/null || die "iSCSI logout"

# ================= 2. NVMe reservations =================
step "NVMe/TCP controllers of two hosts"
modprobe nvme-tcp 2>/dev/null || modprobe nvme_tcp || die "no nvme-tcp module"
H1=nqn.2014-08.org.nvmexpress:uuid:11111111-1111-1111-1111-111111111111
H2=nqn.2014-08.org.nvmexpress:uuid:22222222-2222-2222-2222-222222222222
nvme connect -t tcp -a $T -s $PA -n $NQN --hostnqn=$H1 --hostid=11111111-1111-1111-1111-111111111111 --ctrl-loss-tmo=120 --reconnect-delay=1 || die "nvme connect A"
nvme connect -t tcp -a $T -s $PB -n $NQN --hostnqn=$H2 --hostid=22222222-2222-2222-2222-222222222222 --ctrl-loss-tmo=120 --reconnect-delay=1 || die "nvme connect B"
CA=$(ctrl_of $PA) || die "no controller for gateway A"
CB=$(ctrl_of $PB) || die "no controller for gateway B"
# Each controller's own path: its character device with an explicit NSID
# (Linux 6.1 makes no per-path ngXnY devices under native multipath; with
# one namespace, NVME_IOCTL_IO_CMD on the controller goes to it).
wait_nvme_paths $CA $CB
GA=/dev/$CA; GB=/dev/$CB
echo "host 1 through gateway A: $CA $GA; host 2 through gateway B: $CB $GB"
nvme id-ns $GA -n 1 | grep -i "rescap" || true
nvme id-ctrl /dev/$CA | grep -i "^oncs" || true
report() { nvme resv-report $1 -n 1 --eds 2>&1; }
nwrite() { nvme io-passthru $1 -n 1 --opcode=0x1 --data-len=512 --write --cdw10=0 --cdw11=0 --cdw12=0 -i /tmp/blk 2>&1; }
nconflicts() { nwrite $1 | grep -qi "conflict"; }

nvme resv-register $GA -n 1 --nrkey=0xa1 --rrega=0 || die "resv-register through A"
nvme resv-acquire $GA -n 1 --crkey=0xa1 --rtype=1 --racqa=0 || die "resv-acquire through A"
report $GB | tee /tmp/nr.b
grep -q "rtype *: 1" /tmp/nr.b && grep -q "rkey *: a1" /tmp/nr.b || die "B does not report A's reservation"
nconflicts $GB || die "B let host 2 write under host 1's Write Exclusive: $(nwrite $GB)"
nwrite $GA > /tmp/w.a || die "A refused the holder's write: $(cat /tmp/w.a)"
ok "NVMe: acquired through A; B reports it and refuses host 2's write with Reservation Conflict"

nvme resv-register $GB -n 1 --nrkey=0xb2 --rrega=0 || die "resv-register through B"
nvme resv-acquire $GB -n 1 --crkey=0xb2 --prkey=0xa1 --rtype=1 --racqa=1 || die "preempt through B"
nwrite $GB > /tmp/w.b || die "B refused the new holder's write: $(cat /tmp/w.b)"
nconflicts $GA || die "A let the preempted host write"
# The notice reaches A's controller on its own thread: read until it is there.
n=0
while :; do
  nvme get-log /dev/$CA --log-id=0x80 --log-len=64 --raw-binary > /tmp/rnlog || die "reservation log page on A"
  kind=$(od -An -tu1 -j8 -N1 /tmp/rnlog | tr -d ' ')
  [ "$kind" = 0 ] || break
  n=$((n + 1)); [ $n -lt 50 ] || break; sleep 0.1
done
[ "$kind" = 1 ] || die "host 1's reservation log page on A: type '$kind', not 1 (registration preempted): $(od -An -tx1 /tmp/rnlog | head -2)"
nvme resv-release $GB -n 1 --crkey=0xb2 --rtype=1 --rrela=0 || die "resv-release through B"
report $GA | tee /tmp/nr.a
grep -q "rtype *: 0" /tmp/nr.a || die "A still reports a reservation after the release through B"
ok "NVMe: preempted and released through B; host 1 got the registration-preempted log page from A and sees no reservation"

nvme resv-acquire $GB -n 1 --crkey=0xb2 --rtype=2 --racqa=0 || die "acquire (Exclusive Access) through B"
step "gateway A killed and restarted"
order kill-a
order start-a
n=0
while [ "$(cat /sys/class/nvme/$CA/state)" != live ]; do
  n=$((n + 1)); [ $n -lt 600 ] || die "controller $CA did not reconnect within 60 s"; sleep 0.1
done
until_ok 100 report $GA || die "resv-report through restarted A: $(cat /tmp/until.out)"
report $GA | tee /tmp/nr.a
grep -q "rtype *: 2" /tmp/nr.a && grep -q "rkey *: b2" /tmp/nr.a || die "restarted A does not report host 2's reservation"
nconflicts $GA || die "restarted A let host 1 write under Exclusive Access"
ok "NVMe: gateway A restarted reports the reservation and enforces it"
nvme resv-release $GB -n 1 --crkey=0xb2 --rrela=1 || die "clear through B"
nvme disconnect -n $NQN > /dev/null || die "disconnect"

# ================= 3. Planned failover: ana_set and drain under writes =================
step "planned failover over NVMe/TCP native multipath"
connect_both_gateways
# Wait up to 10 s for path $1 to be in ANA state $2.
until_ana() {
  n=0
  while [ "$(ana $1)" != "$2" ]; do
    n=$((n + 1)); [ $n -lt 100 ] || die "path $1 is '$(ana $1)', not $2, 10 s after the change"; sleep 0.1
  done
}
until_ana $PATHA optimized; until_ana $PATHB non-optimized
start_writers $DEV plan 0
wait_acked 40
wa=$(writes $PATHA); wb=$(writes $PATHB)
[ $wa -gt 0 ] || die "no writes through A before the failover"
t0=$(now)
# B first, then A: there is an optimized path at every moment.
order "ctl b ana_set {\"nqn\":\"$NQN\",\"state\":\"optimized\"}"
order "ctl a ana_set {\"nqn\":\"$NQN\",\"group\":1,\"state\":\"non-optimized\"}"
until_ana $PATHB optimized; until_ana $PATHA non-optimized
t1=$(now)
sleep 0.5 # requests already queued on A finish there
wa=$(writes $PATHA); wb=$(writes $PATHB)
wait_acked 60
da=$(( $(writes $PATHA) - wa )); db=$(( $(writes $PATHB) - wb ))
echo "after ana_set: $da writes on A, $db on B; the host saw the new states $(echo "$t1 $t0" | awk '{printf "%.2f", $1 - $2}') s after the first call"
[ $db -ge 60 ] && [ $da = 0 ] || die "I/O did not move to B ($da on A, $db on B)"
ok "planned failover: ana_set moved the optimized path from A to B, and the writes with it"
order "ctl a drain {}"
until_ana $PATHA inaccessible
wa=$(writes $PATHA)
wait_acked 40
[ $(( $(writes $PATHA) - wa )) = 0 ] || die "writes went to the drained gateway A"
ok "drain: A inaccessible, the writes stay on B"
PLANNED=$(longest_gap $t0)
# Back to A, then lose it for real: the unplanned failover, same writers.
order "ctl a ana_set {\"nqn\":\"$NQN\",\"state\":\"optimized\"}"
order "ctl b ana_set {\"nqn\":\"$NQN\",\"state\":\"non-optimized\"}"
until_ana $PATHA optimized; until_ana $PATHB non-optimized
sleep 0.5
wa=$(writes $PATHA)
wait_acked 40
[ $(( $(writes $PATHA) - wa )) -ge 40 ] || die "the writes did not return to A"
t2=$(now)
order kill-a
wb=$(writes $PATHB)
wait_acked 60
[ $(( $(writes $PATHB) - wb )) -ge 60 ] || die "the writes did not go on through B after A was killed"
UNPLANNED=$(longest_gap $t2)
order start-a
stop_writers $DEV plan
echo "FAILOVER-GAPS: nvme planned ${PLANNED} s, unplanned ${UNPLANNED} s"
ok "no write failed and every acknowledged block reads back (planned ${PLANNED} s, unplanned ${UNPLANNED} s longest pause)"
n=0
while [ "$(cat /sys/class/nvme/$CA/state)" != live ]; do
  n=$((n + 1)); [ $n -lt 600 ] || die "controller $CA did not reconnect within 60 s"; sleep 0.1
done
nvme disconnect -n $NQN > /dev/null || die "disconnect"

# ================= 4. iSCSI with dm-multipath and multipathd =================
step "iSCSI through dm-multipath: gateway A killed under writes"
command -v multipathd > /dev/null || die "the image has no multipathd (tests/kernel-vm/vm lacks multipath-tools)"
modprobe dm-multipath; modprobe dm-round-robin; modprobe scsi_dh_alua
mkdir -p /etc/multipath
cat > /etc/multipath.conf <<'CONF'
defaults {
  user_friendly_names no
  find_multipaths off
  polling_interval 1
}
devices {
  device {
    vendor "BLKWIRE"
    product ".*"
    path_grouping_policy group_by_prio
    prio alua
    hardware_handler "1 alua"
    failback immediate
    no_path_retry queue
    path_checker tur
  }
}
CONF
for p in $IA $IB; do
  # A dead portal fails its path's I/O after 5 s, for dm-multipath to retry on B.
  iscsiadm -m node -T $IQN -p $T:$p -o update -n node.session.timeo.replacement_timeout -v 5 > /dev/null
  iscsiadm -m node -T $IQN -p $T:$p --login > /dev/null || die "iSCSI login to port $p"
done
n=0
while [ -z "$(disk_of $IA)" ] || [ -z "$(disk_of $IB)" ]; do
  n=$((n + 1)); [ $n -lt 100 ] || die "no disks for the iSCSI sessions"; sleep 0.2
done
SA=$(disk_of $IA); SB=$(disk_of $IB)
# No udev in the guest, and multipath skips devices udev has not seen:
# write the two entries udev's database would hold for each path (that it
# was seen, and its ID_SERIAL: "3" and the NAA designator, as scsi_id
# gives it).
mkdir -p /run/udev/data
for d in $SA $SB; do
  wwid=$(cat /sys/block/$d/device/wwid)
  printf 'I:1\nE:ID_SERIAL=3%s\nE:SCSI_IDENT_LUN_NAA_REGEXT=%s\n' "${wwid#naa.}" "${wwid#naa.}" > /run/udev/data/b$(cat /sys/block/$d/dev)
done
multipathd -d -v2 > /tmp/multipathd.log 2>&1 &
until_ok 100 multipathd show daemon || die "multipathd did not start: $(cat /tmp/multipathd.log)"
n=0
while ! multipath -ll 2>/dev/null | grep -q "dm-[0-9]"; do
  multipath -v2 > /dev/null 2>&1 || true
  n=$((n + 1)); [ $n -lt 50 ] || die "multipath made no map: $(multipath -v3 2>&1 | tail -30)"; sleep 0.2
done
multipath -ll
# No udev to make /dev/mapper/NAME: the map's own node.
MPDEV=/dev/$(multipath -ll | grep -m1 -o "dm-[0-9]*")
[ -b $MPDEV ] || die "no device node $MPDEV"
multipath -ll | grep -q "$SA" && multipath -ll | grep -q "$SB" || die "the map does not hold both paths ($SA, $SB)"
ok "one dm-multipath map over both gateways' paths ($MPDEV)"
start_writers $MPDEV mpath 8192
wait_acked 40
wa=$(writes $SA); wb=$(writes $SB)
wait_acked 40
da=$(( $(writes $SA) - wa )); db=$(( $(writes $SB) - wb ))
echo "multipath: $da writes on A ($SA), $db on B ($SB)"
[ $da -ge 40 ] && [ $db = 0 ] || die "dm-multipath does not prefer A's active/optimized path ($da on A, $db on B)"
# Wait (up to 30 s) until 40 writes in a row went to path $1 and none to $2.
until_writes_on() {
  n=0
  while :; do
    w1=$(writes $1); w2=$(writes $2)
    wait_acked 40
    [ $(( $(writes $1) - w1 )) -ge 40 ] && [ $(( $(writes $2) - w2 )) = 0 ] && return 0
    n=$((n + 1)); [ $n -lt 15 ] || die "the writes did not move to $1: $(multipath -ll)"
  done
}
# Planned: tpg_set makes B active/optimized and A active/non-optimized;
# the unit attention makes the host re-read the states, and multipathd
# (failback immediate) switches the path group.
t4=$(now)
order "ctl b tpg_set {\"iqn\":\"$IQN\",\"state\":\"active-optimized\"}"
order "ctl a tpg_set {\"iqn\":\"$IQN\",\"group\":1,\"state\":\"active-non-optimized\"}"
until_writes_on $SB $SA
ok "dm-multipath: tpg_set moved the writes from A to B"
order "ctl a tpg_set {\"iqn\":\"$IQN\",\"state\":\"active-optimized\"}"
order "ctl b tpg_set {\"iqn\":\"$IQN\",\"state\":\"active-non-optimized\"}"
until_writes_on $SA $SB
TPGGAP=$(longest_gap $t4)
t3=$(now)
order kill-a
wb=$(writes $SB)
wait_acked 60 1200
db=$(( $(writes $SB) - wb ))
echo "after the kill: $db writes on B"
multipath -ll
[ $db -ge 60 ] || die "only $db writes went through B"
MPGAP=$(longest_gap $t3)
stop_writers $MPDEV mpath
echo "FAILOVER-GAPS: iscsi multipath planned ${TPGGAP} s, unplanned ${MPGAP} s"
ok "dm-multipath: I/O continued through B after A was killed (longest pause ${MPGAP} s), no acknowledged write lost"
order start-a
echo "MP-ALL-OK"
