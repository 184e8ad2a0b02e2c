//! `zmem serve` against real NBD clients: qemu-io (aligned, unaligned,
//! concurrent sector writes, zeroes, discard), nbdinfo (negotiation, block
//! status map, named exports), nbdcopy (multi-connection bulk copy), plus
//! `zmem stat`, TCP, bad input and clean shutdown. No root needed.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw", uri]);
    for x in cmds {
        c.args(["-c", x]);
    }
    let out = run_ok(&mut c, T);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(!out.contains("failed"), "{out}");
    out
}

#[test]
fn qemu_io_aligned_unaligned_and_concurrent() {
    require_tools!("qemu-io");
    let s = ZmemServer::start("64M", &[]);
    let uri = s.uri();
    qemu_io(
        &uri,
        &[
            "write -P 0x11 0 1M",
            // Unaligned: crosses page boundaries at odd offsets, single bytes.
            "write -P 0x22 511 4097",
            "write -P 0x33 8191 1",
            "write -P 0x44 1048575 3",
            // Concurrent sector writes into one page (read-modify-write race).
            "aio_write -P 0x51 65536 512",
            "aio_write -P 0x52 66048 512",
            "aio_write -P 0x53 66560 512",
            "aio_write -P 0x54 67072 1024",
            "aio_write -P 0x55 68096 1536",
            "aio_flush",
            "write -P 0x66 -f 131072 4096", // FUA
            "flush",
        ],
    );
    // Verify on a fresh connection.
    qemu_io(
        &uri,
        &[
            "read -P 0x11 0 511",
            "read -P 0x22 511 4097",
            "read -P 0x11 4608 3583",
            "read -P 0x33 8191 1",
            "read -P 0x11 8192 57344",
            "read -P 0x51 65536 512",
            "read -P 0x52 66048 512",
            "read -P 0x53 66560 512",
            "read -P 0x54 67072 1024",
            "read -P 0x55 68096 1536",
            "read -P 0x11 69632 61440",
            "read -P 0x66 131072 4096",
            "read -P 0x44 1048575 3",
            "read -P 0 1048578 1M",
            "read -P 0 60M 4M",
        ],
    );
    // Zeroes (with and without allowing holes) and discard.
    let pages_before = s.stat_u64("orig_data_size") / 4096;
    qemu_io(&uri, &["write -z -u 0 64K", "write -z 64K 64K", "discard 512K 512K", "write -z 1000 100"]);
    qemu_io(&uri, &["read -P 0 0 128K", "read -P 0x66 128K 4K", "read -P 0 512K 512K", "read -P 0x44 1048576 2"]);
    let pages_after = s.stat_u64("orig_data_size") / 4096;
    assert!(pages_after < pages_before, "discard/zero must free pages: {pages_before} -> {pages_after}");
}

#[test]
fn nbdinfo_negotiation_map_and_names() {
    require_tools!("nbdinfo", "qemu-io");
    let s = ZmemServer::start("32M", &["--export-name", "disk"]);
    let uri = format!("nbd+unix:///disk?socket={}", s.socket.display());
    let j: serde_json::Value = serde_json::from_str(&run_ok(Command::new("nbdinfo").args(["--json", &uri]), T)).unwrap();
    let e = &j["exports"][0];
    assert_eq!(j["structured"], true);
    assert_eq!(e["export-name"], "disk");
    assert_eq!(e["export-size"], 32 << 20);
    assert_eq!(e["can_multi_conn"], true);
    assert_eq!(e["can_trim"], true);
    assert_eq!(e["can_zero"], true);
    assert_eq!(e["can_fua"], true);
    assert_eq!(e["block_size_minimum"], 1);
    assert_eq!(e["block_size_preferred"], 4096);
    assert_eq!(e["block_size_maximum"], 32 << 20);
    assert!(e["contexts"].as_array().unwrap().iter().any(|c| c == "base:allocation"));

    // NBD_OPT_LIST.
    let list = run_ok(Command::new("nbdinfo").args(["--list", &uri]), T);
    assert!(list.contains("export=\"disk\""), "{list}");

    // A wrong name is refused; the server carries on.
    let bad = format!("nbd+unix:///nope?socket={}", s.socket.display());
    let o = run_timeout(Command::new("nbdinfo").arg(&bad), T);
    assert!(!o.status.success());

    // base:allocation map: written pages are data, the rest hole+zero.
    qemu_io(&uri, &["write -P 1 1M 256K", "write -P 2 8M 4K"]);
    let map = run_ok(Command::new("nbdinfo").args(["--map", "--totals", &uri]), T);
    let data_line = map.lines().find(|l| l.contains("data")).unwrap_or_else(|| panic!("{map}"));
    let data_bytes: u64 = data_line.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(data_bytes, 256 * 1024 + 4096, "{map}");
    let map = run_ok(Command::new("nbdinfo").args(["--map", &uri]), T);
    let rows: Vec<(u64, u64, String)> = map
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[3..].join(" "))
        })
        .collect();
    assert_eq!(rows[0], (0, 1 << 20, "hole,zero".to_string()), "{map}");
    assert_eq!(rows[1], (1 << 20, 256 << 10, "data".to_string()), "{map}");
    assert_eq!(rows.iter().map(|r| r.1).sum::<u64>(), 32 << 20);
}

