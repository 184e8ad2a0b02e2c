#!/usr/bin/env bash
# Fill `zmem serve --mem-limit 64M` until it refuses: 1 GiB of a tar of
# /usr/lib through nbdcopy (dense), then 20,000 one-page writes 64 KiB apart
# (sparse: every one needs a new index block). Prints the limit, what the
# pool holds and its high-water mark: mem_used_max must not exceed mem_limit.
#   bash scripts/mem-limit-fill.sh [ZMEM_BINARY] [DATA_FILE]
set -euo pipefail
bin=${1:-target/release/zmem}
data=${2:-/tmp/bd/usrlib.tar}
if [ ! -f "$data" ]; then
    mkdir -p "$(dirname "$data")"
    tar cf "$data" /usr/lib/x86_64-linux-gnu 2>/dev/null || true
fi
d=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$d"; }
trap cleanup EXIT
"$bin" serve --size 8G --mem-limit 64M --socket "$d/s" --control "$d/c" >"$d/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$d/s" ] && [ -S "$d/c" ] && break; sleep 0.1; done
head -c $((1 << 30)) "$data" | nbdcopy -- - "nbd+unix:///?socket=$d/s" 2>/dev/null || true
python3 - "$d/s" <<'PY'
import subprocess, sys
sock, cmds = sys.argv[1], []
for i in range(20000):
    cmds += ["-c", f"write -P {i % 251 + 1} {(4 << 30) + i * 65536} 4k"]
    if len(cmds) >= 2000:
        subprocess.run(["qemu-io", "-f", "raw", f"nbd+unix:///?socket={sock}"] + cmds, capture_output=True)
        cmds = []
PY
"$bin" stat --control "$d/c" --json | python3 -c '
import sys, json
s = json.load(sys.stdin); s = s.get("stats", s)
print(json.dumps({k: s[k] for k in ["mem_limit", "mem_used_total", "mem_used_max", "failed_writes"]}))
print("over the limit by", s["mem_used_max"] - s["mem_limit"], "bytes")'
