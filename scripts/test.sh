#!/usr/bin/env bash
# Every test: unit, property, stress and (as root, where the kernel has the
# features) the tests that use real kernel devices. Installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RUST_BACKTRACE=1
# Every test in full: the long fuzz loops too (a plain `cargo test` runs a
# sample of them).
export ZMEM_THOROUGH=1
# The tree keeps itself tidy: formatting and lints fail the run, as tests do.
cargo fmt --all --check
cargo clippy --workspace --all-targets -q -- -D warnings
# Release build of the binary for the end-to-end tests that run it, and
# the Debian package the install test puts on the machine.
cargo build --release -q -p zmem -p zmem-cache-ffi
bash scripts/package.sh target/debian
cargo test --workspace --no-fail-fast -- --test-threads=2
# The slow tests a plain `cargo test` leaves out (#[ignore]): the remote
# tier's failover matrix (each test waits out a failover) and the remote
# bench end to end; CI runs them. (--workspace: the same feature set as the
# run above, so nothing rebuilds.)
cargo test --workspace --test cluster --test nbd_remote --test bench_remote --no-fail-fast -- --ignored --test-threads=2

# The unsafe code under valgrind's memcheck (stable Rust has no Miri or
# sanitizers here; memcheck needs neither): the allocator's module (mmap,
# madvise, raw slices), and liblz4 fed corrupt streams by zmem-compress's
# property tests.
test_binary() {
    cargo test -q -p "$1" "${@:2}" --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -1
}
if command -v valgrind >/dev/null 2>&1; then
    bin=$(test_binary zmem-alloc --test pool)
    echo "memcheck: $bin"
    PROPTEST_CASES=4 valgrind --error-exitcode=99 -q "$bin" --test-threads=1
    bin=$(test_binary zmem-compress --lib)
    echo "memcheck: $bin"
    PROPTEST_CASES=64 valgrind --error-exitcode=99 -q "$bin" --test-threads=1
else
    echo "memcheck: skipped, valgrind is not installed"
fi
