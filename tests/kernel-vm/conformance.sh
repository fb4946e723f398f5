# Guest script for crates/cli/tests/integration/conformance_kernel.rs: the tools an
# administrator types (nvme-cli, sg3-utils) against `blockwire serve`, in ONE
# boot. The test prepends PORT, DPORT, NQN, HOSTNQN, ISCSI_PORT, IQN.
# Every check prints exactly one line, "PASS name" or "FAIL name: why"; the
# last line is "CONFORMANCE-DONE pass=N fail=M". Runs under plain sh (busybox),
# not -e: a failing check must not end the battery.
: "${PORT:=4420}" "${DPORT:=8009}" "${NQN:=nqn.2026-11.org.blockwire:conf}"
: "${HOSTNQN:=nqn.2026-11.org.blockwire:kernel-vm}" "${ISCSI_PORT:=3260}"
: "${IQN:=iqn.2026-11.org.blockwire:conf}" "${SKIP_NVME:=}"
T=10.0.2.2
npass=0; nfail=0
pass() { echo "PASS $1"; npass=$((npass + 1)); }
fail() { echo "FAIL $1: $2"; nfail=$((nfail + 1)); }
# check NAME CMD...: passes when CMD exits 0; its output is kept in /tmp/out.
check() {
  n=$1; shift
  if "$@" >/tmp/out 2>&1; then pass "$n"; else fail "$n" "exit $? from '$*': $(tail -c 300 /tmp/out | tr '\n' ' ')"; fi
}
# grep_out NAME PATTERN: /tmp/out (from the last command) matches PATTERN (grep -Ei).
grep_out() {
  if grep -Eiq "$2" /tmp/out; then pass "$1"; else fail "$1" "no /$2/ in: $(tail -c 300 /tmp/out | tr '\n' ' ')"; fi
}
# refused NAME PATTERN CMD...: CMD must fail and its output match PATTERN.
refused() {
  n=$1; pat=$2; shift 2
  if "$@" >/tmp/out 2>&1; then fail "$n" "'$*' succeeded: $(tail -c 200 /tmp/out | tr '\n' ' ')"
  elif grep -Eiq "$pat" /tmp/out; then pass "$n"
  else fail "$n" "refused without /$pat/: $(tail -c 300 /tmp/out | tr '\n' ' ')"; fi
}

###################################################################### NVMe
# SKIP_NVME=1 runs the iSCSI half alone (tests/conformance-tgt: the same
# checks against tgt, for the comparison column of docs/conformance.md).
if [ -z "$SKIP_NVME" ]; then
modprobe nvme-tcp 2>/dev/null || modprobe nvme_tcp
mkdir -p /etc/nvme && echo "$HOSTNQN" > /etc/nvme/hostnqn
H="--hostnqn=$HOSTNQN"
check nvme.discover nvme discover -t tcp -a $T -s $DPORT $H
grep_out nvme.discover.lists-subsystem "$NQN"
check nvme.connect nvme connect -t tcp -a $T -s $PORT -n $NQN $H
C=""; i=0
while [ $i -lt 50 ]; do
  for c in /sys/class/nvme/nvme*; do
    [ -e "$c/subsysnqn" ] && [ "$(cat $c/subsysnqn)" = "$NQN" ] && C=/dev/$(basename $c)
  done
  [ -n "$C" ] && break; sleep 0.2; i=$((i + 1))
done
NS=""; i=0
while [ -n "$C" ] && [ $i -lt 50 ]; do
  for d in /sys/class/nvme/$(basename $C)/nvme*n1 /sys/class/nvme/$(basename $C)/nvme*c*n1; do
    [ -e "$d" ] || continue
    h=$(basename $d | sed 's/c[0-9]*n/n/'); [ -b /dev/$h ] && NS=/dev/$h
  done
  [ -n "$NS" ] && break; sleep 0.2; i=$((i + 1))
done
[ -n "$C" ] && [ -n "$NS" ] && pass nvme.devices || fail nvme.devices "controller '$C' namespace '$NS'"
: "${C:=/dev/nvme0}" "${NS:=/dev/nvme0n1}"
check nvme.list nvme list
grep_out nvme.list.shows-namespace "$(basename $NS)"
check nvme.id-ctrl nvme id-ctrl $C
grep_out nvme.id-ctrl.subnqn "subnqn +: $NQN"
check nvme.id-ns nvme id-ns $NS -n 1
grep_out nvme.id-ns.nsze "nsze +: 0x[1-9a-f]"
check nvme.ns-descs nvme ns-descs $NS -n 1
grep_out nvme.ns-descs.has-id "nguid|uuid|eui64"
check nvme.list-ns nvme list-ns $C
grep_out nvme.list-ns.nsid1 "\]:0x1"
# Identify CNS 13h (controller list) is optional without namespace
# management; blockwire refuses it with the status the spec gives.
refused nvme.list-ctrl.unsupported "Invalid Field|0x4002" nvme list-ctrl $C
# Mandatory log pages for an I/O controller (base spec 2.0, fig. "Log Page Identifiers").
check nvme.log.supported-pages nvme get-log $C --log-id=0 --log-len=1024
check nvme.log.error nvme error-log $C
check nvme.log.smart nvme smart-log $C
grep_out nvme.log.smart.temperature "temperature"
check nvme.log.firmware nvme fw-log $C
check nvme.log.effects nvme effects-log $C
nvme get-log $C --log-id=5 --log-len=4096 -b > /tmp/eff 2>/dev/null
# I/O dword 2 (Read): supported; dword 1 (Write): supported + changes content.
[ "$(od -An -tx1 -j 1032 -N 4 /tmp/eff | tr -d ' ')" = 01000000 ] && [ "$(od -An -tx1 -j 1028 -N 4 /tmp/eff | tr -d ' ')" = 03000000 ] \
  && pass nvme.log.effects.read-write || fail nvme.log.effects.read-write "$(od -An -tx1 -j 1024 -N 16 /tmp/eff)"
