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
disk_of() { # the sd disk of the session through portal port $1
  iscsiadm -m session -P 3 2>/dev/null | awk -v p="$T:$1," '
    /Current Portal:/ { cur = index($0, p) > 0 }
    /Attached scsi disk/ && cur { print $4; exit }'
}
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
ctrl_of() { # the controller (nvmeN) connected to port $1
  for c in /sys/class/nvme/nvme*; do
    grep -q "trsvcid=$1," $c/address 2>/dev/null && { basename $c; return 0; }
  done
  return 1
}
CA=$(ctrl_of $PA) || die "no controller for gateway A"
CB=$(ctrl_of $PB) || die "no controller for gateway B"
# The per-controller namespace devices (ngXnY: X the controller's instance).
n=0
while [ -z "$(ls /dev/ng${CA#nvme}n* 2>/dev/null)" ] || [ -z "$(ls /dev/ng${CB#nvme}n* 2>/dev/null)" ]; do
  n=$((n + 1)); [ $n -lt 100 ] || die "no namespace devices: $(ls /dev/ng* /sys/class/nvme/*)"; sleep 0.2
done
GA=$(ls /dev/ng${CA#nvme}n* | head -1); GB=$(ls /dev/ng${CB#nvme}n* | head -1)
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
nvme get-log /dev/$CA --log-id=0x80 --log-len=64 --raw-binary > /tmp/rnlog || die "reservation log page on A"
kind=$(od -An -tu1 -j8 -N1 /tmp/rnlog | tr -d ' ')
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
echo "MP-ALL-OK"
