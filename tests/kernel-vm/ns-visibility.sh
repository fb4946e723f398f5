# Guest side of ns_visibility::linux_hosts_see_only_their_namespaces: the
# Linux nvme-tcp host (nvme-cli) against one blockwire subsystem whose
# namespaces 2 and 3 are shown only to some host NQNs. Namespace 1 (every
# host sees it) is the mailbox: the guest writes the phase it reached to
# its first sector, the host test reads the volume's file and changes
# visibility with SPDK's RPC names. The test prepends NPORT, NQN, H1, H2.
T=10.0.2.2
step() { echo "VIS-STEP: $*"; }
die() { echo "VIS-FAIL: $*"; dmesg | tail -40; exit 1; }
# Poll (0.5 s apart, at most $1 tries) until "$2" succeeds. The counter is
# local: the checks it runs have loop variables of their own (a shared `n`
# reset by them made this loop endless).
poll() { local tries=0; while ! eval "$2" >/dev/null 2>&1; do tries=$((tries + 1)); [ $tries -lt $1 ] || return 1; sleep 0.5; done; }

modprobe nvme-tcp 2>/dev/null || modprobe nvme_tcp || die "no nvme-tcp module"
command -v nvme >/dev/null || die "no nvme-cli in the guest"

# The controller (nvmeN) of subsystem $NQN connected as host $1.
ctrl_of() {
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat $c/subsysnqn 2>/dev/null)" = "$NQN" ] && [ "$(cat $c/hostnqn 2>/dev/null)" = "$1" ] && { basename $c; return 0; }
  done
  return 1
}
# The block device of NSID $2 through controller $1, found by its sysfs
# `nsid`: the N in nvmeXnN is the kernel's own instance number, not the
# NSID (a host shown namespaces 1 and 3 gets nvmeXn1 and nvmeXn2). With
# multipath the path nvme0c0n2 has the head nvme0n2.
ns_dev() {
  local d p h
  for d in /sys/class/nvme/$1/nvme*n*; do
    [ "$(cat $d/nsid 2>/dev/null)" = "$2" ] || continue
    p=$(basename "$d"); h=$(echo "$p" | sed 's/c[0-9]*n/n/')
    [ -b /dev/$h ] && { echo $h; return 0; }
    [ -b /dev/$p ] && { echo $p; return 0; }
  done
  return 1
}
# The active namespace list controller $1 answers (Identify CNS 02h), as
# "1 2 3".
active() { nvme list-ns /dev/$1 | sed -n 's/.*:0x\([0-9a-f]*\).*/\1/p' | while read -r x; do printf '%d ' 0x$x; done | sed 's/ $//'; }
# Both the controller's list and the kernel's block devices say "$2".
sees() {
  local id
  [ "$(active $1)" = "$2" ] || return 1
  for id in 1 2 3; do
    case " $2 " in *" $id "*) ns_dev $1 $id >/dev/null || return 1 ;; *) ! ns_dev $1 $id >/dev/null || return 1 ;; esac
  done
}
mark() {
  printf '%-511s\n' "$1" | dd of=/dev/$(ns_dev $C 1) bs=512 count=1 oflag=direct 2>/dev/null || die "mailbox write"
  step "$1"
}

# Two hosts have two host IDs: each connect gives its own (the guest's
# /etc/nvme/hostid would otherwise be the same for both NQNs).
step "host 1 connects"
nvme connect -t tcp -a $T -s $NPORT -n $NQN --hostnqn $H1 --hostid $(cat /proc/sys/kernel/random/uuid) || die "nvme connect as $H1"
poll 100 "ctrl_of $H1" || die "no controller for $H1"
C=$(ctrl_of $H1); CNTLID=$(cat /sys/class/nvme/$C/cntlid)
poll 100 "sees $C '1 2'" || die "host 1 sees '$(active $C)', not '1 2'"
echo "+ nvme list-ns /dev/$C"; nvme list-ns /dev/$C
echo "+ nvme list"; nvme list
mark P1

step "waiting for namespace 3 to appear to host 1 (no reconnect: the kernel rescans on the event)"
poll 240 "sees $C '1 2 3'" || die "namespace 3 did not appear (host 1 sees '$(active $C)')"
echo "+ nvme list-ns /dev/$C"; nvme list-ns /dev/$C
D3=$(ns_dev $C 3)
dd if=/dev/$D3 of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null || die "read of namespace 3 ($D3)"
mark P2

step "waiting for namespace 3 to go from host 1"
poll 240 "sees $C '1 2'" || die "namespace 3 is still there (host 1 sees '$(active $C)')"
echo "+ nvme list-ns /dev/$C"; nvme list-ns /dev/$C
[ "$(cat /sys/class/nvme/$C/state)" = live ] && [ "$(cat /sys/class/nvme/$C/cntlid)" = "$CNTLID" ] || die "$C reconnected or is not live"
step "$C stayed live as controller $CNTLID throughout"
nvme disconnect -n $NQN >/dev/null || die "disconnect"

step "host 2 connects"
nvme connect -t tcp -a $T -s $NPORT -n $NQN --hostnqn $H2 --hostid $(cat /proc/sys/kernel/random/uuid) || die "nvme connect as $H2"
poll 100 "ctrl_of $H2" || die "no controller for $H2"
C=$(ctrl_of $H2)
poll 100 "sees $C '1 3'" || die "host 2 sees '$(active $C)', not '1 3'"
echo "+ nvme list-ns /dev/$C"; nvme list-ns /dev/$C
echo "+ nvme list"; nvme list
nvme disconnect -n $NQN >/dev/null || die "disconnect"
echo "VIS-OK"
