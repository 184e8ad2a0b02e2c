//! The C ABI from a C program: `tests/c/smoke.c`, compiled against
//! `include/zmem_cache.h` and the cdylib this package builds, then run.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn a_c_program_uses_the_cache() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // The test binary is in target/<profile>/deps; cargo puts the cdylib
    // there too (and, for a plain build, one directory up).
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    let libdir = [deps.clone(), deps.parent().unwrap().to_path_buf()]
        .into_iter()
        .find(|d| d.join("libzmemcache.so").exists())
        .unwrap_or_else(|| panic!("no libzmemcache.so in {} or its parent", deps.display()));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smoke");
    let cc = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(manifest.join("include"))
        .arg(manifest.join("tests/c/smoke.c"))
        .arg("-L")
        .arg(&libdir)
        .arg("-lzmemcache")
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-o")
        .arg(&out)
        .output()
        .expect("cc must be installed (scripts/setup.sh installs build-essential)");
    assert!(cc.status.success(), "cc failed: {}", String::from_utf8_lossy(&cc.stderr));
    let run = Command::new(&out).output().unwrap();
    assert!(
        run.status.success() && run.stdout == b"ok\n",
        "the C program failed ({}): {}{}",
        run.status,
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    // The ABI's unsafe code under memcheck (scripts/setup.sh installs
    // valgrind; CI has it, so there a missing valgrind fails the test).
    let have_valgrind = Command::new("valgrind").arg("--version").output().is_ok_and(|o| o.status.success());
    if !have_valgrind {
        assert!(std::env::var_os("CI").is_none(), "valgrind is missing under CI");
        eprintln!("memcheck of the C program: skipped, valgrind is not installed");
        return;
    }
    let mc = Command::new("valgrind").args(["-q", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite"]).arg(&out).output().unwrap();
    assert!(mc.status.success() && mc.stdout == b"ok\n", "memcheck found errors ({}): {}", mc.status, String::from_utf8_lossy(&mc.stderr));
}
