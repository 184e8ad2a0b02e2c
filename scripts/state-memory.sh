#!/bin/bash
# What a device's kept state costs in memory: the same data stored in a
# `zmem serve --size 1G` RAM device by each binary given (e.g. one from
# before the pool could be kept, and one now), with each one's pool books
# (`mem_used_total`, `index_bytes`, `ledger_bytes`) and its server's
# resident memory. The data: 512 MiB of the files under /usr/lib and
# /usr/share (DATA=file to give another).
#
#   scripts/state-memory.sh ZMEM_BIN [ZMEM_BIN...]
#
# Needs nbdcopy (scripts/setup.sh installs it); no root.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 ZMEM_BIN [ZMEM_BIN...]" >&2; exit 2; }
WORK=$(mktemp -d /var/tmp/zmem-state-memory.XXXXXX)
KEEPER=
cleanup() {
    [ -n "$KEEPER" ] && kill -TERM "$KEEPER" 2>/dev/null && wait "$KEEPER" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
DATA=${DATA:-$WORK/data.img}
if [ ! -f "$DATA" ]; then
    find /usr/lib /usr/share -type f -size +64k 2>/dev/null | sort | head -4000 | xargs cat 2>/dev/null | head -c 512M > "$DATA" || true
fi
echo "data: $DATA, $(stat -c %s "$DATA") bytes"
printf '%-40s %12s %12s %14s %12s %12s %10s\n' binary orig_bytes compr_bytes mem_used_total index_bytes ledger_bytes rss_kib
for bin in "$@"; do
    rm -f "$WORK/n.sock" "$WORK/c.sock"
    "$bin" serve --size 1G --socket "$WORK/n.sock" --control "$WORK/c.sock" 2>"$WORK/serve.log" &
    KEEPER=$!
    for _ in $(seq 200); do [ -S "$WORK/c.sock" ] && break; sleep 0.1; done
    nbdcopy "$DATA" "nbd+unix:///?socket=$WORK/n.sock"
    # The server: the keeper's child, or the process itself before keepers.
    server=$(awk '{print $1}' "/proc/$KEEPER/task/$KEEPER/children" 2>/dev/null)
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/${server:-$KEEPER}/status")
    "$bin" stat --control "$WORK/c.sock" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)["stats"]
print("%-40s %12d %12d %14d %12d %12s %10s" % (sys.argv[1][-40:], s["orig_data_size"], s["compr_data_size"], s["mem_used_total"], s.get("index_bytes", 0), s.get("ledger_bytes", "-"), sys.argv[2]))
' "$bin" "$rss"
    kill -TERM "$KEEPER"
    wait "$KEEPER" || true
    KEEPER=
done
