#!/usr/bin/env python3
"""Abuse a live `zmem serve` while real clients verify their data.

Usage: python3 scripts/abuse.py [--zmem PATH] [--seconds N] [--json]

Two phases, each against a fresh server:

1. Pool full (no backing store, --max-pool 24M). fio (nbd engine) writes a
   16 MiB region with crc32c verification, then again and again, while a filler
   client writes incompressible junk elsewhere until the pool refuses it
   (ENOSPC), discards it and starts over. fio's pages are incompressible, so
   their overwrites are rewrites in place: they must never be refused.
2. Backing disk full (--max-pool 8M, --backing with --backing-limit 24M).
   fio writes and verifies its region once, then the filler fills the rest
   until the disk is full and keeps pushing, while fio re-reads and
   verifies the region over and over.

Meanwhile, in both phases, abusers run in loops: silent connections that
never finish the handshake, half-open handshakes, clients that ask for
megabytes and never read the replies, clients that send a 32 MiB WRITE
header and stall, garbage and truncated handshakes, and qemu-io writers
killed with SIGKILL in mid-request. A real client (nbdinfo) connects every
half second; a refusal counts.

It reports what the real clients did (operations, bytes verified, wrong
bytes, refused connections) and what the abusers did. Exit status 1 if any
byte was wrong, any real client was refused or fio reported an error.
"""

import argparse
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

NBDMAGIC = b"NBDMAGICIHAVEOPT"
IHAVEOPT = 0x49484156454F5054
REQ_MAGIC = 0x25609513
MIB = 1 << 20


