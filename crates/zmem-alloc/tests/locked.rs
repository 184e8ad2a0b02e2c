//! A process that has locked all its memory (`mlockall`, as `zmem swap`'s
//! server does) still gives the pages of emptied spans back: the kernel
//! refuses `MADV_DONTNEED` on locked pages, but a hole punched in the
//! arena file frees them, locked or not. Its own process: mlockall is
//! process-wide.

use zmem_alloc::{AllocConfig, ZsPool};

#[test]
fn emptied_spans_are_released_under_mlockall() {
    use rustix::mm::{mlockall, munlockall, MlockAllFlags};
    let flags = MlockAllFlags::CURRENT | MlockAllFlags::FUTURE | MlockAllFlags::ONFAULT;
    if let Err(e) = mlockall(flags) {
        zmem_testkit::ci::skip(&format!("mlockall refused ({e}): needs root or a big RLIMIT_MEMLOCK"));
        return;
    }
    let pool = ZsPool::new(AllocConfig::default());
    let hs: Vec<_> = (0..4000u32).map(|i| pool.alloc_write(&vec![(i % 251) as u8; 1000 + (i as usize % 7) * 300]).unwrap()).collect();
    assert!(pool.resident_pages_of_live_spans() > 500);
    for h in hs {
        pool.free(h).unwrap();
    }
    let stuck = pool.resident_pages_of_released_spans();
    munlockall().unwrap();
    assert_eq!(pool.pages_used(), 0);
    assert_eq!(stuck, 0, "pages of released spans stayed resident under mlockall");
}
