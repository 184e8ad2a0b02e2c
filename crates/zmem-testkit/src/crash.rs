//! The parent side of a crash loop: a worker (this test binary run again)
//! killed at a random instant, round after round, each taking over what
//! the last one left.
//!
//! A worker is told its round ([`WORKER_ENV`]), its log file ([`LOG_ENV`])
//! and, after the first round, the arena the last worker left
//! ([`ARENA_ENV`]: a `/proc/PARENT/fd/N` path the parent keeps open). Once
//! it has taken over, it writes its own arena's fd + 1 into the log's first
//! 8 bytes; the parent then opens that arena (so it outlives the worker),
//! lets the worker run, SIGKILLs it, and checks it died of that and of
//! nothing else.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The worker's round (its presence makes the binary a worker).
pub const WORKER_ENV: &str = "ZMEM_CRASH_WORKER";
/// The worker's log file.
pub const LOG_ENV: &str = "ZMEM_CRASH_LOG";
/// The arena the last worker left.
pub const ARENA_ENV: &str = "ZMEM_CRASH_ARENA";
const SIGKILL: i32 = 9;

/// Run `rounds` workers as above, each killed after `pause()`; `after(round)`
/// runs once each is dead. Returns the last arena, held open, and a path
/// by which this process can open it again.
pub fn kill_rounds(log: &Path, rounds: u64, mut pause: impl FnMut() -> Duration, mut after: impl FnMut(u64)) -> (File, String) {
    let me = std::env::current_exe().expect("the test binary");
    let rw = |p: &str| OpenOptions::new().read(true).write(true).open(p);
    let held = |f: &File| format!("/proc/{}/fd/{}", std::process::id(), f.as_raw_fd());
    let header = OpenOptions::new().read(true).write(true).open(log).expect("the worker's log");
    let mut arena: Option<File> = None;
    for round in 0..rounds {
        let mut cmd = std::process::Command::new(&me);
        cmd.env(WORKER_ENV, round.to_string()).env(LOG_ENV, log);
        if let Some(a) = &arena {
            cmd.env(ARENA_ENV, held(a));
        }
        let mut child = cmd.spawn().expect("a worker");
        let start = Instant::now();
        let fd = loop {
            let mut b = [0u8; 8];
            if header.read_exact_at(&mut b, 0).is_ok() && u64::from_ne_bytes(b) > 0 {
                break u64::from_ne_bytes(b) - 1;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("round {round}: the worker ended before it took over: {status}");
            }
            assert!(start.elapsed() < Duration::from_secs(120), "round {round}: the worker did not take over in 120 s");
            std::thread::sleep(Duration::from_millis(2));
        };
        arena = Some(rw(&format!("/proc/{}/fd/{fd}", child.id())).expect("the worker's arena"));
        header.write_all_at(&0u64.to_ne_bytes(), 0).unwrap();
        std::thread::sleep(pause());
        if let Some(status) = child.try_wait().unwrap() {
            panic!("round {round}: the worker ended on its own: {status}");
        }
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(SIGKILL), "round {round}: {status}");
        after(round);
    }
    let arena = arena.expect("at least one round");
    let path = held(&arena);
    (arena, path)
}
