#![allow(dead_code)]
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Deterministic payload: `kind` 0 = random bytes (incompressible-looking),
/// 1 = a short repeating pattern, 2 = mostly zeros with a few bytes.
pub fn payload(len: usize, seed: u64, kind: u8) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    match kind % 3 {
        0 => (0..len).map(|_| rng.gen()).collect(),
        1 => {
            let pat: [u8; 7] = rng.gen();
            (0..len).map(|i| pat[i % 7]).collect()
        }
        _ => {
            let mut v = vec![0u8; len];
            for _ in 0..4 {
                let i = rng.gen_range(0..len);
                v[i] = rng.gen();
            }
            v
        }
    }
}
