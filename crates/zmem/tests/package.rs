//! The Debian package (`scripts/package.sh`, which `scripts/test.sh` runs
//! before the tests), installed for real with dpkg: the binary runs, `man`
//! finds its page, a swap device comes up and goes down through the
//! installed unit (systemctl where systemd runs, else the unit's own
//! ExecStart and ExecStop lines), and a purge leaves nothing behind.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);
const UNIT: &str = "/lib/systemd/system/zmem-swap.service";
const CONF: &str = "/etc/zmem/swap.conf";

fn deb() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debian");
    std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok().map(|e| e.path())).find(|p| p.extension().is_some_and(|x| x == "deb"))
}

fn sh_ok(cmd: &str) -> String {
    run_ok(Command::new("sh").args(["-c", cmd]), T)
}

fn installed() -> bool {
    Command::new("dpkg-query").args(["-W", "-f", "${Status}", "zmem"]).output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("ok installed"))
}

fn systemd_runs() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// A line of the installed unit (`ExecStart=` → its command).
fn unit_line(key: &str) -> String {
    let unit = std::fs::read_to_string(UNIT).unwrap();
    unit.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("{UNIT} has no {key}")).to_string()
}

/// Undoes the test, also when it fails: the device down, the config the
/// test wrote gone, the package purged.
struct Cleanup {
    wrote_conf: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if installed() {
            if systemd_runs() {
                let _ = Command::new("systemctl").args(["stop", "zmem-swap.service"]).status();
            } else if Path::new("/usr/bin/zmem").exists() {
                let _ = Command::new("/usr/bin/zmem").args(["swap", "off", "--all"]).status();
            }
            let _ = Command::new("dpkg").args(["--purge", "zmem"]).status();
        }
        if self.wrote_conf {
            let _ = std::fs::remove_file(CONF);
            let _ = std::fs::remove_dir("/etc/zmem");
        }
    }
}

#[test]
fn the_package_installs_serves_swap_through_its_unit_and_purges_clean() {
    if !is_root() || !have("dpkg") {
        zmem_testkit::ci::skip("installing a package needs root and dpkg");
        return;
    }
    let Some(deb) = deb() else {
        zmem_testkit::ci::skip("no package in target/debian (bash scripts/package.sh builds it; scripts/test.sh runs it)");
        return;
    };
    assert!(!installed(), "zmem is already installed here: this test would remove it");
    assert!(!Path::new(CONF).exists(), "{CONF} exists: this test would overwrite it");
    let mut cleanup = Cleanup { wrote_conf: false };

    run_ok(Command::new("dpkg").arg("-i").arg(&deb), T);
    assert!(installed());
    let files: Vec<String> = sh_ok("dpkg -L zmem").lines().map(String::from).filter(|f| Path::new(f).is_file()).collect();
    for want in ["/usr/bin/zmem", UNIT, "/lib/systemd/system/zmem-serve@.service", "/usr/include/zmem_cache.h", "/usr/share/bash-completion/completions/zmem"] {
        assert!(files.iter().any(|f| f == want), "the package lacks {want}: {files:?}");
    }
    assert!(files.iter().any(|f| f.ends_with("/libzmemcache.so")), "{files:?}");
    let v = run_ok(Command::new("/usr/bin/zmem").arg("--version"), T);
    assert!(v.starts_with("zmem "), "{v}");
    if have("man") {
        let page = run_ok(Command::new("man").args(["-w", "zmem"]), T);
        assert_eq!(page.trim(), "/usr/share/man/man1/zmem.1.gz");
        let page = run_ok(Command::new("man").args(["-w", "zmem-swap-on"]), T);
        assert!(page.trim().ends_with("zmem-swap-on.1.gz"), "{page}");
    }

    // A small device through the installed unit.
    std::fs::create_dir_all("/etc/zmem").unwrap();
    cleanup.wrote_conf = true;
    std::fs::write(CONF, "[pkgtest]\nsize = 64M\nmax-pool = 16M\npriority = 5\n").unwrap();
    let start = unit_line("ExecStart=");
    let stop = unit_line("ExecStop=");
    assert!(start.starts_with("/usr/bin/zmem swap on") && stop.starts_with("/usr/bin/zmem swap off"), "{start} / {stop}");
    if systemd_runs() {
        sh_ok("systemctl daemon-reload && systemctl start zmem-swap.service");
    } else {
        sh_ok(&start);
    }
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    let status = run_ok(Command::new("/usr/bin/zmem").args(["swap", "status"]), T);
    let dev = status.lines().find(|l| l.starts_with("pkgtest")).and_then(|l| l.split_whitespace().nth(1)).unwrap_or_else(|| panic!("{status}")).to_string();
    assert!(swaps.contains(&dev), "{dev} is not swapped on: {swaps}");
    if systemd_runs() {
        sh_ok("systemctl stop zmem-swap.service");
    } else {
        sh_ok(&stop);
    }
    assert!(!std::fs::read_to_string("/proc/swaps").unwrap().contains(&dev), "{dev} still swapped on");
    assert!(!Path::new("/run/zmem/swap/pkgtest").exists(), "the device's run directory is left");

    // Purge: every file the package put down is gone.
    run_ok(Command::new("dpkg").args(["--purge", "zmem"]), T);
    assert!(!installed());
    let left: Vec<&String> = files.iter().filter(|f| Path::new(f).exists()).collect();
    assert!(left.is_empty(), "left behind by the purge: {left:?}");
    drop(cleanup);
    assert!(!Path::new("/etc/zmem").exists());
}