check nvme.log.changed-ns nvme changed-ns-list-log $C
# Mandatory features (and the Volatile Write Cache one the kernel asks for).
for f in 1:arbitration 2:power-mgmt 4:temp-threshold 7:num-queues 0xa:write-atomicity 0xb:async-event-config 0xf:keep-alive; do
  check nvme.feature.${f#*:} nvme get-feature $C -f ${f%%:*}
done
check nvme.feature.vwc nvme get-feature $NS -f 6 -n 1
check nvme.set-feature.temp-threshold nvme set-feature $C -f 4 -v 0x157
check nvme.set-feature.async-event-config nvme set-feature $C -f 0xb -v 0x100
check nvme.get-property.cap nvme get-property $C -o 0
check nvme.get-property.vs nvme get-property $C -o 8
grep_out nvme.get-property.vs.value "10[0-9]00|20[0-9]00"
# I/O commands.
dd if=/dev/urandom of=/tmp/w bs=4096 count=1 2>/dev/null
check nvme.write nvme write $NS -s 64 -c 7 -z 4096 -d /tmp/w
check nvme.read nvme read $NS -s 64 -c 7 -z 4096 -d /tmp/r
check nvme.read.matches cmp /tmp/w /tmp/r
check nvme.compare.equal nvme compare $NS -s 64 -c 7 -z 4096 -d /tmp/w
dd if=/dev/urandom of=/tmp/w2 bs=4096 count=1 2>/dev/null
refused nvme.compare.differs "compare|0x285|0x4285" nvme compare $NS -s 64 -c 7 -z 4096 -d /tmp/w2
check nvme.write-zeroes nvme write-zeroes $NS -s 64 -c 7
nvme read $NS -s 64 -c 7 -z 4096 -d /tmp/r >/dev/null 2>&1
dd if=/dev/zero of=/tmp/z bs=4096 count=1 2>/dev/null
check nvme.write-zeroes.reads-zero cmp /tmp/z /tmp/r
nvme write $NS -s 64 -c 7 -z 4096 -d /tmp/w >/dev/null 2>&1
check nvme.dsm.deallocate nvme dsm $NS -n 1 -d -s 64 -b 8
check nvme.flush nvme flush $NS -n 1
NSZE=$(nvme id-ns $NS -n 1 | sed -n 's/^nsze *: *//p')
refused nvme.read.out-of-range "LBA_RANGE|out of range|0x80|0x4080" nvme read $NS -s $((NSZE)) -c 0 -z 512 -d /tmp/r
refused nvme.io.invalid-opcode "INVALID_OPCODE|invalid.*opcode|0x1\b|0x4001" nvme io-passthru $NS -o 0x7e -n 1
refused nvme.admin.invalid-opcode "INVALID_OPCODE|invalid.*opcode|0x1\b|0x4001" nvme admin-passthru $C -o 0x7e
refused nvme.log.invalid-page "INVALID_LOG_PAGE|invalid log|0x109|0x4109" nvme get-log $C --log-id=0xbf --log-len=512
refused nvme.feature.invalid "INVALID_FIELD|invalid field|0x2\b|0x4002" nvme get-feature $C -f 0x7e
check nvme.reset nvme reset $C
sleep 1
check nvme.read.after-reset nvme read $NS -s 0 -c 0 -z 512 -d /tmp/r
check nvme.disconnect nvme disconnect -n $NQN
[ ! -e $C ] && pass nvme.disconnect.gone || fail nvme.disconnect.gone "$C still present"
fi

##################################################################### iSCSI
modprobe iscsi_tcp; modprobe sd_mod 2>/dev/null
iscsid; sleep 1
P=$T:$ISCSI_PORT
iscsiadm -m node -o new -T $IQN -p $P >/dev/null 2>&1
check iscsi.login iscsiadm -m node -T $IQN -p $P --login
D=""; i=0
while [ $i -lt 50 ]; do
  D=$(iscsiadm -m session -P 3 2>/dev/null | sed -n 's/.*Attached scsi disk \([a-z]*\).*/\1/p' | head -1)
  [ -n "$D" ] && [ -b /dev/$D ] && break; sleep 0.2; i=$((i + 1))
done
D=/dev/${D:-sda}
check scsi.inquiry sg_inq $D
grep_out scsi.inquiry.tpgs "TPGS=[123]"
check scsi.vpd.supported sg_vpd -p 0 $D
for pg in $(sg_vpd -p 0 -r $D 2>/dev/null | od -An -tx1 -v | tr -s ' \n' ' ' | cut -d' ' -f6-); do
  check scsi.vpd.0x$pg sg_vpd -p 0x$pg $D
done
# (sg_vpd itself refuses pages missing from page 0's list, so ask raw.)
refused scsi.vpd.unsupported-page "invalid field in cdb" sg_raw -r 252 $D 12 01 c7 00 fc 00
check scsi.modes.all sg_modes -a $D
check scsi.modes.caching sg_modes -p 8 $D
check scsi.modes.control sg_modes -p 0xa $D
refused scsi.modes.unsupported-page "illegal request|invalid field" sg_modes -p 0x2c $D
check scsi.logs.supported sg_logs $D
check scsi.logs.temperature sg_logs -p 0xd $D
grep_out scsi.logs.temperature.value "temperature"
check scsi.logs.informational-exceptions sg_logs -p 0x2f $D
refused scsi.logs.unsupported-page "illegal request|invalid field" sg_logs -p 0x33 $D
check scsi.readcap10 sg_readcap $D
check scsi.readcap16 sg_readcap -l $D
grep_out scsi.readcap16.lbpme "LBPME=1"
BLOCKS=$(sg_readcap -l $D | sed -n 's/.*Last LBA=\([0-9]*\).*/\1/p'); BLOCKS=$((BLOCKS + 1))
check scsi.tur sg_turs $D
check scsi.request-sense sg_requests $D
check scsi.sync-cache sg_sync $D
check scsi.verify sg_verify --lba=0 --count=8 $D
check scsi.rep-opcodes sg_opcodes $D
check scsi.rep-opcodes.read16 sg_opcodes --op=0x88 $D
check scsi.rep-tmf sg_opcodes -t $D
check scsi.rtpg sg_rtpg $D
grep_out scsi.rtpg.active-optimized "asymmetric access state : 0x00"
check scsi.report-luns sg_luns $D
# Persistent reservations.
check scsi.pr.read-caps sg_persist -i -c $D
check scsi.pr.register sg_persist -o -G -S 0xabc $D
check scsi.pr.read-keys sg_persist -i -k $D
grep_out scsi.pr.read-keys.key "0xabc"
check scsi.pr.reserve sg_persist -o -R -K 0xabc -T 1 $D
check scsi.pr.read-reservation sg_persist -i -r $D
grep_out scsi.pr.read-reservation.type "Write Exclusive"
check scsi.pr.read-full-status sg_persist -i -s $D
check scsi.pr.release sg_persist -o -L -K 0xabc -T 1 $D
check scsi.pr.unregister sg_persist -o -G -K 0xabc -S 0 $D
# Data commands and thin provisioning.
dd if=/dev/urandom of=/tmp/b bs=512 count=1 2>/dev/null
check scsi.write-same16 sg_write_same --16 --lba=2048 --num=64 --in=/tmp/b $D
dd if=$D of=/tmp/ws bs=512 skip=2111 count=1 iflag=direct 2>/dev/null
check scsi.write-same.reads-back cmp /tmp/b /tmp/ws
check scsi.write-same10 sg_write_same --10 --lba=4096 --num=8 --in=/tmp/b $D
check scsi.lba-status.mapped sg_get_lba_status --lba=2048 $D
grep_out scsi.lba-status.mapped.state "mapped|\b0x0\b|provisioning status: 0"
check scsi.unmap sg_unmap --lba=8192 --num=2048 $D
check scsi.lba-status.deallocated sg_get_lba_status --lba=8192 $D
grep_out scsi.lba-status.deallocated.state "deallocated|provisioning status: 1"
check scsi.write-same.unmap sg_write_same --16 --unmap --lba=2048 --num=64 $D
# Out of range and malformed requests, refused with the right sense.
refused scsi.read16.out-of-range "out of range" sg_raw -r 512 $D 88 00 $(printf '%016x' $BLOCKS | sed 's/../& /g') 00 00 00 01 00 00
refused scsi.unmap.out-of-range "out of range" sg_unmap --lba=$BLOCKS --num=8 $D
refused scsi.write-same.out-of-range "out of range" sg_write_same --16 --lba=$BLOCKS --num=8 --in=/tmp/b $D
refused scsi.lba-status.out-of-range "out of range" sg_get_lba_status --lba=$BLOCKS $D
refused scsi.invalid-opcode "invalid command operation code|invalid opcode" sg_raw $D c0 00 00 00 00 00
refused scsi.inquiry.page-without-evpd "invalid field in cdb" sg_raw -r 96 $D 12 00 80 00 60 00
refused scsi.read10.naca-refused "invalid field in cdb" sg_raw -r 512 $D 28 00 00 00 00 00 00 00 01 04
check scsi.logout iscsiadm -m node -T $IQN -p $P --logout

echo "CONFORMANCE-DONE pass=$npass fail=$nfail"
