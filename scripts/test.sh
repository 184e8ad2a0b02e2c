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

# The allocator's unsafe module (mmap, madvise, raw slices) under valgrind's
# memcheck: stable Rust has no Miri or sanitizers here, memcheck needs neither.
if command -v valgrind >/dev/null 2>&1; then
    bin=$(cargo test -q -p zmem-alloc --test pool --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -1)
    echo "memcheck: $bin"
    PROPTEST_CASES=4 valgrind --error-exitcode=99 -q "$bin" --test-threads=1
else
    echo "memcheck: skipped, valgrind is not installed"
fi
