//! Input mutations: bit flips, interesting bytes, inserted, deleted, duplicated and spliced ranges,
//! truncation, dictionary tokens and extreme numbers — the moves of AFL and libFuzzer's mutators
//! without their coverage feedback.

/// xorshift64*: fast, deterministic, good enough to pick mutations.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced: xorshift needs a non-zero state).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: &[u8] = b"\x00\xff\x7f\x80\"{}[],:\n\r\t -09e.\\=#@";
const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "1e309",
    "-1e309",
    "4294967296",
    "65536",
    "0.0000001",
    "1.5",
    "NaN",
    "inf",
];

/// `base` changed by one to four mutations; `other` is a second input to splice from.
pub fn mutate(base: &[u8], other: &[u8], dict: &[&str], rng: &mut Rng) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..=rng.below(4) {
        let len = v.len();
        match rng.below(11) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 if len > 0 => {
                let i = rng.below(len);
                v[i] = rng.next() as u8;
            }
            3 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(64)).min(len);
                v.drain(a..b);
            }
            5 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(256)).min(len);
                let chunk = v[a..b].to_vec();
                let at = rng.below(len + 1);
                v.splice(at..at, chunk);
            }
            6 if !other.is_empty() => {
                let a = rng.below(other.len());
                let b = (a + 1 + rng.below(512)).min(other.len());
                let at = rng.below(len + 1);
                let end = (at + rng.below(512)).min(len);
                v.splice(at..end, other[a..b].iter().copied());
            }
            7 if len > 0 => v.truncate(rng.below(len)),
            8 if !dict.is_empty() => {
                let at = rng.below(len + 1);
                v.splice(at..at, dict[rng.below(dict.len())].bytes());
            }
            9 => {
                // Replace a run of digits (a number) with an extreme one.
                let digits: Vec<usize> = (0..len).filter(|&i| v[i].is_ascii_digit()).collect();
                if !digits.is_empty() {
                    let a = digits[rng.below(digits.len())];
                    let b = (a..len).find(|&i| !v[i].is_ascii_digit()).unwrap_or(len);
                    v.splice(a..b, NUMBERS[rng.below(NUMBERS.len())].bytes());
                }
            }
            _ => {
                // A run of one byte repeated: long lines, deep nesting.
                let at = rng.below(len + 1);
                let b = INTERESTING[rng.below(INTERESTING.len())];
                let n = 1 + rng.below(300);
                v.splice(at..at, std::iter::repeat_n(b, n));
            }
        }
    }
    v
}
