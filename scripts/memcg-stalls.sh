#!/bin/bash
# How often a churn of 160 MiB in a 64 MiB memory cgroup (v1, OOM killer
# off) stalls at its limit, over one swap system: zmem (optionally with
# EVENTS server replacements, kill and `zmem swap restart` in turn), a plain
# swap file, or kernel zram. Each stall is logged with its time and the
# limit is raised by 8 MiB (what the tests' `Cgroup::run_riding_stalls`
# does). Root; the machine's only swap while it runs.
#
#   scripts/memcg-stalls.sh zmem|file|zram [EVENTS] [SECONDS]
#
# ZMEM=path/to/zmem (default target/release/zmem). Prints one line a stall
# and the workload's "OK ops pages" (or BAD n).
set -euo pipefail
SYS=${1:?zmem, file or zram}
EVENTS=${2:-0}
SECS=${3:-40}
ZMEM=${ZMEM:-target/release/zmem}
WORK=$(mktemp -d /var/tmp/zmem-stalls.XXXXXX)
CG=/sys/fs/cgroup/memory/zmem-stalls-$$
DEV=
cleanup() {
    set +e
    [ -d "$CG" ] && { for p in $(cat "$CG/cgroup.procs"); do kill -KILL "$p"; done; sleep 0.5; rmdir "$CG"; }
    case $SYS in
        zmem) "$ZMEM" swap off --all --run-dir "$WORK/run" >/dev/null ;;
        file) [ -n "$DEV" ] && swapoff "$DEV" ;;
        zram) [ -n "$DEV" ] && { swapoff "$DEV"; echo 1 > /sys/block/zram0/reset; } ;;
    esac
    rm -rf "$WORK"
}
trap cleanup EXIT
cat > "$WORK/churn.py" <<'PY'
import os, sys, time, random
N = int(sys.argv[1]) * 256; secs = float(sys.argv[2])
def page(i, v):
    return bytearray((b"page %08d v%06d " % (i, v)) * 200)[:4096]
ver = [0] * N
pages = [page(i, 0) for i in range(N)]
rng = random.Random(1); t0 = time.time(); ops = bad = 0
while time.time() - t0 < secs:
    for _ in range(2000):
        i = rng.randrange(N)
        if rng.random() < 0.3:
            ver[i] += 1; pages[i] = page(i, ver[i])
        elif pages[i] != page(i, ver[i]):
            bad += 1
        ops += 1
bad += sum(pages[i] != page(i, ver[i]) for i in range(N))
print(("OK %d %d" % (ops, N)) if bad == 0 else "BAD %d" % bad, flush=True)
os._exit(0)
PY
case $SYS in
    zmem) "$ZMEM" swap on --name s0 --size 512M --max-pool 256M --priority 32767 --run-dir "$WORK/run" >/dev/null ;;
    file) DEV=$WORK/swapfile; dd if=/dev/zero of="$DEV" bs=1M count=512 status=none; chmod 600 "$DEV"; mkswap "$DEV" >/dev/null; swapon -p 32767 "$DEV" ;;
    zram) DEV=/dev/zram0; echo 512M > /sys/block/zram0/disksize; mkswap "$DEV" >/dev/null; swapon -p 32767 "$DEV" ;;
    *) echo "zmem, file or zram" >&2; exit 2 ;;
esac
mkdir "$CG"
echo $((64 << 20)) > "$CG/memory.limit_in_bytes"
echo 100 > "$CG/memory.swappiness"
echo 1 > "$CG/memory.oom_control"
T0=$(date +%s%N)
ts() { echo "$(( ($(date +%s%N) - T0) / 1000000 )) ms: $*"; }
( echo $BASHPID > "$CG/cgroup.procs"; exec python3 "$WORK/churn.py" 160 "$SECS" ) > "$WORK/out" &
W=$!
(
    lim=$((64 << 20))
    while kill -0 $W 2>/dev/null; do
        if grep -q "under_oom 1" "$CG/memory.oom_control"; then
            lim=$((lim + (8 << 20))); echo $lim > "$CG/memory.limit_in_bytes"
            ts "stalled at its limit; raised to $((lim >> 20)) MiB"
        fi
        sleep 0.05
    done
) &
if [ "$SYS" = zmem ] && [ "$EVENTS" -gt 0 ]; then
    sleep 10
    for k in $(seq 1 "$EVENTS"); do
        S=$(cat "$WORK/run/s0/ready")
        if [ $((k % 2)) = 1 ]; then ts "kill server $S"; kill -KILL "$S"; else ts "restart server $S"; "$ZMEM" swap restart --name s0 --run-dir "$WORK/run" >/dev/null; fi
        while [ "$(cat "$WORK/run/s0/ready" 2>/dev/null)" = "$S" ]; do sleep 0.01; done
        sleep 1.5
    done
fi
wait $W
cat "$WORK/out"
