#!/usr/bin/env bash
# Install what zmem's build, benchmarks and tests need, only where missing.
# Safe to run again; needs root (or sudo) for Debian packages.
set -euo pipefail

need_pkgs=()
want() { # want COMMAND PACKAGE
    command -v "$1" >/dev/null 2>&1 || need_pkgs+=("$2")
}
want cc build-essential
want python3 python3
want mkfs.ext4 e2fsprogs
want losetup mount
want fio fio
want valgrind valgrind
want qemu-io qemu-utils
want nbdinfo libnbd-bin
want nbdfuse libnbd-bin
want nbdkit nbdkit
# zmem's dictionary tests train one with the zstd CLI (--dict PATH).
want zstd zstd
# zmem's kernel-path tests (nbd_fs, nbd_swap) also use these (util-linux):
want fstrim util-linux
want mkswap util-linux
want swapon util-linux
# zmem's remote tier is tested and benchmarked against real Redis clusters
# that the tests start on loopback (Debian's Redis 7, BSD-3).
want redis-server redis-server
want redis-cli redis-tools
# The TLS cluster tests make their certificates with it.
want openssl openssl
# The Debian package is built with dpkg-deb (dpkg-dev for the architecture
# names, binutils for strip).
want dpkg-deb dpkg
want dpkg-architecture dpkg-dev
want strip binutils
# The unit files are checked with systemd-analyze, the manual pages with man.
want systemd-analyze systemd
want man man-db
# zmem bench swap draws its plot with this font.
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_pkgs+=(fonts-dejavu-core)

if ((${#need_pkgs[@]})); then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "setup: installing Debian packages: ${need_pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is missing: install Rust (rustup) first" >&2
    exit 1
fi
# The tree's own gates (scripts/test.sh runs both): rustfmt and clippy.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        echo "setup: installing the rustfmt and clippy components" >&2
        rustup component add rustfmt clippy
    else
        echo "setup: cargo fmt or cargo clippy is missing, and there is no rustup to add them" >&2
        exit 1
    fi
fi
