#!/usr/bin/env bash
# Build zmem_VERSION_amd64.deb with dpkg-deb (Debian's own tool): the
# binary, libzmemcache.so and its header, the systemd units, the example
# configurations, the manual pages and the shell completions (both written
# by the binary itself from its clap definitions).
#   bash scripts/package.sh [OUTDIR]             (default target/debian)
#   bash scripts/package.sh OUTDIR --from DIR    package what is built in DIR
# --from takes the binary and the library already built (scripts/test.sh
# packages its test build, so as not to compile everything a third time);
# without it the release build is made and packaged.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/debian}
from=""
if (($# > 1)); then
    [ "$2" = --from ] && (($# == 3)) || { echo "usage: bash scripts/package.sh [OUTDIR [--from DIR]]" >&2; exit 2; }
    from=$3
fi
for t in dpkg-deb gzip strip; do
    command -v "$t" >/dev/null || { echo "package: $t is missing (bash scripts/setup.sh installs it)" >&2; exit 1; }
done
if [ -z "$from" ]; then
    cargo build --release -q -p zmem -p zmem-cache-ffi
    from=target/release
fi
bin=$from/zmem
# The library as cargo left it in deps/ (a test build copies it no higher).
lib=$from/deps/libzmemcache.so
for f in "$bin" "$lib"; do
    [ -f "$f" ] || { echo "package: $f is missing: build it first (cargo build --release -p zmem -p zmem-cache-ffi)" >&2; exit 1; }
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
d() { install -d -m755 "$stage/$1"; }

d usr/bin; install -m755 "$bin" "$stage/usr/bin/zmem"
strip --strip-debug "$stage/usr/bin/zmem"
d "usr/lib/$multiarch"; install -m644 "$lib" "$stage/usr/lib/$multiarch/libzmemcache.so"
strip --strip-debug "$stage/usr/lib/$multiarch/libzmemcache.so"
d usr/include; install -m644 crates/zmem-cache-ffi/include/zmem_cache.h "$stage/usr/include/zmem_cache.h"
d lib/systemd/system
install -m644 contrib/systemd/zmem-swap.service contrib/systemd/zmem-serve@.service "$stage/lib/systemd/system/"
d usr/share/doc/zmem/examples
install -m644 contrib/systemd/swap.conf contrib/systemd/serve-example.env "$stage/usr/share/doc/zmem/examples/"
cat > "$stage/usr/share/doc/zmem/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: zmem

Files: *
License: MIT or Apache-2.0
 On Debian systems, the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
COPYRIGHT
d usr/share/man/man1
"$bin" man "$stage/usr/share/man/man1" >/dev/null
gzip -9n "$stage"/usr/share/man/man1/*.1
d usr/share/bash-completion/completions; "$bin" completions bash > "$stage/usr/share/bash-completion/completions/zmem"
d usr/share/zsh/vendor-completions; "$bin" completions zsh > "$stage/usr/share/zsh/vendor-completions/_zmem"
d usr/share/fish/vendor_completions.d; "$bin" completions fish > "$stage/usr/share/fish/vendor_completions.d/zmem.fish"
find "$stage" -type f -exec chmod go-w {} +

d DEBIAN
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: zmem
Version: $version
Architecture: $arch
Maintainer: zmem developers <zmem@example.org>
Installed-Size: $size
Depends: libc6
Recommends: util-linux, fuse3
Suggests: redis-server
Section: admin
Priority: optional
Homepage: https://example.org/zmem
Description: compressed memory for Linux, in userspace
 zmem does the jobs of zram (a compressed RAM block device, over NBD or a
 FUSE file), zswap (a compressed swap device with writeback to a file or a
 Redis Cluster) and zcache (a compressed cache of clean pages, also as a C
 library, libzmemcache), without changing the kernel.
CONTROL
cat > "$stage/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    ldconfig
    if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
    # An upgrade: swap devices that are on get servers of the new binary,
    # their pages and swap staying where they are.
    if [ -n "$2" ] && ls /run/zmem/swap/*/state.json >/dev/null 2>&1; then
        /usr/bin/zmem swap restart --all || echo "zmem: some swap devices keep their old server (see above)" >&2
    fi
fi
SCRIPT
cat > "$stage/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
# Devices must go down while the binary is still there.
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop zmem-swap.service 'zmem-serve@*.service' || true
fi
SCRIPT
cat > "$stage/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = purge ]; then
    ldconfig
    if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
fi
SCRIPT
chmod 755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"
mkdir -p "$out"
deb="$out/zmem_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
