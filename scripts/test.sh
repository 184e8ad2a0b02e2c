#!/usr/bin/env bash
# Every test: unit, property, stress and (as root, where the kernel has the
# features) the tests that use real kernel devices. Installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RUST_BACKTRACE=1
# Release build of the binary for the end-to-end tests that run it.
cargo build --release -q -p zmem
cargo test --workspace --no-fail-fast -- --test-threads=2
