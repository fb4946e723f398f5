#!/bin/sh
# Prepare a kernel-vm image directory (KVM_DIR) that boots Debian's Linux
# 6.12 (linux-image-6.12-amd64, bookworm-security) instead of bookworm's 6.1:
# 6.1 is built without NVMe in-band authentication (# CONFIG_NVME_AUTH is not
# set, no RFC 7919 DH groups), 6.12 has CONFIG_NVME_AUTH=m,
# CONFIG_NVME_HOST_AUTH=y, CONFIG_NVME_TARGET_AUTH=y and
# CONFIG_CRYPTO_DH_RFC7919_GROUPS=y. Used by crates/cli/tests/integration/nvme_auth.rs.
#
#   tests/kernel-vm/kernel-6.12.sh DIR     # then: KVM_DIR=DIR tests/kernel-vm/vm run SCRIPT
#
# The harness's own build skips the kernel download when DIR/vmlinuz exists, so
# this only puts the newer kernel and its (decompressed: busybox modprobe
# loads plain .ko files) modules there, then builds the initrd once, under a
# lock, so concurrent tests do not race on it.
set -eu
DIR=${1:?usage: kernel-6.12.sh DIR}
KVM=$(dirname "$0")/vm
mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9
if [ ! -f "$DIR/vmlinuz" ]; then
  meta=linux-image-6.12-amd64
  pkg=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
  if [ -z "$pkg" ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    pkg=$(apt-cache depends "$meta" | awk '/Depends: linux-image-/{print $2; exit}')
  fi
  [ -n "$pkg" ] || { echo "kernel-6.12: no $meta in the apt sources (bookworm-security)" >&2; exit 1; }
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1) || { rm -rf "$tmp"; echo "kernel-6.12: apt-get download $pkg failed" >&2; exit 1; }
  rm -rf "$DIR/root" "$DIR/initrd"
  dpkg-deb -x "$tmp"/*.deb "$DIR/root"
  rm -rf "$tmp"
  find "$DIR/root/lib/modules" -name '*.ko.xz' -print0 | xargs -0 -r -n 200 xz -d
  cp "$DIR"/root/boot/vmlinuz-* "$DIR/vmlinuz.part"
  mv "$DIR/vmlinuz.part" "$DIR/vmlinuz"
  echo "kernel-6.12: $pkg in $DIR" >&2
fi
if [ ! -d "$DIR/initrd" ] || [ ! -e "$DIR/initrd/etc/nvme/hostnqn" ]; then
  KVM_DIR="$DIR" KVM_TOOLS="${KVM_TOOLS:-}" "$KVM" build >&2
fi
