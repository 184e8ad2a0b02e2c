#!/usr/bin/env bash
# A first cut of the seed experiment (issue 9 asks for it as `zmem bench swap`):
# cargo build --release -j4 of zmem in a 400 MiB memory cgroup, swapping to:
# a swap file on ext4 (the VM disk), kernel zswap (lzo) over the same file,
# zmem swap (FUSE image + loop). Same run, sequential. Restores everything.
# Memory is NOT equal yet: the zmem server runs outside the cgroup (sharing
# it needs PR_SET_IO_FLUSHER or a reserved pool, see docs/ARCHITECTURE.md),
# while kernel zswap's pool is charged to it. Prints one line per system:
# wall time, pswpin/pswpout/major faults, the disk's own read/write ops and
# bytes (/sys/block/DEV/stat), the cgroup's peak.
set -u
Z=${Z:-$(cd "$(dirname "$0")/.." && pwd)/target/release/zmem}
REPO=$(cd "$(dirname "$0")/.." && pwd)
SRC=/tmp/swapcmp-src; CG=/sys/fs/cgroup/memory/zswapcmp; SWF=/var/tmp/zswapcmp.swap; RD=/tmp/swapcmp-run
LIMIT=${LIMIT:-400}
old_zswap=$(cat /sys/module/zswap/parameters/enabled); old_comp=$(cat /sys/module/zswap/parameters/compressor)
cleanup() {
  swapoff $SWF 2>/dev/null; rm -f $SWF
  $Z swap off --all --run-dir $RD >/dev/null 2>&1
  echo $old_comp > /sys/module/zswap/parameters/compressor; echo $old_zswap > /sys/module/zswap/parameters/enabled
  rmdir $CG 2>/dev/null
}
trap cleanup EXIT
rm -rf $SRC; mkdir -p $SRC; (cd "$REPO" && git archive HEAD) | tar x -C $SRC
mkdir -p $CG; echo $((LIMIT<<20)) > $CG/memory.limit_in_bytes; echo 100 > $CG/memory.swappiness
dev=$(lsblk -no PKNAME $(findmnt -no SOURCE /) 2>/dev/null); dev=${dev:-vda}
vmstat() { awk '/^pswpin|^pswpout|^pgmajfault/{printf "%s=%s ", $1, $2}' /proc/vmstat; }
disk() { awk '{printf "%.0f %.0f %.0f %.0f\n", $1, $3*512, $5, $7*512}' /sys/block/$dev/stat; }  # rd_ios rd_bytes wr_ios wr_bytes
build() { # label
  rm -rf $SRC/target; sync; echo 3 > /proc/sys/vm/drop_caches
  v0=($(awk '/^pswpin|^pswpout|^pgmajfault/{print $2}' /proc/vmstat)); d0=($(disk))
  t0=$(date +%s.%N)
  sh -c "echo \$\$ > $CG/cgroup.procs && cd $SRC && exec cargo build --release --offline -q -j4 -p zmem" > /tmp/swapcmp-$1.log 2>&1
  rc=$?
  t1=$(date +%s.%N)
  v1=($(awk '/^pswpin|^pswpout|^pgmajfault/{print $2}' /proc/vmstat)); d1=($(disk))
  printf "%-10s rc=%d wall=%.1fs pswpin=%d pswpout=%d majflt=%d disk_rd_ops=%d disk_rd=%dMB disk_wr_ops=%d disk_wr=%dMB cg_max=%dMB\n" $1 $rc $(echo "$t1-$t0" | bc) $((v1[0]-v0[0])) $((v1[1]-v0[1])) $((v1[2]-v0[2])) $((d1[0]-d0[0])) $(((d1[1]-d0[1])>>20)) $((d1[2]-d0[2])) $(((d1[3]-d0[3])>>20)) $(( $(cat $CG/memory.max_usage_in_bytes)>>20 ))
  echo 0 > $CG/memory.max_usage_in_bytes
}
fallocate -l 4G $SWF; chmod 600 $SWF; mkswap -q $SWF
swapon $SWF; build disk; swapoff $SWF || echo "swapoff after disk failed"
echo lzo > /sys/module/zswap/parameters/compressor; echo Y > /sys/module/zswap/parameters/enabled
swapon $SWF; build zswap; swapoff $SWF || echo "swapoff after zswap failed"
echo N > /sys/module/zswap/parameters/enabled
$Z swap on --name b0 --size 4G --run-dir $RD >/dev/null && build zmem-fuse
$Z stat --control $RD/b0/control.sock | grep mm_stat
