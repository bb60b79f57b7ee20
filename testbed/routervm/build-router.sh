#!/usr/bin/env bash
# Builds the router VM's guest for scripts/cc-testbed (MARKER=vm): Debian 12's kernel
# (linux-image-amd64, 6.1, which has sch_htb and sch_red as modules, unlike the host's kernel) and
# an initramfs of busybox-static and iproute2 (tc) with the libraries they need, `init` (beside
# this script) as PID 1. The same recipe as testbed/rxevm/build-guest.sh, smaller: no rdma-core.
# Packages are fetched with `apt-get download` (or taken from the rxevm lab's download folder,
# $RXEVM_DIR/debs, when it has the same file) and unpacked with `dpkg-deb -x`: nothing is
# installed on the host for the guest.
#
# Usage: build-router.sh [WORKDIR]     (default: $ROUTERVM_DIR, else ${TMPDIR:-/tmp}/rocemu-routervm)
# Output: WORKDIR/guest-KEY/{vmlinuz,initrd.img,kernel-version}, KEY = hash of this script and
#         `init`: a guest is built once per recipe. The last line on stdout is `GUEST=WORKDIR/guest-KEY`.
# Host tools: apt-get, dpkg-deb, cpio, gzip, kmod (depmod, modprobe), flock, sha256sum; to run
# it, qemu-system-x86 and iproute2 (missing ones are installed with apt-get when root).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${1:-${ROUTERVM_DIR:-${TMPDIR:-/tmp}/rocemu-routervm}}
mkdir -p "$W"; W=$(cd "$W" && pwd)
KEY=$(cat "$HERE/build-router.sh" "$HERE/init" | sha256sum | cut -c1-16)
OUT=$W/guest-$KEY
if [ -f "$OUT/ok" ]; then echo "GUEST=$OUT"; exit 0; fi
exec 9>"$W/build.lock"
flock -w 1800 9 || { echo "build-router: could not lock $W/build.lock" >&2; exit 1; }
if [ -f "$OUT/ok" ]; then echo "GUEST=$OUT"; exit 0; fi
export DEBIAN_FRONTEND=noninteractive
apt-cache show linux-image-amd64 >/dev/null 2>&1 || apt-get update -qq
# Missing host tools are installed with apt-get when running as root (as build-guest.sh does),
# unless RXEVM_NO_HOST_APT=1.
need=()
for t in dpkg-deb:dpkg cpio:cpio gzip:gzip depmod:kmod modprobe:kmod chroot:coreutils \
         qemu-system-x86_64:qemu-system-x86 ip:iproute2; do
  command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && [ "${RXEVM_NO_HOST_APT:-0}" != 1 ]; then
    echo "build-router: installing host tools: ${need[*]}" >&2
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "build-router: missing host tools (packages: ${need[*]})" >&2; exit 1
  fi
fi
KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
[ -n "$KPKG" ] || { echo "build-router: apt knows no linux-image-amd64 (Debian 12 sources?)" >&2; exit 1; }
KV=${KPKG#linux-image-}
LIST=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
         --no-replaces --no-enhances busybox-static iproute2 \
  | grep -v '^ ' | grep -v '^<' | sort -u \
  | grep -vxE 'adduser|cdebconf|debconf|dpkg|install-info|passwd|libpam.*|libnewt0.52|libslang2|libtextwrap1|libdebian-installer4|readline-common|tar|libsemanage.*|libcap2-bin|pci.ids|sensible-utils|perl-base|init-system-helpers|debianutils|base-files|mawk|gcc-12-base')
