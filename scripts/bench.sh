#!/usr/bin/env bash
# The main job on the built-in default data set: `zmem bench store` on
# /usr/lib/x86_64-linux-gnu plus a live process's anonymous memory, side by
# side with the raw compressor and (as root) kernel zram. Extra arguments go
# to `zmem bench store` (e.g. --json, --compressor zstd, --dedup on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -q -p zmem
exec ./target/release/zmem bench store "$@"
