//! `zmem serve` outlives its server: the process started is the keeper,
//! its child the server. A server SIGKILLed or replaced on purpose
//! (SIGHUP) is followed by a new one on the same pool, the same NBD
//! listener and the same FUSE connection; every byte written before reads
//! back right after, also when servers are killed while they take over. A
//! crash loop stops the keeper's restarts until one is asked for. A cache
//! (`--origin`) starts again empty and reads its origin; a pool that
//! cannot be kept (dedup) ends the device with a message that says so.

mod common;

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use rustix::process::{kill_process, Pid, Signal};

const T: Duration = Duration::from_secs(60);

fn signal(pid: u32, sig: Signal) {
    kill_process(Pid::from_raw(pid as i32).expect("a pid"), sig).expect("signalling");
}

#[test]
fn a_ram_device_outlives_its_server_over_nbd() {
    require_tools!("nbdcopy");
    let mut s = ZmemServer::start("16M", &[]);
    let first = s.serving_pid().expect("the keeper started a server");
    assert_ne!(first, s.keeper_pid(), "the process started is the keeper, its child the server");
    let src = fill_device(&s, s.dir.path(), 16 << 20, 1);
    // Killed at once, asked to leave, killed again: every byte still there.
    for (i, kill) in [true, false, true].into_iter().enumerate() {
        let new = s.replace_server(kill);
        assert_ne!(new, first);
        assert_reads_back(&s, &src, s.dir.path());
        let rec = &s.stats()["recovery"];
        assert_eq!(rec["restarts"].as_u64(), Some(i as u64 + 1), "{rec}");
        assert_eq!(rec["pages"].as_u64(), Some(4096), "every page taken over: {rec}");
        assert_eq!(rec["lost_pages"].as_u64(), Some(0), "{rec}");
    }
    // Written after a takeover, then killed: the new bytes survive too.
    let src2 = fill_device(&s, s.dir.path(), 16 << 20, 2);
    s.replace_server(true);
    assert_reads_back(&s, &src2, s.dir.path());
    // SIGTERM to the keeper: the device stops, its socket goes.
    assert!(s.stop().is_some_and(|st| st.success()), "{}", s.log_text());
    assert!(!s.socket.exists(), "the socket outlived the device");
    let log = s.log_text();
    assert!(log.contains("the server died (signal: 9") && log.contains("restarting the server, as asked"), "{log}");
}