mkdir -p "$W/debs"
RX=${RXEVM_DIR:-${TMPDIR:-/tmp}/rocemu-rxevm}/debs
files=$(apt-get download --print-uris $LIST "$KPKG" 2>/dev/null | awk '{print $2}')
missing=()
for f in $files; do
  [ -f "$W/debs/$f" ] && continue
  if [ -f "$RX/$f" ]; then cp "$RX/$f" "$W/debs/$f.part" && mv "$W/debs/$f.part" "$W/debs/$f"; else missing+=("$f"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
  names=$(printf '%s\n' "${missing[@]}" | sed 's/_.*//' | sort -u)
  dl=$(mktemp -d "$W/debs/.dl.XXXXXX")
  (cd "$dl" && apt-get download -qq -o APT::Sandbox::User=root $names) || { rm -rf "$dl"; echo "build-router: apt-get download failed" >&2; exit 1; }
  mv "$dl"/*.deb "$W/debs/"; rmdir "$dl"
fi
for f in "$W"/debs/*.deb; do printf '%s\n' $files | grep -qxF "$(basename "$f")" || rm -f "$f"; done

B=$(mktemp -d "$W/.build.XXXXXX")
trap 'rm -rf "$B"' EXIT
mkdir -p "$B/kernel" "$B/root"
for f in $files; do
  case $f in
    "$KPKG"_*) dpkg-deb -x "$W/debs/$f" "$B/kernel/";;
    *) dpkg-deb -x "$W/debs/$f" "$B/root/";;
  esac
done
[ -f "$B/kernel/boot/vmlinuz-$KV" ] || { echo "build-router: no vmlinuz-$KV in $KPKG" >&2; exit 1; }
depmod -b "$B/kernel" "$KV"
R=$B/root
rm -rf "$R"/usr/share/{doc,man,info,locale,lintian,bug,bash-completion,zsh} "$R"/usr/lib/x86_64-linux-gnu/gconv
mkdir -p "$R"/{proc,sys,dev,tmp,run,root,etc/routervm,var}
for a in $("$R/bin/busybox" --list); do
  for d in bin sbin usr/bin usr/sbin; do [ -e "$R/$d/$a" ] && continue 2; done
  ln -s busybox "$R/bin/$a"
done
# Modules: virtio-net, and the qdiscs of the bottleneck: htb (the shaper) and red (the ECN
# marker), with what they pull in. Order = modprobe's dependency order.
mods=""
for m in virtio_pci virtio_net sch_htb sch_red; do
  mods="$mods $(modprobe -d "$B/kernel" -S "$KV" --show-depends "$m" | awk '$1=="insmod"{print $2}')"
done
MD=$B/kernel/lib/modules/$KV
: > "$R/etc/routervm/modules"
for p in $(printf '%s\n' $mods | awk 'NF && !seen[$0]++'); do
  rel=${p#"$MD"/}
  mkdir -p "$R/lib/modules/$KV/$(dirname "$rel")"
  cp "$p" "$R/lib/modules/$KV/$rel"
  echo "$rel" >> "$R/etc/routervm/modules"
done
grep -q sch_red "$R/etc/routervm/modules" || { echo "build-router: sch_red not found in $KPKG" >&2; exit 1; }
install -m 0755 "$HERE/init" "$R/init"
echo 'root:x:0:0:root:/root:/bin/sh' > "$R/etc/passwd"
echo 'root:x:0:' > "$R/etc/group"
if chroot "$R" /lib64/ld-linux-x86-64.so.2 --list /sbin/tc 2>&1 | grep -q 'not found'; then
  echo "build-router: tc lacks libraries:" >&2
  chroot "$R" /lib64/ld-linux-x86-64.so.2 --list /sbin/tc 2>&1 | grep 'not found' >&2; exit 1
fi
mkdir -p "$B/out"
cp "$B/kernel/boot/vmlinuz-$KV" "$B/out/vmlinuz"
(cd "$R" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$B/out/initrd.img"
echo "$KV" > "$B/out/kernel-version"
rm -rf "$OUT"; mv "$B/out" "$OUT"; touch "$OUT/ok"
for g in "$W"/guest-*; do [ "$g" = "$OUT" ] || rm -rf "$g"; done
echo "build-router: kernel $KV, initrd $(du -h "$OUT/initrd.img" | cut -f1)" >&2
echo "GUEST=$OUT"
