#!/usr/bin/env bash
# Runs inside the kernel VM (tests/kernel-vm/vm): blktests' nvme group over
# NVMe/TCP with the guest's kernel as the host, twice in one boot: against
# blockwire (started empty, driven by tests/blktests/blockwire-target-control)
# and against the kernel's own nvmet (blktests' own setup), the baseline.
#   run-in-guest.sh BLKTESTS_COPY BLOCKWIRE CONTROL_PROGRAM TARGETS CASES...
# TARGETS: "blockwire nvmet" or one of them. For each case and target it
# prints `blktests: TARGET CASE STATUS` and, for a failure, the .out diff
# between `blktests-diff: TARGET CASE` and `blktests-diff-end`.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
BT=$1 BW=$2 CONTROL=$3 TARGETS=$4
shift 4
CASES=("$@")
# What a distribution's boot would have set up: process substitution's
# /dev/fd, configfs (nvmet's), the modules.
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
modprobe configfs 2>/dev/null
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
# No udev here: devtmpfs makes the device nodes itself, so there is never
# an event queue for `udevadm settle` to wait for.
if ! command -v udevadm >/dev/null; then
  mkdir -p /usr/local/sbin
  printf '#!/bin/sh\n[ "$1" = settle ] && exit 0\necho "udevadm: no udev in this guest" >&2; exit 1\n' > /usr/local/sbin/udevadm
  chmod +x /usr/local/sbin/udevadm
fi
for m in nvme-core nvme-fabrics nvme-tcp nvmet nvmet-tcp; do modprobe "$m" 2>/dev/null || true; done
mkdir -p /etc/nvme /run/blockwire /boot
cd "$BT" || exit 1
# The kernel's configuration, for blktests' _have_kernel_option (put
# beside the copy by the caller).
[ -f kernel-config ] && cp kernel-config "/boot/config-$(uname -r)"

report() {  # TARGET OUTPUT_DIR
  local t=$1 out=$2 c f st
  for c in "${CASES[@]}"; do
    f=$(find "$out" -path "*/nvme/$c" -type f 2>/dev/null | head -1)
    st=$( [ -n "$f" ] && awk -F'\t' '$1=="status"{print $2}' "$f")
    echo "blktests: $t $c ${st:-missing}"
    if [ "$st" = fail ] && [ -f "$f.out.bad" ]; then
      echo "blktests-diff: $t $c"
      diff -u "tests/nvme/$c.out" "$f.out.bad" | head -60
      [ -f "$f.full" ] && { echo "--- $f.full (tail)"; tail -20 "$f.full"; }
      echo "blktests-diff-end"
    fi
  done
}

for t in $TARGETS; do
  case $t in
    blockwire)
      printf '[nvme]\n' > /tmp/bw.toml
      "$BW" serve --config /tmp/bw.toml --control /run/blockwire/blktests.sock > /tmp/bw-serve.log 2>&1 &
      pid=$!
      for _ in $(seq 600); do [ -S /run/blockwire/blktests.sock ] && break; sleep 0.1; done
      printf 'NVME_TARGET_CONTROL=%s\n' "$CONTROL" > config
      export BW_BIN=$BW BW_CONTROL=/run/blockwire/blktests.sock
      ;;
    nvmet)
      printf 'NVMET_TRTYPES=tcp\nNVMET_BLKDEV_TYPES=file\n' > config
      ;;
  esac
  ./check -o "/tmp/results-$t" "${CASES[@]/#/nvme/}" 2>&1 | sed "s/^/[$t] /"
  if [ "$t" = blockwire ]; then
    kill "$pid"; wait "$pid"
    echo "--- blockwire serve log (tail)"; tail -40 /tmp/bw-serve.log
  fi
  report "$t" "/tmp/results-$t"
done
echo "blktests: done"
