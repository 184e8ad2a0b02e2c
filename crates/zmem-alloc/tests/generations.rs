//! Handle generations wrap: after 2^24 - 1 reuses of one handle-table slot
//! the generation goes back to 1 (never 0, so no handle is ever 0). Across
//! the wrap every stale handle is still refused: a free always moves the
//! slot's generation on, so the handle freed last never matches the next.
//! (A stale handle kept through 2^24 - 1 reuses of its slot would alias; the
//! crate documentation states that limit.) Kept out of the memcheck run:
//! it makes 16.8 million allocations.

use zmem_alloc::{AllocError, Handle, ZsPool};

fn gen(h: Handle) -> u64 {
    (h.to_raw() >> 40) & ((1 << 24) - 1)
}

#[test]
fn handle_generations_wrap_to_one_and_stale_handles_stay_refused() {
    let pool = ZsPool::default();
    // Keeps the span alive, so the cycle below reuses one slot and one
    // handle-table entry without releasing memory each time.
    let _anchor = pool.alloc_write(&[1u8; 100]).unwrap();
    let mut prev: Option<Handle> = None;
    let mut wrapped = false;
    let cycles = (1u64 << 24) + 8;
    for i in 0..cycles {
        let h = pool.alloc_write(&[(i % 251) as u8; 100]).unwrap();
        assert_ne!(h.to_raw(), 0, "cycle {i}: a zero handle");
        if let Some(p) = prev {
            assert_eq!(p.to_raw() & 0xff_ffff_ffff, h.to_raw() & 0xff_ffff_ffff, "the same slot is reused");
            if gen(h) < gen(p) {
                assert_eq!((gen(p), gen(h)), ((1 << 24) - 1, 1), "cycle {i}: the wrap skips 0");
                wrapped = true;
            }
            // The handle freed just before is refused, even right after the wrap.
            assert!(matches!(pool.read(p, |_| ()), Err(AllocError::InvalidHandle { .. })), "cycle {i}");
            assert!(matches!(pool.free(p), Err(AllocError::InvalidHandle { .. })), "cycle {i}");
        }
        assert_eq!(pool.read(h, |b| b[0]).unwrap(), (i % 251) as u8);
        pool.free(h).unwrap();
        prev = Some(h);
    }
    assert!(wrapped, "2^24 + 8 reuses must wrap the generation");
}