#[test]
fn nbdcopy_multi_connection_roundtrip() {
    require_tools!("nbdcopy", "sha256sum");
    let s = ZmemServer::start("48M", &["--compressor", "zstd", "--dedup", "on"]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    let mut d = test_data(48 << 20, 42);
    // Some duplicate pages and an all-zero stretch.
    let (a, b) = d.split_at_mut(16 << 20);
    b[..4 << 20].copy_from_slice(&a[..4 << 20]);
    d[40 << 20..44 << 20].fill(0);
    std::fs::write(&src, &d).unwrap();
    run_ok(Command::new("nbdcopy").args(["--connections=4", "--requests=16"]).arg(&src).arg(s.uri()), T);
    run_ok(Command::new("nbdcopy").arg(s.uri()).arg(&back), T);
    assert_eq!(sha256(&src), sha256(&back), "data read back differs");
    if have("qemu-img") {
        // qemu's client uses base:allocation to skip holes while comparing.
        run_ok(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&src).arg(s.uri()), T);
    }
    let st = s.stats();
    let g = |k: &str| st["stats"][k].as_u64().unwrap();
    assert!(g("orig_data_size") >= 40 << 20);
    // The copy is 9 % of the pages and its objects are small (~400 bytes):
    // records for every page would cost more than sharing saves, so the
    // pool samples (adaptive dedup), and the sample still finds its twins.
    assert!(g("dup_pages") >= 8 && g("dup_data_size") > 0, "dedup should find some of the copied 4 MiB: {st}");
    assert!(st["stats"]["dedup_full"].as_bool() == Some(true) || g("meta_data_size") < g("stored_pages") * 8, "sampling keeps few records: {st}");
    assert!(g("mem_used_total") < g("orig_data_size"));
    assert!(st["connections"]["total"].as_u64().unwrap() >= 5);
}

#[test]
fn stat_table_bad_input_and_clean_shutdown() {
    let mut s = ZmemServer::start("16M", &["--mem-limit", "64M"]);
    // Garbage on the NBD socket: this connection is dropped, server lives.
    {
        let mut c = UnixStream::connect(&s.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut g = [0u8; 18];
        c.read_exact(&mut g).unwrap();
        assert_eq!(&g[..8], b"NBDMAGIC");
        c.write_all(&[0xff; 64]).unwrap();
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
    }
    // A client that connects and vanishes mid-handshake.
    drop(UnixStream::connect(&s.socket).unwrap());
    // Unknown control command.
    {
        let mut c = UnixStream::connect(&s.control).unwrap();
        c.write_all(b"bogus\n").unwrap();
        let mut r = String::new();
        c.read_to_string(&mut r).unwrap();
        assert!(r.contains("error"), "{r}");
    }
    let table = run_ok(Command::new(ZMEM).arg("stat").arg("--control").arg(&s.control), T);
    let lines: Vec<&str> = table.lines().collect();
    for col in ["EXPORT", "DISKSIZE", "DATA", "COMPR", "TOTAL", "RATIO", "SAME", "DUP", "HUGE"] {
        assert!(lines[0].contains(col), "{table}");
    }
    assert!(lines[1].contains("16M"), "{table}");
    assert!(lines[2].starts_with("mm_stat:") && lines[2].split_whitespace().count() == 10, "{table}");
    assert!(lines[3].starts_with("io_stat:") && lines[3].split_whitespace().count() == 5, "{table}");
    let st = s.stats();
    assert_eq!(st["panics"], 0, "{st}");
    assert_eq!(st["stats"]["mem_limit"], 64 << 20);
    assert!(st["connections"]["dropped"].as_u64().unwrap() >= 1, "{st}");

    let (sock, ctl) = (s.socket.clone(), s.control.clone());
    let status = s.stop().unwrap();
    assert!(status.success(), "exit {status}: {}", s.log_text());
    assert!(!sock.exists() && !ctl.exists(), "sockets must be removed on shutdown");
    assert!(s.log_text().contains("dropping this connection"), "{}", s.log_text());
    // No panics anywhere.
    assert!(!s.log_text().contains("panicked"), "{}", s.log_text());
    // Log lines in a file carry no colour codes.
    assert!(!s.log_text().contains('\x1b'), "ANSI codes in the log file: {:?}", s.log_text());
}

#[test]
fn tcp_listen_on_loopback() {
    require_tools!("nbdinfo");
    let port = zmem_testkit::ports::free_port();
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl");
    let mut child = Command::new(ZMEM)
        .args(["serve", "--size", "8M", "--listen", &port.to_string(), "--control"])
        .arg(&ctl)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SIGTERM: the keeper passes it on to its server.
            let _ = rustix::process::kill_process(rustix::process::Pid::from_child(&self.0), rustix::process::Signal::TERM);
            if wait_timeout(&mut self.0, Duration::from_secs(10)).is_none() {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < end, "server did not listen");
        if let Ok(Some(st)) = child.try_wait() {
            panic!("zmem serve exited: {st}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let guard = Kill(child);
    let out = run_ok(Command::new("nbdinfo").arg(format!("nbd://127.0.0.1:{port}/")), T);
    assert!(out.contains("export-size: 8388608"), "{out}");
    drop(guard);
}

#[test]
fn sigint_with_a_connected_client_stops_cleanly() {
    let mut s = ZmemServer::start("8M", &[]);
    // A client mid-session: shutdown must not wait for it to leave.
    let mut c = UnixStream::connect(&s.socket).unwrap();
    let mut g = [0u8; 18];
    c.read_exact(&mut g).unwrap();
    let mut child = s.child.take().unwrap();
    rustix::process::kill_process(rustix::process::Pid::from_child(&child), rustix::process::Signal::INT).unwrap();
    let st = wait_timeout(&mut child, Duration::from_secs(10)).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("zmem serve ignored SIGINT");
    });
    assert!(st.success(), "{st}: {}", s.log_text());
    assert!(!s.socket.exists());
    let mut rest = Vec::new();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = c.read_to_end(&mut rest); // the server closed its end
}
