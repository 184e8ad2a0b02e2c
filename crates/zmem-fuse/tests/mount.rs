//! The FUSE image, mounted for real (root, /dev/fuse): file I/O, holes,
//! bounds, and a loop device with direct I/O over it, discards included.
//! Every test unmounts and detaches what it set up, even when it fails.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use zmem_core::{Pool, PoolConfig};
use zmem_export::Export;
use zmem_fuse::{mount, FuseConfig, Mounted};
use zmem_testkit::XorShift;

const SIZE: u64 = 64 << 20;

fn usable() -> bool {
    if zmem_testkit::ci::effective_uid() != Some(0) {
        zmem_testkit::ci::skip("FUSE image tests need root");
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        zmem_testkit::ci::skip("no /dev/fuse");
        return false;
    }
    true
}

struct Fixture {
    pool: Arc<Pool>,
    mounted: Option<Mounted>,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::with(Pool::new(PoolConfig::default()).unwrap(), FuseConfig::default())
    }

    fn with(pool: Pool, cfg: FuseConfig) -> Fixture {
        let pool = Arc::new(pool);
        let export = Arc::new(Export::new(Arc::clone(&pool), SIZE));
        let dir = tempfile::tempdir().unwrap();
        let mounted = mount(export, dir.path(), &cfg).expect("mount the image");
        Fixture { pool, mounted: Some(mounted), dir }
    }

    /// Reads the read threads served so far.
    fn handed_off(&self) -> u64 {
        self.mounted.as_ref().map_or(0, |m| m.stats().reads_handed_off.load(Relaxed))
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("image")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            if let Err(e) = m.unmount() {
                eprintln!("unmount failed: {e}; lazy unmount");
                let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
            }
        }
    }
}

/// A loop device, detached when dropped.
struct Loop(String);

impl Loop {
    fn attach(file: &Path) -> Loop {
        let out = Command::new("losetup").args(["--direct-io=on", "--show", "-f"]).arg(file).output().expect("run losetup");
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        Loop(String::from_utf8(out.stdout).unwrap().trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = XorShift::from_state(seed | 1);
    let mut x = 0;
    (0..len)
        .map(|i| {
            if i % 64 == 0 {
                x = r.next_u64();
            }
            (x >> ((i % 8) * 8)) as u8 & 0x3f
        })
        .collect()
}

#[test]
fn the_image_is_a_file_of_the_export() {
    if usable() {
        file_io();
    }
}

#[test]
fn a_loop_device_with_direct_io_over_it() {
    if usable() {
        loop_io();
    }
}

/// With read threads, a read of a page written back to the cold store is
/// served by one of them and a read of a page in RAM where it was read;
/// either way the bytes are the ones written, also with reads from several
/// threads at once.
#[test]
fn reads_of_written_back_pages_go_to_the_read_threads() {
    if !usable() {
        return;
    }
    const PAGES: u64 = 64;
    let store = zmem_backing::BackingStore::new(Box::new(zmem_backing::MemFile::new(true)), None);
    let pool = Pool::with_cold_store(PoolConfig { max_pool: Some(32 << 20), ..PoolConfig::default() }, Box::new(store)).unwrap();
    let fx = Fixture::with(pool, FuseConfig { read_threads: 2, ..FuseConfig::default() });
    let f = OpenOptions::new().read(true).write(true).open(fx.file()).unwrap();
    let data = pattern(9, (PAGES * 4096) as usize);
    f.write_all_at(&data, 0).unwrap();
    let page = |k: u64| &data[(k * 4096) as usize..((k + 1) * 4096) as usize];
    let read_page = |k: u64| {
        let mut got = vec![0u8; 4096];
        f.read_exact_at(&mut got, k * 4096).unwrap();
        assert!(got == page(k), "page {k} read back wrong");
    };
    // In RAM: every read on the workers.
    (0..PAGES).for_each(read_page);
    assert_eq!(fx.handed_off(), 0, "pages in RAM are read where they were read");
    assert_eq!(fx.pool.writeback(zmem_core::WritebackMode::All, None).unwrap(), PAGES);
    // All on the file: every read handed off, each a page.
    (0..PAGES).for_each(read_page);
    assert_eq!(fx.handed_off(), PAGES);
    // A load may have brought a page back to RAM: only those still on the
    // file are handed off.
    let backed = (0..PAGES).filter(|&k| fx.pool.residency(k) == Some(zmem_core::Residency::Backed)).count() as u64;
    (0..PAGES).for_each(read_page);
    assert_eq!(fx.handed_off(), PAGES + backed);
    // Several readers at once, over pages on the file and in RAM.
    fx.pool.writeback(zmem_core::WritebackMode::All, None).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            s.spawn(move || (0..PAGES).map(|i| (i * 7 + t * 13) % PAGES).for_each(read_page));
        }
    });
    assert!(fx.handed_off() > PAGES + backed);
}

