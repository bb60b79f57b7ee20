#!/usr/bin/env bash
# Builds the rdma_rxe peer VM's guest: Debian 12's kernel (linux-image-amd64, 6.1) and an initramfs
# of busybox-static, rdma-core (libibverbs1, ibverbs-providers, ibverbs-utils, librdmacm1,
# rdmacm-utils, libibumad3), perftest, iproute2 (`rdma`), tcpdump and the libraries they need, with
# `init` (beside this script) as PID 1, and imm_pingpong and ibv_agent (imm_pingpong.c and
# ibv_agent.c beside this script, compiled on the host with gcc against libibverbs-dev, and
# ibv_agent also against librdmacm-dev: Debian 12's rdma-core, as in the guest).
# Packages are fetched with `apt-get download` and unpacked with `dpkg-deb -x`: nothing is
# installed on the host for the guest.
#
# Usage: build-guest.sh [WORKDIR]      (default: $RXEVM_DIR, else ${TMPDIR:-/tmp}/rocemu-rxevm)
# Output: WORKDIR/guest-KEY/{vmlinuz,initrd.img,kernel-version}, KEY = hash of this script,
#         `init`, imm_pingpong.c and ibv_agent.c: a guest is built once per recipe. Downloaded .debs are kept in WORKDIR/debs.
#         The last line on stdout is `GUEST=WORKDIR/guest-KEY`.
# Host tools it needs: apt-get, dpkg-deb, cpio, gzip, kmod (depmod, modprobe), flock, sha256sum,
# gcc, libibverbs-dev and librdmacm-dev; and for the VMs, qemu-system-x86 and iproute2. Missing
# ones among dpkg, cpio, kmod, gcc, libibverbs-dev, librdmacm-dev, qemu-system-x86 and iproute2 are
# installed with apt-get when running as root, unless RXEVM_NO_HOST_APT=1.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${1:-${RXEVM_DIR:-${TMPDIR:-/tmp}/rocemu-rxevm}}
mkdir -p "$W"; W=$(cd "$W" && pwd)
KEY=$(cat "$HERE/build-guest.sh" "$HERE/init" "$HERE/imm_pingpong.c" "$HERE/ibv_agent.c" | sha256sum | cut -c1-16)
OUT=$W/guest-$KEY
if [ -f "$OUT/ok" ]; then echo "GUEST=$OUT"; exit 0; fi

# One build at a time per work folder (tests in several processes may ask at once).
exec 9>"$W/build.lock"
flock -w 1800 9 || { echo "build-guest: could not lock $W/build.lock" >&2; exit 1; }
if [ -f "$OUT/ok" ]; then echo "GUEST=$OUT"; exit 0; fi
t0=$(date +%s.%N)
el() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

# ---- host tools -----------------------------------------------------------------------------
export DEBIAN_FRONTEND=noninteractive
# A fresh container has no package lists.
apt-cache show linux-image-amd64 >/dev/null 2>&1 || apt-get update -qq
# The build's tools, and what running the VMs takes (QEMU, ip).
need=()
for t in dpkg-deb:dpkg cpio:cpio gzip:gzip depmod:kmod modprobe:kmod chroot:coreutils \
         gcc:gcc qemu-system-x86_64:qemu-system-x86 ip:iproute2; do
  command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
