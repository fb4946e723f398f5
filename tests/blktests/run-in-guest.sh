#!/usr/bin/env bash
# Runs inside the kernel VM (tests/kernel-vm/vm): blktests' nvme group over
# NVMe/TCP with the guest's kernel as the host, twice in one boot: against
# blockwire (started empty, driven by tests/blktests/blockwire-target-control)
# and against the kernel's own nvmet (blktests' own setup), the baseline.
#   run-in-guest.sh BLKTESTS_COPY BLOCKWIRE CONTROL_PROGRAM TARGETS CASES...
# TARGETS: "blockwire nvmet" or one of them. BLKTESTS_TRTYPE: tcp (the
# default) or rdma (soft-RoCE, rxe0 on eth0, whose address the ports are
# on). USE_RXE=1 for both: blktests' soft-RDMA is siw unless told, and the
# image has rxe. For each case and target it
# prints `blktests: TARGET CASE STATUS` and, for a failure, the .out diff
# between `blktests-diff: TARGET CASE` and `blktests-diff-end`; then
# `blktests-open-volumes: blockwire N`, the volume files blockwire still
# has open, and `blktests-loop-devices: TARGET N`, the loop devices left
# bound.
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
# The guest's /bin/sh is busybox ash, which runs its own applets before
# PATH: GNU zgrep (#!/bin/sh) would call busybox's gzip, which refuses the
# plain-text kernel config ("gzip: invalid magic"), and every
# _have_kernel_option would say "not enabled". Run zgrep under bash.
if [ -f /bin/zgrep ] && [ ! -e /usr/local/bin/zgrep ]; then
  mkdir -p /usr/local/bin
  printf '#!/bin/bash\nexec bash /bin/zgrep "$@"\n' > /usr/local/bin/zgrep
  chmod +x /usr/local/bin/zgrep
fi
for m in nvme-core nvme-fabrics nvme-tcp nvmet nvmet-tcp; do modprobe "$m" 2>/dev/null || true; done
mkdir -p /etc/nvme /run/blockwire /boot
# blktests decides once per run whether nvme-cli can make DH-HMAC-CHAP
# keys; made before the kernel's random pool is ready (tens of seconds
# after an emulated boot), that fails, and every auth case of the run is
# "not run". /dev/random blocks until the pool is ready.
head -c 1 /dev/random > /dev/null
cd "$BT" || exit 1
# blktests' _have_kver reads `uname -r` as a.b.c after cutting at the
# first "-" and dropping one more non-digit: Debian's 6.12.117+deb12-amd64
# becomes 6.12.117deb12, an arithmetic error that ends the case with no
# verdict (nvme/047). `uname -r` says 6.12.117-deb12-amd64 here, and that
# name leads to the same modules and configuration.
real_release=$(uname -r)
release=${real_release//+/-}
if [ "$release" != "$real_release" ]; then
  mkdir -p /usr/local/bin
  printf '#!/bin/bash\nif [ "$*" = -r ]; then echo %q; else exec /bin/uname "$@"; fi\n' "$release" > /usr/local/bin/uname
  chmod +x /usr/local/bin/uname
  ln -sfn "/lib/modules/$real_release" "/lib/modules/$release"
fi
# The kernel's configuration, for blktests' _have_kernel_option (put
# beside the copy by the caller).
[ -f kernel-config ] && cp kernel-config "/boot/config-$release"

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

# Namespaces of 512 MiB (blktests' default is 1 GiB): the backing files live
# in the guest's RAM (its root is a tmpfs of half the guest's memory, 1 GiB
# here, the image's files included), and nvme/010 and 012 fill their
# namespace with fio: at 1 GiB the file system runs out before the
# namespace does.
IMG_SIZE=${BLKTESTS_IMG_SIZE:-512M}
TRTYPE=${BLKTESTS_TRTYPE:-tcp}
TRADDR=127.0.0.1
if [ "$TRTYPE" = rdma ]; then
  for m in rdma_rxe rdma_ucm ib_uverbs nvme-rdma nvmet-rdma; do modprobe "$m" 2>/dev/null || true; done
  rdma link add rxe0 type rxe netdev eth0 || echo "blktests: rdma link add rxe0 failed"
  TRADDR=10.0.2.15   # eth0 (tests/kernel-vm/vm)
fi

for t in $TARGETS; do
  case $t in
    blockwire)
      # In a directory only root may write: serve persists every change
      # there, and refuses to write a configuration where others may (/tmp).
      printf '[nvme]\n' > /run/blockwire/bw.toml
      "$BW" serve --config /run/blockwire/bw.toml --control /run/blockwire/blktests.sock > /tmp/bw-serve.log 2>&1 &
      pid=$!
      for _ in $(seq 600); do [ -S /run/blockwire/blktests.sock ] && break; sleep 0.1; done
      # nvmet_blkdev_type=file: blktests prepares the backing it names on
      # this (the host's) side even for an external target, and for its
      # default, "device", that is a loop device over a file in the case's
      # temporary directory, which it never detaches (its cleanup returns
      # early under NVME_TARGET_CONTROL). The next case's `modprobe
      # --remove --wait loop` then waits on that reference, and Debian 12's
      # kmod 30 can spin there for good (docs/notes/2026-11-25-blktests.md).
      # A file is only truncated and goes with the temporary directory. Cases with a bd= condition take
      # the type from the control program, which says "file" too.
      printf 'NVME_TARGET_CONTROL=%s\nnvmet_blkdev_type=file\nNVME_IMG_SIZE=%s\nUSE_RXE=1\n' "$CONTROL" "$IMG_SIZE" > config
      export BW_BIN=$BW BW_CONTROL=/run/blockwire/blktests.sock BW_TRTYPE=$TRTYPE BW_TRADDR=$TRADDR BW_IMG_SIZE=$IMG_SIZE
      ;;
    nvmet)
      # File-backed namespaces, as blockwire's volumes are.
      printf 'NVMET_TRTYPES=%s\nNVMET_BLKDEV_TYPES=file\nnvmet_blkdev_type=file\nNVME_IMG_SIZE=%s\nUSE_RXE=1\n' "$TRTYPE" "$IMG_SIZE" > config
      ;;
  esac
  ./check -o "/tmp/results-$t" "${CASES[@]/#/nvme/}" 2>&1 | sed "s/^/[$t] /"
  if [ "$t" = blockwire ]; then
    # Every case removed its volume at cleanup: nothing of them may stay
    # open (a deleted file held open keeps its space).
    echo "blktests-open-volumes: $t $(ls -l /proc/"$pid"/fd 2>/dev/null | grep -c '\.img')"
    ls -l /proc/"$pid"/fd 2>/dev/null | grep '\.img'
    kill "$pid"; wait "$pid"
    echo "--- blockwire serve log (tail)"; tail -40 /tmp/bw-serve.log
  fi
  report "$t" "/tmp/results-$t"
  # What the run left on the host side: a loop device still bound keeps
  # blktests' next `modprobe --remove --wait loop` waiting (see
  # blockwire-target-control's --show-blkdev-type).
  echo "blktests-loop-devices: $t $(losetup -a | wc -l)"
  losetup -a
done
echo "blktests: done"
