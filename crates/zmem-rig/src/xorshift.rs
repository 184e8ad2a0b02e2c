//! xorshift64 (Marsaglia, shifts 13, 7, 17): fast, deterministic, good
//! enough for test data. Not for anything that needs real randomness.

/// A deterministic xorshift64 generator of test data.
///
/// Two ways to start it:
/// * [`XorShift::new`] mixes the seed first (splitmix64), so every seed,
///   also 0 and neighbouring ones, gives its own unrelated stream;
/// * [`XorShift::from_state`] starts from the state exactly as given, for
///   streams that must stay bit-identical to a state chosen elsewhere.
///
/// Each step is `x ^= x << 13; x ^= x >> 7; x ^= x << 17`; [`next_u64`]
/// returns the new state. As an [`Iterator`] it yields the same values,
/// without end.
///
/// [`next_u64`]: XorShift::next_u64
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XorShift {
    state: u64,
}

impl XorShift {
    /// A generator for `seed`: the state is splitmix64 of the seed with its
    /// lowest bit set (so never 0), so every seed gives its own stream.
    pub fn new(seed: u64) -> Self {
        let mut x = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self { state: (x ^ (x >> 31)) | 1 }
    }

    /// A generator whose state is `state`, unchanged: the first value is
    /// one step from it.
    ///
    /// `state` must not be 0: xorshift maps 0 to 0, so the stream would be
    /// all zeros. The caller guarantees it (`seed | 1` does); debug builds
    /// check it.
    pub fn from_state(state: u64) -> Self {
        debug_assert!(state != 0, "xorshift64 from state 0 gives only zeros");
        Self { state }
    }

    /// The current state: the last value returned, or the starting state
    /// before the first step.
    pub fn state(&self) -> u64 {
        self.state
    }

    /// Advance one step and return the new state.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        x
    }

    /// The next value modulo `n` (`n` 0 counts as 1, giving 0). Slightly
    /// biased for an `n` that does not divide 2^64; fine for test data.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Fill `buf` with one step per byte: each byte is the low byte of the
    /// next value.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_u64() as u8;
        }
    }
}

impl Iterator for XorShift {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        Some(self.next_u64())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}

#[cfg(test)]
mod tests {
    use super::XorShift;

    /// The loop every test used to write by hand.
    fn by_hand(mut x: u64, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .collect()
    }

    #[test]
    fn known_first_values() {
        // xorshift64 from state 1: the published sequence of (13, 7, 17).
        let mut r = XorShift::from_state(1);
        assert_eq!(r.next_u64(), 0x0000_0000_4082_2041);
        assert_eq!(r.next_u64(), 0x1000_4106_0C01_1441);
        assert_eq!(by_hand(1, 2), vec![0x0000_0000_4082_2041, 0x1000_4106_0C01_1441]);
    }

    #[test]
    fn new_is_splitmix64_of_the_seed_with_the_low_bit_set() {
        // splitmix64's first output for seed 0 is 0xE220A8397B1DCDAF.
        assert_eq!(XorShift::new(0).state(), 0xE220_A839_7B1D_CDAF);
        // and for seed 1234567, 6457827717110365317 (both odd already).
        assert_eq!(XorShift::new(1234567).state(), 6_457_827_717_110_365_317);
        // Neighbouring seeds give unrelated streams.
        assert_ne!(XorShift::new(1).next_u64(), XorShift::new(2).next_u64());
        assert_ne!(XorShift::new(0).state(), 0);
    }

    #[test]
    fn from_state_matches_the_hand_written_loop() {
        for seed in [0u64, 1, 2, 7, 12345, 0x9E37_79B9_7F4A_7C15, 0x2545_F491_4F6C_DD1D, u64::MAX] {
            let mut r = XorShift::from_state(seed | 1);
            let got: Vec<u64> = (0..1000).map(|_| r.next_u64()).collect();
            assert_eq!(got, by_hand(seed | 1, 1000), "seed {seed:#x}");
            assert_eq!(r.state(), got[999]);
            // The iterator gives the same stream.
            assert_eq!(XorShift::from_state(seed | 1).take(1000).collect::<Vec<_>>(), got);
        }
    }

    #[test]
    fn fill_is_one_step_per_byte() {
        let mut buf = vec![0u8; 4099];
        XorShift::from_state(99).fill(&mut buf);
        let want: Vec<u8> = by_hand(99, 4099).into_iter().map(|x| x as u8).collect();
        assert_eq!(buf, want);
        // A fill continues the stream where it left off.
        let mut r = XorShift::from_state(99);
        let (mut a, mut b) = ([0u8; 10], [0u8; 4089]);
        r.fill(&mut a);
        r.fill(&mut b);
        assert_eq!([&a[..], &b[..]].concat(), want);
    }

    #[test]
    fn below_is_the_next_value_modulo_n() {
        let vals = by_hand(7, 4);
        let mut r = XorShift::from_state(7);
        assert_eq!(r.below(600), vals[0] % 600);
        assert_eq!(r.below(1), 0);
        assert_eq!(r.below(0), 0, "0 counts as 1");
        assert_eq!(r.below(u64::MAX), vals[3] % u64::MAX);
    }
}