def connect(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    return s


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        d = s.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b


def handshake(s):
    recv_exact(s, 18)
    s.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes
    s.sendall(struct.pack(">QII", IHAVEOPT, 1, 0))  # NBD_OPT_EXPORT_NAME ""
    recv_exact(s, 10)


def request(typ, handle, offset, length):
    return struct.pack(">IHHQQI", REQ_MAGIC, 0, typ, handle, offset, length)


class Abusers:
    def __init__(self, sock, stop, dev_size):
        self.sock, self.stop, self.size = sock, stop, dev_size
        self.counts = {}
        self.lock = threading.Lock()

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def loop(self, what, fn, pause):
        while not self.stop.is_set():
            try:
                fn()
            except (OSError, EOFError, socket.timeout):
                pass
            self.count(what)
            time.sleep(pause)

    # Abusers hold on longer than the server's timeouts (3 s handshake,
    # 5 s I/O), so the server has to drop them, not they it.
    HOLD = 7

    def silent(self):
        conns = [connect(self.sock) for _ in range(20)]
        time.sleep(self.HOLD)
        for c in conns:
            c.close()

    def half_open(self):
        s = connect(self.sock)
        recv_exact(s, 18)
        s.sendall(struct.pack(">I", 3) + struct.pack(">Q", IHAVEOPT)[:5])
        time.sleep(self.HOLD)
        s.close()

    def slow_reader(self):
        s = connect(self.sock)
        handshake(s)
        for h in range(32):
            s.sendall(request(0, h, 0, MIB))
        time.sleep(self.HOLD)
        s.close()

    def stalled_write(self):
        s = connect(self.sock)
        handshake(s)
        s.sendall(request(1, 1, 0, 32 * MIB) + b"\0" * 4096)
        time.sleep(self.HOLD)
        s.close()

    def garbage(self):
        s = connect(self.sock)
        kind = random.randrange(3)
        if kind == 0:
            s.sendall(os.urandom(random.randrange(1, 200)))
        elif kind == 1:
            recv_exact(s, 18)
            s.sendall(struct.pack(">I", 3) + os.urandom(random.randrange(1, 40)))
        else:
            handshake(s)
            s.sendall(os.urandom(random.randrange(1, 300)))
        s.settimeout(2)
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass
        s.close()

    def killed_writer(self):
        uri = "nbd+unix:///?socket=" + self.sock
        off = random.randrange(self.size // 2 // MIB, self.size // MIB - 4) * MIB
        p = subprocess.Popen(
            ["qemu-io", "-f", "raw", uri, "-c", "write -P 7 %d 4M" % off],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(random.uniform(0.0, 0.05))
        p.send_signal(signal.SIGKILL)
        p.wait()

    def start(self):
        plan = [
            ("silent connections (x20)", self.silent, 0.1),
            ("half-open handshakes", self.half_open, 0.05),
            ("slow readers", self.slow_reader, 0.1),
            ("stalled 32 MiB writes", self.stalled_write, 0.1),
            ("garbage and truncated handshakes", self.garbage, 0.0),
            ("qemu-io killed mid-request", self.killed_writer, 0.05),
        ]
        ts = []
        for what, fn, pause in plan:
            for _ in range(2):
                t = threading.Thread(target=self.loop, args=(what, fn, pause), daemon=True)
                t.start()
                ts.append(t)
        return ts


def filler(sock, stop, base, size, stats):
    """Write incompressible junk from `base` until refused, discard, repeat."""
    while not stop.is_set():
        try:
            s = connect(sock)
            handshake(s)
            off, h = base, 0
            while not stop.is_set() and off + MIB <= base + size:
                s.sendall(request(1, h, off, MIB) + os.urandom(MIB))
                magic, err, _ = struct.unpack(">IIQ", recv_exact(s, 16))
                h += 1
                if err:
                    stats["enospc"] = stats.get("enospc", 0) + 1
                    break
                stats["mib_written"] = stats.get("mib_written", 0) + 1
                off += MIB
            s.sendall(request(4, h, base, size))  # TRIM our region
            recv_exact(s, 16)
            stats["rounds"] = stats.get("rounds", 0) + 1
            s.sendall(request(2, 0, 0, 0))
            s.close()
        except (OSError, EOFError, socket.timeout) as e:
            stats["errors"] = stats.get("errors", 0) + 1
            stats["last_error"] = str(e)
            time.sleep(0.1)


def real_clients(sock, stop, stats):
    uri = "nbd+unix:///?socket=" + sock
    while not stop.is_set():
        r = subprocess.run(["nbdinfo", "--size", uri], capture_output=True, timeout=30)
        key = "ok" if r.returncode == 0 else "refused"
        stats[key] = stats.get(key, 0) + 1
        if r.returncode != 0:
            stats["last_refusal"] = r.stderr.decode(errors="replace").strip()
        time.sleep(0.5)


def fio(uri, region, args, seconds):
    cmd = [
        "fio", "--name=verify", "--ioengine=nbd", "--uri=" + uri, "--size=%d" % region,
        "--bs=4k", "--iodepth=8", "--verify=crc32c", "--verify_fatal=1",
        "--output-format=json", "--verify_state_save=0",
    ] + args
    if seconds:
        cmd += ["--time_based", "--runtime=%d" % seconds]
    # fio writes state files into its working directory: not ours.
    r = subprocess.run(cmd, capture_output=True, timeout=seconds + 600, cwd=tempfile.gettempdir())
    out = r.stdout.decode(errors="replace")
    try:
        j = json.loads(out[out.index("{"):])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        return {"fio_failed": True, "rc": r.returncode, "stderr": r.stderr.decode(errors="replace")[-2000:]}
    return {
        "rc": r.returncode,
        "error": j.get("error", 0),
        "write_ios": j["write"]["total_ios"],
        "read_ios": j["read"]["total_ios"],
        "write_bytes": j["write"]["io_bytes"],
        "read_bytes": j["read"]["io_bytes"],
        "stderr": r.stderr.decode(errors="replace")[-2000:],
    }


def phase(zmem, name, serve_args, seconds, backing):
    d = tempfile.mkdtemp(prefix="zmem-abuse-")
    sock, ctl = os.path.join(d, "nbd.sock"), os.path.join(d, "ctl.sock")
    size = 256 * MIB
    args = [zmem, "serve", "--size", "256M", "--socket", sock, "--control", ctl,
            "--handshake-timeout", "3", "--io-timeout", "5"] + serve_args
    if backing:
        args += ["--backing", os.path.join(d, "backing.img")]
    log = open(os.path.join(d, "serve.log"), "w")
    srv = subprocess.Popen(args, stderr=log, stdout=subprocess.DEVNULL)
    for _ in range(500):
        if os.path.exists(sock) and os.path.exists(ctl):
            break
        time.sleep(0.02)
    uri = "nbd+unix:///?socket=" + sock
    region = 16 * MIB
    result = {"phase": name}
    try:
        # Write the region once, verified, before anyone fills the pool or
        # the disk: later overwrites of its (incompressible) pages are
        # rewrites in place, which need no new memory.
        result["fio_prefill"] = fio(uri, region, ["--rw=randwrite", "--do_verify=1"], 0)
        stop = threading.Event()
        ab = Abusers(sock, stop, size)
        ab.start()
        fstats, rstats = {}, {}
        threading.Thread(target=filler, args=(sock, stop, 64 * MIB, 190 * MIB, fstats), daemon=True).start()
        threading.Thread(target=real_clients, args=(sock, stop, rstats), daemon=True).start()
        time.sleep(2)
        if backing:
            # Re-read and verify the region until the time is up.
            runs, end = [], time.time() + seconds
            while time.time() < end or not runs:
                runs.append(fio(uri, region, ["--rw=read", "--verify_only=1"], 0))
            result["fio"] = {k: sum(r.get(k, 0) for r in runs) for k in ("write_ios", "read_ios", "write_bytes", "read_bytes", "error", "rc")}
            result["fio"]["fio_failed"] = any(r.get("fio_failed") for r in runs)
            result["fio"]["runs"] = len(runs)
        else:
            result["fio"] = fio(uri, region, ["--rw=randwrite", "--do_verify=1", "--verify_backlog=1024"], seconds)
        stop.set()
        time.sleep(1)
        result["filler"] = fstats
        result["real_clients"] = rstats
        result["abusers"] = ab.counts
        st = json.loads(subprocess.run([zmem, "stat", "--control", ctl, "--json"], capture_output=True, timeout=30).stdout)
        result["server"] = {k: st[k] for k in ("connections", "panics", "timeouts", "warnings_suppressed", "inflight_bytes", "workers") if k in st}
        result["server"]["io_stat"] = st.get("io_stat")
        result["server"]["rss_kib"] = int(open("/proc/%d/status" % srv.pid).read().split("VmRSS:")[1].split()[0])
        result["server"]["threads"] = len(os.listdir("/proc/%d/task" % srv.pid))
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(timeout=20)
        except subprocess.TimeoutExpired:
            srv.kill()
            result["server_hung_on_stop"] = True
        result["server_exit"] = srv.returncode
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zmem", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "zmem"))
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    phases = [
        phase(a.zmem, "pool full", ["--max-pool", "24M"], a.seconds, False),
        phase(a.zmem, "backing disk full", ["--max-pool", "8M", "--backing-limit", "24M", "--force"], a.seconds, True),
    ]
    verified = sum(p["fio"].get("read_bytes", 0) for p in phases)
    ops = sum(p["fio"].get("write_ios", 0) + p["fio"].get("read_ios", 0) for p in phases)
    wrong = sum(1 for p in phases for f in (p.get("fio_prefill"), p["fio"]) if f and (f.get("error") or f.get("rc") or f.get("fio_failed")))
    refused = sum(p["real_clients"].get("refused", 0) for p in phases)
    summary = {
        "real_client_ops": ops,
        "bytes_verified": verified,
        "fio_runs_with_errors": wrong,
        "real_clients_refused": refused,
        "real_client_connections_ok": sum(p["real_clients"].get("ok", 0) for p in phases),
        "abuser_attempts": sum(sum(p["abusers"].values()) for p in phases),
        "server_panics": sum(p["server"].get("panics", 0) for p in phases),
        "phases": phases,
    }
    if a.json:
        print(json.dumps(summary, indent=2))
    else:
        for p in phases:
            f = p["fio"]
            print("%s: fio %d writes, %d reads, %d MiB verified, error %s; real clients ok %d, refused %d; "
                  "abusers %s; server %s; filler %s" % (
                      p["phase"], f.get("write_ios", 0), f.get("read_ios", 0), f.get("read_bytes", 0) // MIB,
                      f.get("error", f.get("fio_failed")), p["real_clients"].get("ok", 0),
                      p["real_clients"].get("refused", 0), p["abusers"], p["server"], p["filler"]))
        print("total: %d real-client operations, %d bytes verified, %d fio runs with errors (wrong bytes stop fio), "
              "%d real clients refused, %d server panics" % (ops, verified, wrong, refused, summary["server_panics"]))
    bad = wrong or refused or summary["server_panics"] or any(p.get("server_hung_on_stop") for p in phases)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
