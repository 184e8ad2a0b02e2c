#!/usr/bin/env bash
# Every test: unit, property, stress and (as root, where the kernel has the
# features) the tests that use real kernel devices. Installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step says how long it took, so a slow suite shows where its time goes.
t0=$SECONDS
step() { # step NAME COMMAND...: the command's status
    local t=$SECONDS rc=0
    "${@:2}" || rc=$?
    echo "test.sh: $1: $((SECONDS - t)) s (total $((SECONDS - t0)) s)$( ((rc == 0)) || echo ", failed: exit $rc")" >&2
    return "$rc"
}
step setup bash scripts/setup.sh
export RUST_BACKTRACE=1
# Every test in full: the long fuzz loops too (a plain `cargo test` runs a
# sample of them).
export ZMEM_THOROUGH=1
# The tree keeps itself tidy: formatting and lints fail the run, as tests do.
step fmt cargo fmt --all --check
# The lints run inside the tests' build: clippy-driver compiles the
# workspace's crates (what `cargo clippy` sets up, but building instead of
# checking), so the dependencies are compiled once, not checked once more
# besides. Every cargo command below keeps these two variables, or cargo
# would rebuild the workspace without them. What it lints is what `cargo
# clippy --workspace --all-targets -- -D warnings` lints (--all-targets:
# the benches too).
export RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver)
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
# The tests' build, then the Debian package the install test puts on the
# machine, made from that build's binary and library (a release build
# would compile everything a third time, for a package whose files are the
# same but for the code's optimisation).
step test-build+clippy cargo test --workspace --all-targets -q --no-run
step package bash scripts/package.sh target/debian --from target/debug
# The tests run in two lines side by side. The tests that take turns at
# what the machine has one of (zmem_testkit::machine: swap areas, zram,
# zswap, blkio throttles) are minutes of real
# workloads that mostly wait on the kernel, one at a time; every other test
# runs beside them. A test left out of this list still takes its turn; it
# only waits for it in the other line.
machine_tests=(swap bench_swap bench_cache bench_blockdev nbd_swap bench_store kernel_zram mount)
machine_args=()
for t in "${machine_tests[@]}"; do machine_args+=(--test "$t"); done
# Every other test target of the workspace, by name (--workspace with
# targets named: the same feature set as the build, so nothing rebuilds).
other_args=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import sys, json
skip = set(sys.argv[1:])
names = sorted({t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"] if "test" in t["kind"]} - skip)
print(" ".join("--test " + n for n in names))' "${machine_tests[@]}")
machine_log=target/machine-tests.log
# A test that hangs would hold CI to its limit and print nothing of the
# line it hung in: each line has a deadline (several times what it takes),
# past which `timeout` ends it, so the run fails with the line's log,
# where libtest names the test that "has been running for over 60 s".
deadline() { # deadline MINUTES COMMAND...: the command's status
    local rc=0
    timeout --kill-after=60 "$(($1 * 60))" "${@:2}" || rc=$?
    # 124: timed out (TERM); 137: killed a minute after that.
    if ((rc == 124 || rc == 137)); then
        echo "test.sh: \`${*:2:3} ...\` ran past its deadline of $1 minutes: a test hung (see its log)" >&2
    fi
    return "$rc"
}
step machine-tests deadline 40 cargo test --workspace "${machine_args[@]}" --no-fail-fast -- --test-threads=2 >"$machine_log" 2>&1 &
machine_pid=$!
mc_pid=""
trap '[ -z "$machine_pid" ] || kill "$machine_pid" 2>/dev/null; [ -z "$mc_pid" ] || kill "$mc_pid" 2>/dev/null' EXIT
status=0
# shellcheck disable=SC2086 # one word per argument
step tests deadline 30 cargo test --workspace --lib --bins $other_args --no-fail-fast -- --test-threads=2 || status=$?
step doc-tests cargo test --workspace --doc --no-fail-fast || status=$?
# The unsafe code under valgrind's memcheck (stable Rust has no Miri or
# sanitizers here; memcheck needs neither): the allocator's module (shared
# mappings of its arena, raw slices and words; its tests, and opening an
# arena again), liblz4 fed corrupt streams by zmem-compress's
# property tests, the server's pageout and mallinfo2 (its memory report)
# and the files a server takes from its keeper (zmem-server's three unsafe
# modules). Not here: zmem-fuse's one ioctl (FUSE_DEV_IOC_CLONE), whose
# tests mount a FUSE file served by the test itself, which under
# valgrind did not finish in 10 minutes. It runs at the lowest priority
# beside the failover matrix below, which mostly waits out failovers.
# A test binary of the workspace's build (nothing is rebuilt): the
# executable of target NAME (KIND lib or test) of package PKG.
test_binary() { # test_binary PKG KIND NAME
    local bin
    bin=$(cargo test --workspace -q --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import sys, json
pkg, kind, name = sys.argv[1:]
for l in sys.stdin:
    m = json.loads(l)
    t = m.get("target", {})
    if (m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]
            and t.get("name") == name and kind in t.get("kind", []) and ("/" + pkg + "#") in m["package_id"]):
        print(m["executable"])' "$@")
    [ -n "$bin" ] || { echo "memcheck: no test binary $3 ($2) of $1 in the build" >&2; return 1; }
    echo "$bin"
}
memcheck() { # memcheck POOL_TESTS COMPRESS_TESTS SERVER_TESTS ARENA_TESTS
    echo "memcheck: $1"
    PROPTEST_CASES=4 deadline 15 nice -n 19 valgrind --error-exitcode=99 -q "$1" --test-threads=1
    echo "memcheck: $4"
    deadline 15 nice -n 19 valgrind --error-exitcode=99 -q "$4" --test-threads=1
    echo "memcheck: $2"
    PROPTEST_CASES=64 deadline 15 nice -n 19 valgrind --error-exitcode=99 -q "$2" --test-threads=1
    echo "memcheck: $3 (pageout, mallinfo2 in the memory report, files inherited from the keeper)"
    deadline 15 nice -n 19 valgrind --error-exitcode=99 -q "$3" --test-threads=1 pageout memory inherit
}
mc_log=target/memcheck.log
if command -v valgrind >/dev/null 2>&1; then
    pool_tests=$(test_binary zmem-alloc test pool)
    compress_tests=$(test_binary zmem-compress lib zmem_compress)
    server_tests=$(test_binary zmem-server lib zmem_server)
    arena_tests=$(test_binary zmem-alloc test arena)
    step memcheck memcheck "$pool_tests" "$compress_tests" "$server_tests" "$arena_tests" >"$mc_log" 2>&1 &
    mc_pid=$!
else
    echo "memcheck: skipped, valgrind is not installed"
fi

# The slow tests a plain `cargo test` leaves out (#[ignore]): the remote
# tier's failover matrix (each test waits out a failover) and the remote
# bench end to end; CI runs them. (--workspace: the same feature set as the
# run above, so nothing rebuilds.) Three at a time: each has a cluster of
# its own and mostly waits for it.
step ignored-tests deadline 40 cargo test --workspace --test cluster --test nbd_remote --test bench_remote --no-fail-fast -- --ignored --test-threads=3 || status=$?

# A job started in the background above: wait for it, print its log, and
# fold a failure into the run's status.
collect() { # collect NAME PID LOG
    local rc=0
    wait "$2" || rc=$?
    cat "$3"
    if ((rc != 0)); then
        echo "$1 failed (exit $rc): $3 above" >&2
        status=$rc
    fi
}
collect "the machine's tests" "$machine_pid" "$machine_log"
machine_pid=""
if [ -n "$mc_pid" ]; then
    collect memcheck "$mc_pid" "$mc_log"
    mc_pid=""
fi
if ((status != 0)); then
    echo "tests failed (exit $status)" >&2
    exit "$status"
fi
echo "test.sh: all passed in $((SECONDS - t0)) s" >&2