#[test]
fn a_cache_starts_again_from_its_origin() {
    require_tools!("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let origin = dir.path().join("origin.img");
    std::fs::write(&origin, test_data(8 << 20, 3)).unwrap();
    let mut s = ZmemServer::start_with(&["--origin", origin.to_str().unwrap()]);
    let uri = s.uri();
    let read = |name: &str| {
        let back = dir.path().join(name);
        run_ok(Command::new("nbdcopy").arg(&uri).arg(&back), T);
        assert_eq!(sha256(&origin), sha256(&back), "{name}: the cache read back other bytes than its origin's");
    };
    read("warm.img");
    for (i, kill) in [true, false].into_iter().enumerate() {
        s.replace_server(kill);
        read(&format!("after{i}.img"));
        let rec = &s.stats()["recovery"];
        assert_eq!((rec["restarts"].as_u64(), rec["pages"].as_u64()), (Some(i as u64 + 1), Some(0)), "a cache starts empty: {rec}");
    }
    assert!(s.stop().is_some_and(|st| st.success()), "{}", s.log_text());
}

#[test]
fn a_tcp_listener_is_kept() {
    require_tools!("nbdcopy");
    let dir = tempfile::Builder::new().prefix("zmem-test-").tempdir().unwrap();
    let port = free_port();
    let (control, log) = (dir.path().join("ctl.sock"), dir.path().join("serve.log"));
    let child = Command::new(ZMEM)
        .args(["serve", "--size", "8M", "--listen", &port.to_string(), "--control"])
        .arg(&control)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let socket = dir.path().join("no-unix-socket");
    let mut s = ZmemServer { child: Some(child), dir, socket, control, log };
    s.next_server(0);
    let uri = format!("nbd://127.0.0.1:{port}/");
    let src = s.dir.path().join("src.img");
    std::fs::write(&src, test_data(8 << 20, 4)).unwrap();
    run_ok(Command::new("nbdcopy").arg(&src).arg(&uri), T);
    for (i, kill) in [true, false].into_iter().enumerate() {
        s.replace_server(kill);
        let back = s.dir.path().join(format!("back{i}.img"));
        run_ok(Command::new("nbdcopy").arg(&uri).arg(&back), T);
        assert_eq!(sha256(&src), sha256(&back), "read back after replacement {i}");
    }
    assert!(s.stop().is_some_and(|st| st.success()), "{}", s.log_text());
}

#[test]
fn a_device_whose_pool_is_not_kept_ends_with_its_server_and_says_so() {
    let mut s = ZmemServer::start("8M", &["--dedup", "on"]);
    let server = s.serving_pid().expect("a server");
    // A restart is refused: the server keeps serving.
    signal(s.keeper_pid(), Signal::HUP);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(s.serving_pid(), Some(server), "a restart replaced a server whose pool cannot be handed over");
    signal(server, Signal::KILL);
    let mut keeper = s.child.take().unwrap();
    let st = wait_timeout(&mut keeper, T).expect("the keeper exits when its server cannot be followed");
    assert!(!st.success());
    let log = s.log_text();
    assert!(log.contains("cannot be kept") && log.contains("handed nothing over"), "{log}");
}

#[test]
fn a_server_that_cannot_start_ends_the_keeper_with_its_own_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_timeout(
        Command::new(ZMEM)
            .args(["serve", "--size", "1M", "--control", "none", "--socket"])
            .arg(dir.path().join("s.sock"))
            .args(["--dict", "/nonexistent/dict"]),
        T,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("/nonexistent/dict"), "the server's own error is shown: {err}");
    assert!(!err.contains("taking over"), "a server that never served is not started again: {err}");
}

#[repr(C, align(4096))]
struct Block([u8; 65536]);

/// The block `i` of generation `g`: its bytes name both.
fn block(i: u64, g: u64) -> Box<Block> {
    let mut b = Box::new(Block([0; 65536]));
    for (j, w) in b.0.chunks_mut(8).enumerate() {
        w.copy_from_slice(&(i << 40 | g << 20 | j as u64).to_le_bytes());
    }
    b
}

#[test]
fn the_fuse_file_outlives_its_server_under_constant_io() {
    if !is_root() || !Path::new("/dev/fuse").exists() {
        skip!("the FUSE file needs root and /dev/fuse");
    }
    let mnt = tempfile::tempdir().unwrap();
    let mut s = ZmemServer::start("32M", &["--fuse", mnt.path().to_str().unwrap()]);
    // Whatever happens below, the mount is undone.
    let _unmount = Undo::new(&["umount", "-l", mnt.path().to_str().unwrap()]);
    let image = mnt.path().join("image");
    let f = std::fs::OpenOptions::new().read(true).write(true).custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32).open(&image).unwrap();
    let blocks = (32u64 << 20) / 65536;
    let done = std::sync::atomic::AtomicBool::new(false);
    let rounds = std::thread::scope(|sc| {
        // Writes and reads back, block by block, while the main thread
        // kills and restarts the server: each request pauses, none fails.
        let io = sc.spawn(|| {
            let mut gen = vec![0u64; blocks as usize];
            let mut buf = Box::new(Block([0; 65536]));
            let mut rounds = 0u64;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                rounds += 1;
                for i in 0..blocks {
                    if (i + rounds).is_multiple_of(3) {
                        gen[i as usize] = rounds;
                        f.write_all_at(&block(i, rounds).0, i * 65536).unwrap_or_else(|e| panic!("write of block {i}: {e}"));
                    }
                    f.read_exact_at(&mut buf.0, i * 65536).unwrap_or_else(|e| panic!("read of block {i}: {e}"));
                    let want = if gen[i as usize] == 0 { Box::new(Block([0; 65536])) } else { block(i, gen[i as usize]) };
                    assert!(buf.0 == want.0, "block {i} read back other bytes (generation {})", gen[i as usize]);
                }
            }
            rounds
        });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for kill in [true, false, true, true, false] {
                std::thread::sleep(Duration::from_millis(700));
                s.replace_server(kill);
            }
            std::thread::sleep(Duration::from_millis(700));
        }));
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let rounds = io.join().expect("the I/O thread saw a failed or wrong request");
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
        rounds
    });
    assert!(rounds >= 2, "the I/O went on through the replacements ({rounds} rounds)");
    let rec = &s.stats()["recovery"];
    assert_eq!(rec["restarts"].as_u64(), Some(5), "{rec}");
    drop(f);
    assert!(s.stop().is_some_and(|st| st.success()), "{}", s.log_text());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&*mnt.path().to_string_lossy()), "the device stopped and left its mount");
}

