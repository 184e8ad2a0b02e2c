//! The shipped systemd units pass `systemd-analyze verify` (their binary
//! and their manual pages resolved), and `zmem serve` speaks `sd_notify`
//! (READY=1 with a STATUS once it serves, STOPPING=1 when told to stop),
//! so `Type=notify` works.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const UNITS: &[(&str, &str)] = &[("zmem-swap.service", "zmem-swap.service"), ("zmem-serve@.service", "zmem-serve@demo.service")];

#[test]
fn every_shipped_unit_verifies() {
    if !have("systemd-analyze") {
        zmem_testkit::ci::skip("systemd-analyze is not installed (scripts/setup.sh installs systemd)");
        return;
    }
    let contrib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd");
    let d = tempfile::tempdir().unwrap();
    // The pages the units point at, where `man` finds them.
    let man = d.path().join("man");
    run_ok(Command::new(ZMEM).arg("man").arg(man.join("man1")), Duration::from_secs(30));
    for (file, as_name) in UNITS {
        let text = std::fs::read_to_string(contrib.join(file)).unwrap();
        assert!(!text.contains("example.invalid"), "{file} points at a placeholder");
        assert!(text.contains("Documentation=man:"), "{file} points at no manual page");
        // The binary where this build put it (the package puts it in /usr/bin).
        let unit = d.path().join(as_name);
        std::fs::write(&unit, text.replace("/usr/bin/zmem", ZMEM)).unwrap();
        let out = Command::new("systemd-analyze").args(["verify", "--man=yes"]).arg(&unit).env("MANPATH", &man).stdin(Stdio::null()).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && !said.contains(as_name), "systemd-analyze verify {file}: {said}");
    }
}

#[test]
fn serve_tells_the_service_manager_when_it_serves_and_when_it_stops() {
    let d = tempfile::tempdir().unwrap();
    let notify = d.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut child = Command::new(ZMEM)
        .args(["serve", "--size", "8M", "--socket"])
        .arg(d.path().join("nbd.sock"))
        .arg("--control")
        .arg(d.path().join("ctl.sock"))
        .env("NOTIFY_SOCKET", &notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).expect("no READY=1 within 20 s");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.lines().any(|l| l == "READY=1") && msg.contains("STATUS=serving 8388608 bytes"), "{msg}");
    assert!(std::os::unix::net::UnixStream::connect(d.path().join("nbd.sock")).is_ok(), "READY came before the device was reachable");
    rustix::process::kill_process(rustix::process::Pid::from_child(&child), rustix::process::Signal::TERM).unwrap();
    let n = sock.recv(&mut buf).expect("no STOPPING=1 within 20 s");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.lines().any(|l| l == "STOPPING=1"), "{msg}");
    assert!(wait_timeout(&mut child, Duration::from_secs(20)).is_some_and(|s| s.success()));
}
