//! What `OsFile::open` accepts as a backing store, and what it refuses:
//! only a regular file or a block device, never through a symbolic link,
//! never one holding someone else's data unless told to overwrite it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use zmem_backing::{BackingError, BackingStore, Existing, OsFile, SEGMENT_SIZE};

fn refused(path: &Path, existing: Existing) -> String {
    match OsFile::open(path, existing) {
        Err(e @ BackingError::Refused { .. }) => e.to_string(),
        Err(e) => panic!("{}: expected a refusal, got {e}", path.display()),
        Ok(_) => panic!("{} was accepted", path.display()),
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_new_file_is_created_private() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("new");
    OsFile::open(&p, Existing::Refuse).unwrap();
    assert_eq!(mode(&p), 0o600);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 0, "the probe leaves it empty");
}

#[test]
fn someone_elses_data_is_refused_unless_forced() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("precious");
    std::fs::write(&p, b"my thesis, final version").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let msg = refused(&p, Existing::Refuse);
    assert!(msg.contains("--force") && msg.contains("precious"), "{msg}");
    assert_eq!(std::fs::read(&p).unwrap(), b"my thesis, final version", "left untouched");
    OsFile::open(&p, Existing::Overwrite).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
    assert_eq!(mode(&p), 0o600, "an existing file is made private");
    // An empty file is fine without --force.
    OsFile::open(&p, Existing::Refuse).unwrap();
}

/// A short file that starts like a record header (bytes 2..4, the length,
/// at most a page) is someone else's data, refused with its name: it made
/// the open path panic (`range end index 12 out of range for slice of
/// length 8`).
#[test]
fn short_files_that_look_like_a_header_are_refused() {
    let d = tempfile::tempdir().unwrap();
    for n in 1..16usize {
        let p = d.path().join(format!("short{n}"));
        let mut bytes = vec![0x5au8; n];
        if n >= 4 {
            bytes[2..4].copy_from_slice(&16u16.to_le_bytes());
        }
        std::fs::write(&p, &bytes).unwrap();
        let msg = refused(&p, Existing::Refuse);
        assert!(msg.contains(&format!("short{n}")) && msg.contains("--force"), "{msg}");
        assert_eq!(std::fs::read(&p).unwrap(), bytes, "left untouched");
        // And through the store's own open, as `zmem serve --backing` does.
        match BackingStore::open(&p, None, Existing::Refuse) {
            Err(e @ BackingError::Refused { .. }) => assert!(e.to_string().contains(&format!("short{n}")), "{e}"),
            Err(e) => panic!("{n} bytes: expected a refusal, got {e}"),
            Ok(_) => panic!("{n} bytes: accepted"),
        }
    }
}

#[test]
fn links_and_special_files_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let target = d.path().join("target");
    std::fs::write(&target, b"keep me").unwrap();
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let dangling = d.path().join("dangling");
    std::os::unix::fs::symlink(d.path().join("nowhere"), &dangling).unwrap();
    for (p, what) in [(&link, "symbolic link"), (&dangling, "symbolic link")] {
        for existing in [Existing::Refuse, Existing::Overwrite] {
            let msg = refused(p, existing);
            assert!(msg.contains(what), "{msg}");
        }
    }
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    assert!(!d.path().join("nowhere").exists(), "a dangling link's target was not created");
    let msg = refused(Path::new("/dev/null"), Existing::Overwrite);
    assert!(msg.contains("character device"), "{msg}");
    let msg = refused(d.path(), Existing::Overwrite);
    assert!(msg.contains("directory"), "{msg}");
    let fifo = d.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let msg = refused(&fifo, Existing::Overwrite);
    assert!(msg.contains("FIFO"), "{msg}");
}

/// Detaches a loop device when dropped.
struct LoopDev(String);

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// A block device: used when empty, refused when it holds data, its size
/// caps the store, and nothing tries to truncate it.
#[test]
fn a_block_device() {
    if zmem_testkit::ci::effective_uid() != Some(0) {
        zmem_testkit::ci::skip("a_block_device needs root (losetup)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("disk.img");
    std::fs::write(&img, vec![0u8; 3 * SEGMENT_SIZE]).unwrap();
    let out = Command::new("losetup").args(["--show", "-f"]).arg(&img).output().unwrap();
    assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
    let dev = LoopDev(String::from_utf8(out.stdout).unwrap().trim().to_string());
    let path = Path::new(&dev.0);
    // Zeroed: accepted; the store is capped at the device's size.
    let (s, _) = BackingStore::open(path, None, Existing::Refuse).unwrap();
    let page = vec![7u8; 4000];
    let mut written = 0;
    let err = loop {
        match s.write_batch(&[(1, &page[..]); 16]) {
            Ok(_) => written += 16,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, BackingError::Full { limit_bytes } if limit_bytes == 3 * SEGMENT_SIZE as u64), "{err}");
    assert!(written >= 256, "only {written} records fit in 3 segments");
    drop(s);
    // Our own store from before (a restart): accepted.
    drop(OsFile::open(path, Existing::Refuse).unwrap());
    // Somebody's filesystem: refused, untouched, unless forced.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(b"\x53\xef not a zmem store", 0).unwrap();
    }
    Command::new("blockdev").args(["--flushbufs", &dev.0]).status().unwrap();
    let msg = refused(path, Existing::Refuse);
    assert!(msg.contains("block device") && msg.contains("--force"), "{msg}");
    OsFile::open(path, Existing::Overwrite).unwrap();
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 3 * SEGMENT_SIZE as u64, "a device is never truncated");
}
