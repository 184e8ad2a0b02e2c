//! `zmem serve` refuses bad flags and dangerous paths with a clear error,
//! leaves nothing behind when it does, and keeps its sockets private.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(30);

/// Run `zmem serve` with `args` in a fresh directory; it must fail. Returns
/// its stderr, after checking that no socket file was left behind.
fn serve_fails(args: &[&str]) -> String {
    let d = tempfile::tempdir().unwrap();
    let sock = d.path().join("nbd.sock");
    let ctl = d.path().join("ctl.sock");
    let out = run_timeout(Command::new(ZMEM).args(["serve", "--socket"]).arg(&sock).arg("--control").arg(&ctl).args(args), T);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "zmem serve {args:?} was accepted: {err}");
    assert!(out.status.code().is_some(), "killed by a signal (an abort?): {:?} {err}", out.status);
    assert!(!sock.exists() && !ctl.exists(), "socket files left behind by {args:?}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn bad_flags_are_clear_errors() {
    let e = serve_fails(&["--size", "16M", "--workers", "100000"]);
    assert!(e.contains("--workers") && e.contains("1..=64"), "{e}");
    let e = serve_fails(&["--size", "16M", "--workers", "0"]);
    assert!(e.contains("--workers"), "{e}");
    // 2^63 bytes: a negative size to every NBD client.
    let e = serve_fails(&["--size", "9223372036854775808"]);
    assert!(e.contains("at most"), "{e}");
    let e = serve_fails(&["--size", "16M", "--compressor", "lz4:3"]);
    assert!(e.contains("lz4 takes no level") && !e.contains("zstd level"), "{e}");
    let e = serve_fails(&["--size", "16M", "--group", "no-such-group-zmem"]);
    assert!(e.contains("no group named"), "{e}");
}

#[test]
fn dangerous_backing_paths_are_refused() {
    let e = serve_fails(&["--size", "16M", "--max-pool", "4M", "--backing", "/dev/null"]);
    assert!(e.contains("character device"), "{e}");
    let d = tempfile::tempdir().unwrap();
    let precious = d.path().join("precious");
    std::fs::write(&precious, b"not zmem data").unwrap();
    let p = precious.to_str().unwrap();
    let e = serve_fails(&["--size", "16M", "--max-pool", "4M", "--backing", p]);
    assert!(e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"not zmem data");
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&precious, &link).unwrap();
    let e = serve_fails(&["--size", "16M", "--max-pool", "4M", "--backing", link.to_str().unwrap(), "--force"]);
    assert!(e.contains("symbolic link"), "{e}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"not zmem data");
    // With --force the user's file is taken over, and made private.
    let mut s = ZmemServer::start("16M", &["--max-pool", "4M", "--backing", p, "--force"]);
    assert_eq!(std::fs::metadata(&precious).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(s.stop().unwrap().success(), "{}", s.log_text());
    // Its own store from the last run: a restart needs no --force.
    let mut s = ZmemServer::start("16M", &["--max-pool", "4M", "--backing", p]);
    assert!(s.stop().unwrap().success(), "{}", s.log_text());
}

/// Under umask 000 the data socket used to be 0777, and any local user
/// could read the device. It is 0600 now (0660 with --group).
#[test]
fn the_data_socket_is_private_whatever_the_umask() {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = d.path().join("nbd.sock");
    let ctl = d.path().join("ctl.sock");
    let script = format!("umask 000; exec {} serve --size 16M --socket {} --control {}", ZMEM, sock.display(), ctl.display());
    let mut child = Command::new("sh").args(["-c", &script]).spawn().unwrap();
    let _stop = Undo::new(&["kill", "-TERM", &child.id().to_string()]);
    let up = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        sock.exists() && ctl.exists()
    });
    assert!(up, "zmem serve did not come up");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&sock), 0o600);
    assert_eq!(mode(&ctl), 0o600);
    if is_root() && have("runuser") && have("nbdinfo") {
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        let out = run_timeout(Command::new("runuser").args(["-u", "nobody", "--", "nbdinfo", &uri]), T);
        assert!(!out.status.success(), "user nobody read the device: {}", String::from_utf8_lossy(&out.stdout));
    } else {
        zmem_testkit::ci::skip("the_data_socket_is_private: needs root, runuser and nbdinfo to try it as nobody");
    }
    drop(_stop);
    let _ = wait_timeout(&mut child, Duration::from_secs(10));
}

/// 300,000 garbage connections used to write 29 MB of log, a line each.
/// Repeated warnings are now logged once per 10 s, and the rest counted.
#[test]
fn repeated_warnings_are_rate_limited() {
    use std::io::{Read, Write};
    let mut s = ZmemServer::start("16M", &[]);
    let n = 300;
    for _ in 0..n {
        let mut c = std::os::unix::net::UnixStream::connect(&s.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hello = [0u8; 18];
        c.read_exact(&mut hello).unwrap();
        let _ = c.write_all(&[0xff; 64]);
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
    }
    let st = s.stats();
    assert!(st["connections"]["dropped"].as_u64().unwrap() >= n, "{st}");
    assert!(st["warnings_suppressed"].as_u64().unwrap() >= n - 5, "{st}");
    assert!(s.stop().unwrap().success());
    let log = s.log_text();
    let lines = log.lines().filter(|l| l.contains("dropping this connection")).count();
    assert!((1..=5).contains(&lines), "{lines} lines for {n} dropped connections:\n{log}");
}
