#!/usr/bin/env bash
# Run blktests' nvme group in the kernel VM against blockwire and against
# the kernel's nvmet, in one boot (tests/blktests/run-in-guest.sh inside).
#   tests/blktests/run-vm.sh BLKTESTS_SRC BLOCKWIRE_BIN KVM_DIR TARGETS CASE...
# BLKTESTS_SRC is copied and built in a temporary directory (never into the
# repository); KVM_DIR is an image directory with Debian's 6.12 kernel
# (tests/kernel-vm/kernel-6.12.sh; 6.1 lacks NVMe in-band authentication).
# The guest is busybox-based: blktests' GNU tools (coreutils, gawk, grep,
# sed, gzip, findutils, diffutils, util-linux, uuidgen, xfsprogs, losetup,
# column, kmod's modprobe,
# fio, jq) go in with --with, at their host paths, ahead of busybox's.
# BLKTESTS_TRTYPE=rdma runs the cases over NVMe/RDMA on soft-RoCE;
# BLKTESTS_IMG_SIZE is the namespaces' size (512M, see run-in-guest.sh).
set -euo pipefail
SRC=$1 BW=$2 KVM_DIR=$3 TARGETS=$4
shift 4
HERE=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d -t blktests.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -a "$SRC" "$work/blktests"
make -C "$work/blktests" -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -20 "$work/make.log"; echo "blktests: build failed"; exit 1; }
cp "$KVM_DIR"/root/boot/config-* "$work/blktests/kernel-config"
# blockwire without its debug information (88 MB -> 18 MB here): the guest
# keeps every file in its RAM, and the namespaces' files live there too.
objcopy --strip-debug "$BW" "$work/blockwire" 2>/dev/null || cp "$BW" "$work/blockwire"
BW=$work/blockwire
tools=()
for p in coreutils gawk grep sed gzip findutils diffutils util-linux uuid-runtime xfsprogs fio jq; do
  while IFS= read -r f; do
    case "${f##*/}" in
      # login and terminal programs, and fio's plotting scripts: not needed
      su|login|mount|umount|agetty|sulogin|wall|runuser|nologin|chsh|chfn|newgrp|setpriv|more|less|fio2gnuplot|fio_generate_plots|genfio|fio_jsonplus_clat2csv) continue ;;
    esac
    [ -f "$f" ] && [ -x "$f" ] && tools+=(--with "$f")
  done < <(dpkg -L "$p" 2>/dev/null | grep -E '^/(usr/)?s?bin/[^/]+$')
done
for f in /sbin/losetup /usr/bin/column /usr/bin/getconf /sbin/modprobe; do
  [ -e "$f" ] && tools+=(--with "$f")
done
cases=$(printf ' %q' "$@")
printf 'BLKTESTS_TRTYPE=%q BLKTESTS_IMG_SIZE=%q exec bash %q %q %q %q %q%s\n' "${BLKTESTS_TRTYPE:-tcp}" "${BLKTESTS_IMG_SIZE:-512M}" "$HERE/run-in-guest.sh" "$work/blktests" "$BW" \
  "$HERE/blockwire-target-control" "$TARGETS" "$cases" > "$work/test.sh"
KVM_DIR=$KVM_DIR KVM_MEM=${KVM_MEM:-2048} "$HERE/../kernel-vm/vm" run "$work/test.sh" \
  --with "$work/blktests" --with "$BW" --with "$HERE" "${tools[@]}"
