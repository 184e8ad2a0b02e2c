#!/usr/bin/env bash
# The swap path's cost: per-page server CPU (utime+stime of the server
# processes per 4 KiB request) and IOPS, for the two ways a zmem pool becomes
# a kernel block device: the FUSE image (zmem swap) and NBD + nbdfuse (zmem
# serve). fio, 4 KiB random writes then reads, iodepth 32, direct I/O, on a
# loop device with direct I/O over each. Root.
#   bash scripts/swap-path-cost.sh   (RT=seconds per job, THREADS=FUSE workers)
Z=${Z:-$(cd "$(dirname "$0")/.." && pwd)/target/release/zmem}
RT=${RT:-10}
cpu() { awk '{print $14+$15}' /proc/$1/stat; }   # utime+stime ticks
run_fio() { fio --name=t --filename=$1 --rw=$2 --bs=4k --direct=1 --ioengine=libaio --iodepth=32 --numjobs=1 --size=512M --runtime=$RT --time_based --group_reporting --output-format=json 2>/dev/null | python3 -c 'import sys,json; j=json.load(sys.stdin)["jobs"][0]; k="write" if j["write"]["io_bytes"] else "read"; print(int(j[k]["iops"]), j[k]["total_ios"])'; }
measure() { # $1 label $2 dev $3.. pids
  label=$1; dev=$2; shift 2
  # fill so reads hit data
  fio --name=f --filename=$dev --rw=write --bs=1M --direct=1 --size=512M --buffer_compress_percentage=50 --refill_buffers 2>/dev/null >/dev/null
  for rw in randwrite randread; do
    c0=0; for p in "$@"; do c0=$((c0+$(cpu $p))); done
    read iops ios < <(run_fio $dev $rw)
    c1=0; for p in "$@"; do c1=$((c1+$(cpu $p))); done
    tk=$(getconf CLK_TCK)
    echo "$label $rw iops=$iops server_cpu_us_per_page=$(python3 -c "print(round(($c1-$c0)/$tk*1e6/$ios,2))")"
  done
}
d=$(mktemp -d)
lo=; fp=; np=; fz=
cleanup() {
  [ -n "$lo" ] && losetup -d "$lo" 2>/dev/null
  mountpoint -q "$d/m" 2>/dev/null && umount -l "$d/m"
  for p in $fp $np $fz; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null; rm -rf "$d"
}
trap cleanup EXIT
# FUSE
mkdir -p $d/f
$Z swap serve --size 1G --dir $d/f --max-pool 50% --threads ${THREADS:-2} > $d/f.log 2>&1 &
fp=$!
while [ ! -e $d/f/ready ]; do sleep 0.05; done
lo=$(losetup --direct-io=on --show -f $d/f/mnt/image)
measure fuse $lo $fp
losetup -d $lo; lo=; kill $fp; wait $fp; fp=
# NBD + nbdfuse
$Z serve --size 1G --socket $d/n.sock --control none --max-pool 50% > $d/n.log 2>&1 &
np=$!
while [ ! -S $d/n.sock ]; do sleep 0.05; done
mkdir -p $d/m; nbdfuse $d/m --unix $d/n.sock & fz=$!
while [ ! -e $d/m/nbd ]; do sleep 0.05; done
lo=$(losetup --direct-io=on --show -f $d/m/nbd)
measure nbd+nbdfuse $lo $np $fz
losetup -d $lo; lo=