done
# imm_pingpong and ibv_agent are compiled against the host's rdma-core headers.
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
[ -f /usr/include/rdma/rdma_cma.h ] || need+=(librdmacm-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && [ "${RXEVM_NO_HOST_APT:-0}" != 1 ]; then
    echo "build-guest: installing host tools: ${need[*]}" >&2
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "build-guest: missing host tools (packages: ${need[*]})" >&2; exit 1
  fi
fi

# ---- the package set --------------------------------------------------------------------------
# linux-image-amd64 is a metapackage: its one dependency is the real kernel (linux-image-6.1.0-N-amd64).
KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
[ -n "$KPKG" ] || { echo "build-guest: apt knows no linux-image-amd64 (Debian 12 sources?)" >&2; exit 1; }
KV=${KPKG#linux-image-}
PKGS="busybox-static libibverbs1 ibverbs-providers ibverbs-utils librdmacm1 rdmacm-utils libibumad3 perftest iproute2 tcpdump"
# Everything they depend on, recursively; minus what only matters to a package manager or a login.
LIST=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
         --no-replaces --no-enhances $PKGS \
  | grep -v '^ ' | grep -v '^<' | sort -u \
  | grep -vxE 'adduser|cdebconf|debconf|dpkg|install-info|passwd|libpam.*|libnewt0.52|libslang2|libtextwrap1|libdebian-installer4|readline-common|tar|libsemanage.*|libcap2-bin|pci.ids|sensible-utils|perl-base|init-system-helpers|debianutils|base-files|mawk|gcc-12-base')

# ---- download (kept in $W/debs; only what is missing is fetched) --------------------------------
mkdir -p "$W/debs"
missing=()
while read -r uri file size sum; do
  [ -f "$W/debs/$file" ] || missing+=("$file")
done < <(apt-get download --print-uris $LIST "$KPKG" 2>/dev/null)
if [ ${#missing[@]} -gt 0 ]; then
  # Package names from the file names (NAME_VERSION_ARCH.deb), downloaded into a scratch folder
  # and moved into place only when complete.
  names=$(printf '%s\n' "${missing[@]}" | sed 's/_.*//' | sort -u)
  dl=$(mktemp -d "$W/debs/.dl.XXXXXX")
  (cd "$dl" && apt-get download -qq -o APT::Sandbox::User=root $names) || { rm -rf "$dl"; echo "build-guest: apt-get download failed" >&2; exit 1; }
  mv "$dl"/*.deb "$W/debs/"; rmdir "$dl"
fi
t_dl=$(el)
files=$(apt-get download --print-uris $LIST "$KPKG" 2>/dev/null | awk '{print $2}')
# Versions the archive has replaced are of no further use.
for f in "$W"/debs/*.deb; do
  printf '%s\n' $files | grep -qxF "$(basename "$f")" || rm -f "$f"
done

# ---- assemble -------------------------------------------------------------------------------
B=$(mktemp -d "$W/.build.XXXXXX")
trap 'rm -rf "$B"' EXIT
mkdir -p "$B/kernel" "$B/root"
for f in $files; do
  case $f in
    "$KPKG"_*) dpkg-deb -x "$W/debs/$f" "$B/kernel/";;
    *) dpkg-deb -x "$W/debs/$f" "$B/root/";;
  esac
done
[ -f "$B/kernel/boot/vmlinuz-$KV" ] || { echo "build-guest: no vmlinuz-$KV in $KPKG" >&2; exit 1; }
depmod -b "$B/kernel" "$KV"
R=$B/root
rm -rf "$R"/usr/share/{doc,man,info,locale,lintian,bug,bash-completion,zsh} "$R"/usr/lib/x86_64-linux-gnu/gconv
mkdir -p "$R"/{proc,sys,dev,tmp,run,root,etc/rxevm,var,usr/local/bin}
# busybox's applets where Debian's packages left the name free
for a in $("$R/bin/busybox" --list); do
  for d in bin sbin usr/bin usr/sbin; do [ -e "$R/$d/$a" ] && continue 2; done
  ln -s busybox "$R/bin/$a"
done
# Modules: virtio-net; crc32 (rxe computes the ICRC through the crypto API and does not pull the
# shash in by itself); rdma_rxe with ib_core; ib_uverbs (libibverbs); rdma_ucm (librdmacm: rping,
# perftest -R); ib_umad; af_packet (tcpdump) where it is a module. Order = modprobe's dependency order.
mods=""
for m in virtio_pci virtio_net crc32_generic crc32_pclmul rdma_rxe ib_uverbs rdma_ucm ib_umad af_packet; do
  mods="$mods $(modprobe -d "$B/kernel" -S "$KV" --show-depends "$m" | awk '$1=="insmod"{print $2}')"
done
MD=$B/kernel/lib/modules/$KV
: > "$R/etc/rxevm/modules"
for p in $(printf '%s\n' $mods | awk 'NF && !seen[$0]++'); do
  rel=${p#"$MD"/}
  mkdir -p "$R/lib/modules/$KV/$(dirname "$rel")"
  cp "$p" "$R/lib/modules/$KV/$rel"
  echo "$rel" >> "$R/etc/rxevm/modules"
done
grep -q rdma_rxe "$R/etc/rxevm/modules" || { echo "build-guest: rdma_rxe not found in $KPKG" >&2; exit 1; }
cp "$MD"/modules.order "$MD"/modules.builtin* "$R/lib/modules/$KV/" 2>/dev/null || true
depmod -b "$R" "$KV"
install -m 0755 "$HERE/init" "$R/init"
# Our own tool for immediate data (none of the packaged ones sends it); the host's libc and
# libibverbs are the guest's (Debian 12), so the host's gcc builds for the guest.
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -o "$R/usr/local/bin/imm_pingpong" "$HERE/imm_pingpong.c" -libverbs \
  || { echo "build-guest: compiling imm_pingpong.c failed" >&2; exit 1; }
# The conformance suite's agent over libibverbs and librdmacm (docs/agent-protocol.md;
# scripts/conformance-rxe). librdmacm1 is in the guest's package set for rping and perftest -R.
gcc -std=gnu11 -O2 -Wall -Wextra -Werror -o "$R/usr/local/bin/ibv_agent" "$HERE/ibv_agent.c" -libverbs -lrdmacm \
  || { echo "build-guest: compiling ibv_agent.c failed" >&2; exit 1; }
echo 'root:x:0:0:root:/root:/bin/sh' > "$R/etc/passwd"
echo 'root:x:0:' > "$R/etc/group"
printf '127.0.0.1 localhost\n' > "$R/etc/hosts"
printf 'tcp 6\nudp 17\nicmp 1\n' > "$R/etc/protocols"

# Every program the tests use must find its libraries inside the guest.
for prog in ibv_devinfo ibv_devices ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ib_write_bw ib_read_bw \
            ib_send_bw ib_atomic_bw rping rdma ip tcpdump imm_pingpong ibv_agent; do
  f=""; for d in usr/bin usr/sbin bin sbin usr/local/bin; do [ -f "$R/$d/$prog" ] && { f=$d/$prog; break; }; done
  [ -n "$f" ] || { echo "build-guest: $prog missing from the guest" >&2; exit 1; }
  if chroot "$R" /lib64/ld-linux-x86-64.so.2 --list "/$f" 2>&1 | grep -q 'not found'; then
    echo "build-guest: $prog lacks libraries:" >&2
    chroot "$R" /lib64/ld-linux-x86-64.so.2 --list "/$f" 2>&1 | grep 'not found' >&2; exit 1
  fi
done
[ -f "$R/etc/libibverbs.d/rxe.driver" ] || { echo "build-guest: no rxe provider in ibverbs-providers" >&2; exit 1; }

mkdir -p "$B/out"
cp "$B/kernel/boot/vmlinuz-$KV" "$B/out/vmlinuz"
(cd "$R" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$B/out/initrd.img"
echo "$KV" > "$B/out/kernel-version"
printf '%s\n' $files > "$B/out/packages"
rm -rf "$OUT"; mv "$B/out" "$OUT"; touch "$OUT/ok"
# Older recipes' guests are of no further use.
for g in "$W"/guest-*; do [ "$g" = "$OUT" ] || rm -rf "$g"; done
echo "build-guest: kernel $KV, initrd $(du -h "$OUT/initrd.img" | cut -f1), download ${t_dl}s, total $(el)s" >&2
echo "GUEST=$OUT"