fn file_io() {
    let fx = Fixture::new();
    let meta = std::fs::metadata(fx.file()).unwrap();
    assert_eq!(meta.len(), SIZE);
    let names: Vec<_> = std::fs::read_dir(fx.dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("image")]);

    let mut f = OpenOptions::new().read(true).write(true).open(fx.file()).unwrap();
    // Aligned, unaligned and page-straddling writes read back.
    let a = pattern(1, 1 << 20);
    f.write_all_at(&a, 8 << 20).unwrap();
    let b = pattern(2, 5000);
    f.write_all_at(&b, 4096 * 3 + 100).unwrap();
    let mut got = vec![0u8; a.len()];
    f.read_exact_at(&mut got, 8 << 20).unwrap();
    assert!(got == a);
    let mut got = vec![0u8; b.len()];
    f.read_exact_at(&mut got, 4096 * 3 + 100).unwrap();
    assert_eq!(got, b);
    // Never written: zeroes. Past the end: a short read, and no growth.
    let mut z = vec![1u8; 4096];
    f.read_exact_at(&mut z, 32 << 20).unwrap();
    assert!(z.iter().all(|&x| x == 0));
    f.seek(SeekFrom::Start(SIZE - 10)).unwrap();
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).unwrap();
    assert_eq!(tail.len(), 10);
    let err = f.write_all_at(&[1u8; 4096], SIZE).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(f.set_len(SIZE * 2).is_err(), "the file cannot be resized");
    assert!(std::fs::File::create(fx.dir.path().join("other")).is_err(), "nothing else can be created");
    assert!(fx.pool.len() >= 256);

    // A hole punched frees the pool's pages and reads as zeroes.
    let before = fx.pool.len();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE, 8 << 20, 1 << 20).unwrap();
    assert_eq!(fx.pool.len(), before - 256);
    let mut got = vec![1u8; 1 << 20];
    f.read_exact_at(&mut got, 8 << 20).unwrap();
    assert!(got.iter().all(|&x| x == 0));
    f.flush().unwrap();
    f.sync_all().unwrap();
}

fn loop_io() {
    let fx = Fixture::new();
    let lo = Loop::attach(&fx.file());
    let data = pattern(7, 16 << 20);
    {
        let mut dev = OpenOptions::new().write(true).open(&lo.0).unwrap();
        dev.write_all(&data).unwrap();
        dev.sync_all().unwrap();
    }
    // The bytes are in the pool (read through the export, not the device).
    let exported = Export::new(Arc::clone(&fx.pool), SIZE);
    let mut got = vec![0u8; data.len()];
    exported.read(0, &mut got).unwrap();
    assert!(got == data, "what the loop device wrote is in the pool");
    let stored = fx.pool.len();
    assert!(stored >= 4096, "{stored} pages");
    // A discard on the loop device is a hole in the file: pages leave the pool.
    let st = Command::new("blkdiscard").args(["-o", "0", "-l", &(8u64 << 20).to_string()]).arg(&lo.0).status().unwrap();
    assert!(st.success());
    assert_eq!(fx.pool.len(), stored - 2048);
    let mut dev = OpenOptions::new().read(true).open(&lo.0).unwrap();
    let mut back = vec![0u8; 16 << 20];
    dev.read_exact(&mut back).unwrap();
    assert!(back[..8 << 20].iter().all(|&x| x == 0));
    assert!(back[8 << 20..] == data[8 << 20..]);
    let s = fx.mounted.as_ref().unwrap().stats();
    assert!(s.writes.load(Relaxed) > 0);
    assert!(s.discards.load(Relaxed) > 0);
}