/// The server serving `s`, as soon as the keeper has started one other
/// than `old` (it may not serve yet); waits at most a minute.
fn started_after(s: &ZmemServer, old: u32) -> u32 {
    let t = std::time::Instant::now();
    loop {
        if let Some(p) = s.serving_pid().filter(|&p| p != old) {
            return p;
        }
        assert!(t.elapsed() < T, "no server started after {old}: {}", s.log_text());
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn servers_killed_while_they_take_over_are_followed_and_a_crash_loop_waits_for_a_restart() {
    require_tools!("nbdcopy");
    let s = ZmemServer::start("16M", &[]);
    let src = fill_device(&s, s.dir.path(), 16 << 20, 5);
    // Each new server killed at once, or within its first 60 ms: while it
    // starts, opens the pool the last one left, or takes the listener.
    // Four quick deaths in a row: fewer than a crash loop.
    let mut server = s.serving_pid().expect("a server");
    signal(server, Signal::KILL);
    for delay_ms in [0, 15, 30, 60] {
        server = started_after(&s, server);
        std::thread::sleep(Duration::from_millis(delay_ms));
        signal(server, Signal::KILL);
    }
    let server = s.next_server(server);
    assert_reads_back(&s, &src, s.dir.path());
    let rec = &s.stats()["recovery"];
    assert_eq!((rec["pages"].as_u64(), rec["lost_pages"].as_u64()), (Some(4096), Some(0)), "{rec}");
    // A server that served past QUICK_DEATH ends a run of quick deaths;
    // then each new one killed at once: the keeper stops starting them
    // after CRASH_LIMIT + 1 in a row, and holds the pool.
    std::thread::sleep(Duration::from_secs(5));
    let mut victim = server;
    let t = std::time::Instant::now();
    while !s.log_text().contains("not starting another") {
        signal(victim, Signal::KILL);
        let next = loop {
            if let Some(p) = s.serving_pid().filter(|&p| p != victim) {
                break Some(p);
            }
            if s.log_text().contains("not starting another") {
                break None;
            }
            assert!(t.elapsed() < T, "no crash loop seen: {}", s.log_text());
            std::thread::sleep(Duration::from_millis(1));
        };
        match next {
            Some(p) => victim = p,
            None => break,
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(s.serving_pid(), None, "the keeper started a server after the crash loop: {}", s.log_text());
    assert!(UnixStream::connect(&s.socket).is_ok(), "the keeper let the listener go in the crash loop");
    // A restart asked for starts one again, on the same pool.
    signal(s.keeper_pid(), Signal::HUP);
    s.next_server(0);
    assert_reads_back(&s, &src, s.dir.path());
}
