# Shell functions for the guest scripts that drive the Linux NVMe host
# (nvme.sh, nvme-rdma.sh, nvme-tls.sh, nvme-auth.sh): the tests put this
# file in front of each (common::guest_script_with); by hand, `cat` it in
# front too. A controller is named as sysfs names it (nvme0). The scripts
# define `die`. Runs under `sh -e` with busybox.

# Write an option string to /dev/nvme-fabrics and print "instance=N,cntlid=M".
fabrics_connect() {
  exec 3<>/dev/nvme-fabrics
  if ! echo "$1" >&3; then exec 3>&-; return 1; fi
  read -r line <&3 || true
  exec 3>&-
  echo "$line"
}
instance_of() { echo "$1" | sed -n 's/.*instance=\([0-9]*\).*/\1/p'; }

# The controller connected for host NQN $1 to subsystem $2 (default $NQN), if any.
ctrl_of() {
  for c in /sys/class/nvme/nvme*; do
    [ -e "$c/hostnqn" ] || continue
    [ "$(cat $c/hostnqn)" = "$1" ] && [ "$(cat $c/subsysnqn)" = "${2:-$NQN}" ] && { basename $c; return 0; }
  done
  return 1
}

# The namespace block device of controller $1, waited for up to 30 s
# (multipath names it after the subsystem, so look it up through sysfs).
wait_blockdev() {
  i=0
  while [ $i -lt 150 ]; do
    for d in /sys/class/nvme/$1/nvme*n1 /sys/class/nvme/$1/nvme*c*n1; do
      [ -e "$d" ] || continue
      n=$(basename "$d")
      # nvme0c0n1 (path) -> nvme0n1 (head) when multipath is on
      h=$(echo "$n" | sed 's/c[0-9]*n/n/')
      [ -b /dev/$h ] && { echo /dev/$h; return 0; }
      [ -b /dev/$n ] && { echo /dev/$n; return 0; }
    done
    sleep 0.2; i=$((i + 1))
  done
  return 1
}

# Delete controller $1 (nvme-cli where the guest has it, else sysfs) and
# wait up to 20 s for it to be gone.
disconnect() {
  nvme disconnect -d $1 >/dev/null 2>&1 || echo 1 > /sys/class/nvme/$1/delete_controller
  i=0
  while [ -e /sys/class/nvme/$1 ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
  [ ! -e /sys/class/nvme/$1 ] || die "$1 still present after disconnect"
}
