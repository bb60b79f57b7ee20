//! Two generators for two jobs, both deterministic for a seed.
//!
//! * [`KeyRng`] draws what a peer must not guess: L_Keys and R_Keys, the keys of the QPN
//!   permutation, initial PSNs, the addresses `reg_mr` picks, and the connection manager's
//!   communication and transaction IDs. It is ChaCha20 (`rand_chacha`), so outputs seen on the
//!   wire say nothing about the ones to come. In deployment its [`Seed`] is 32 bytes from the
//!   operating system ([`Seed::from_os`], `getrandom`); the simulator, the tests and `--seed`
//!   replays give a `u64` ([`Seed::from_u64`]) and get the same keys every run.
//! * [`Rng`] (xoshiro256**, seeded through SplitMix64) is a fast generator for what is not a
//!   secret: the link and port impairments (loss, reorder, duplicate, corrupt). Its state is a
//!   linear function of its outputs, so a peer that sees a few of them can predict the rest
//!   (ReDMArk, USENIX Security 2021, showed what predictable R_Keys and PSNs cost): never draw
//!   keys from it.
use rand_chacha::ChaCha20Rng;
use rand_core::{Rng as _, SeedableRng};

/// What a [`KeyRng`] starts from.
#[derive(Clone, PartialEq, Eq)]
pub enum Seed {
    /// A replayable seed (the simulator, tests, `--seed N`): expanded as
    /// `ChaCha20Rng::seed_from_u64` does.
    U64(u64),
    /// A full 256-bit ChaCha key, as the operating system gives it.
    Bytes([u8; 32]),
}

impl Seed {
    pub fn from_u64(seed: u64) -> Seed {
        Seed::U64(seed)
    }

    /// 32 bytes from the operating system's generator (`getrandom(2)` on Linux).
    pub fn from_os() -> Result<Seed, String> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b)
            .map_err(|e| format!("no seed from the operating system's random generator: {e}"))?;
        Ok(Seed::Bytes(b))
    }

    /// `--seed N` when given (a replay), else the operating system's.
    pub fn replay_or_os(seed: Option<u64>) -> Result<Seed, String> {
        match seed {
            Some(n) => Ok(Seed::U64(n)),
            None => Seed::from_os(),
        }
    }
}

impl From<u64> for Seed {
    fn from(seed: u64) -> Seed {
        Seed::U64(seed)
    }
}

/// A replayable seed is printed; one from the operating system is not (it is the key of every
/// key the RNIC hands out).
impl std::fmt::Debug for Seed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seed::U64(n) => write!(f, "Seed::U64({n})"),
            Seed::Bytes(_) => f.write_str("Seed::Bytes(..)"),
        }
    }
}

/// The cryptographic generator for the core's secrets (see the module comment). Key draws are
/// rare (registrations, QP and connection set-up), never per packet.
#[derive(Debug, Clone)]
pub struct KeyRng(ChaCha20Rng);

impl KeyRng {
    pub fn new(seed: &Seed) -> KeyRng {
        KeyRng(match seed {
            Seed::U64(n) => ChaCha20Rng::seed_from_u64(*n),
            Seed::Bytes(b) => ChaCha20Rng::from_seed(*b),
        })
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    pub fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }

    /// Uniform in `0..n` (n > 0; the bias of the multiply-shift is below n / 2^64).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// A fresh 256-bit seed for a generator beside this one (a connection manager's), drawn from
    /// this stream: as unguessable as its parent, and replayed with it.
    pub fn fork(&mut self) -> Seed {
        let mut b = [0u8; 32];
        self.0.fill_bytes(&mut b);
        Seed::Bytes(b)
    }
}

/// The fast generator for link and port impairments: not for secrets (see the module comment).
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A float in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.next_f64() < p
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_spread() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let mut c = Rng::new(8);
        let va: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let vb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let vc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(va, vb);
        assert_ne!(va, vc);
        let mut r = Rng::new(1);
        let hits = (0..10_000).filter(|_| r.chance(0.25)).count();
        assert!((2_200..2_800).contains(&hits), "{hits}");
        assert!((0..1000).all(|_| r.below(10) < 10));
    }

    fn words(bytes: &str) -> Vec<u32> {
        (0..bytes.len() / 8)
            .map(|i| {
                let b = u32::from_str_radix(&bytes[i * 8..i * 8 + 8], 16).unwrap();
                b.swap_bytes() // the keystream's bytes, read as little-endian words
            })
            .collect()
    }

    /// The key generator is ChaCha20: its first block for a given key is the reference
    /// keystream (block counter 0, nonce 0).
    #[test]
    fn key_rng_is_the_chacha20_keystream() {
        // RFC 8439 appendix A.1, test vector #1: the all-zero key.
        let zero = words(
            "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7\
             da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586",
        );
        let mut k = KeyRng::new(&Seed::Bytes([0; 32]));
        assert_eq!((0..16).map(|_| k.next_u32()).collect::<Vec<_>>(), zero);
        // The key 00 01 .. 1f, as OpenSSL's ChaCha20 computes it (counter 0, nonce 0).
        let mut key = [0u8; 32];
        key.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let counting = words(
            "39fd2b7dd9c5196a8dbd0377b8dc4a498a35d86fbcde6accb2cc7d4cd8ea2492\
             2b23cce7a26023ab3f0eef693ac87f64258235eab1f7a32dc22762a0485b410c",
        );
        let mut k = KeyRng::new(&Seed::Bytes(key));
        assert_eq!((0..16).map(|_| k.next_u32()).collect::<Vec<_>>(), counting);
        // A u64 seed is rand_core's expansion of it into a ChaCha20 key.
        let mut a = KeyRng::new(&Seed::from_u64(7));
        let mut b = ChaCha20Rng::seed_from_u64(7);
        assert!((0..64).all(|_| a.next_u64() == b.next_u64()));
    }

    #[test]
    fn key_rng_replays_a_u64_seed_and_forks_apart() {
        let run = |s| {
            let mut k = KeyRng::new(&Seed::from_u64(s));
            let f = k.fork();
            let mut c = KeyRng::new(&f);
            (
                (0..8).map(|_| k.next_u32()).collect::<Vec<_>>(),
                c.next_u64(),
            )
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
        let (parent, child) = run(5);
        assert_ne!(parent[0] as u64, child);
    }

    /// Two seeds from the operating system in a row (the same microsecond, the same process)
    /// give unrelated generators: nothing of the clock or the pid is in them.
    #[test]
    fn os_seeds_differ_within_one_process_and_instant() {
        let a = Seed::from_os().unwrap();
        let b = Seed::from_os().unwrap();
        assert_ne!(a, b);
        let (mut ka, mut kb) = (KeyRng::new(&a), KeyRng::new(&b));
        let va: Vec<u32> = (0..4).map(|_| ka.next_u32()).collect();
        let vb: Vec<u32> = (0..4).map(|_| kb.next_u32()).collect();
        assert!(va.iter().zip(&vb).all(|(x, y)| x != y), "{va:x?} {vb:x?}");
        assert_eq!(
            format!("{a:?}"),
            "Seed::Bytes(..)",
            "an OS seed is never printed"
        );
    }
}
