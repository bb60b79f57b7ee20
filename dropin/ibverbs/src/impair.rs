//! Seeded impairments of the RNIC's frames, from the environment: `ROCEMU_LOSS`,
//! `ROCEMU_REORDER`, `ROCEMU_DUPLICATE`, `ROCEMU_CORRUPT` (probabilities per frame, 0…1, as
//! `rocemu perf --loss` takes them) and `ROCEMU_SEED` (an unsigned integer: the impairments'
//! seed, default 1, and the RNIC's, whose keys, QPNs, PSNs and CM IDs otherwise come from the
//! operating system). `rocemu exec --loss P …` sets them.
//!
//! Invariant: a value that is not a number in range (or a seed that is not an integer) is a
//! configuration error: one line on stderr and no device, as for the other `ROCEMU_*`
//! variables, never a silently unimpaired run. A variable that is unset or empty is 0.
use rocemu_emulator::inproc::Impairments;

/// What the environment asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Impair {
    pub imp: Impairments,
    /// `ROCEMU_SEED`, when set.
    pub seed: Option<u64>,
}

impl Impair {
    /// The impairments' seed: `ROCEMU_SEED`, or 1 (as `rocemu perf`'s `--seed`).
    pub fn impair_seed(&self) -> u64 {
        self.seed.unwrap_or(1)
    }
}

/// The variables, read from `get` (the environment in the library; a table in the tests).
pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Impair, String> {
    let mut imp = Impairments::default();
    for (var, field) in [
        ("ROCEMU_LOSS", &mut imp.loss),
        ("ROCEMU_REORDER", &mut imp.reorder),
        ("ROCEMU_DUPLICATE", &mut imp.duplicate),
        ("ROCEMU_CORRUPT", &mut imp.corrupt),
    ] {
        let Some(v) = get(var).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        // (`contains` is false for NaN, so "nan" is refused with the infinities.)
        match v.trim().parse::<f64>() {
            Ok(p) if (0.0..=1.0).contains(&p) => *field = p,
            _ => {
                return Err(format!(
                    "rocemu: {var}={v}: a probability is a number between 0 and 1; no device"
                ))
            }
        }
    }
    let seed = match get("ROCEMU_SEED").filter(|v| !v.trim().is_empty()) {
        None => None,
        Some(v) => Some(v.trim().parse::<u64>().map_err(|_| {
            format!("rocemu: ROCEMU_SEED={v}: a seed is an unsigned 64-bit integer; no device")
        })?),
    };
    Ok(Impair { imp, seed })
}

/// From the process's environment.
pub fn from_env() -> Result<Impair, String> {
    parse(|k| std::env::var(k).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(vars: &[(&str, &str)]) -> Result<Impair, String> {
        parse(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_is_none() {
        let i = of(&[]).unwrap();
        assert!(i.imp.is_none());
        assert_eq!(i.seed, None);
        assert_eq!(i.impair_seed(), 1);
        assert!(of(&[("ROCEMU_LOSS", "")]).unwrap().imp.is_none());
    }

    #[test]
    fn values_are_read() {
        let i = of(&[
            ("ROCEMU_LOSS", "0.05"),
            ("ROCEMU_REORDER", "0.1"),
            ("ROCEMU_DUPLICATE", "1"),
            ("ROCEMU_CORRUPT", "0"),
            ("ROCEMU_SEED", "42"),
        ])
        .unwrap();
        assert_eq!(i.imp.loss, 0.05);
        assert_eq!(i.imp.reorder, 0.1);
        assert_eq!(i.imp.duplicate, 1.0);
        assert_eq!(i.imp.corrupt, 0.0);
        assert_eq!(i.seed, Some(42));
        assert_eq!(i.impair_seed(), 42);
    }

    #[test]
    fn bad_values_are_refused_with_the_variable() {
        for (k, v) in [
            ("ROCEMU_LOSS", "1.5"),
            ("ROCEMU_LOSS", "-0.1"),
            ("ROCEMU_REORDER", "nan"),
            ("ROCEMU_DUPLICATE", "inf"),
            ("ROCEMU_CORRUPT", "5%"),
            ("ROCEMU_SEED", "-1"),
            ("ROCEMU_SEED", "0x10"),
        ] {
            let e = of(&[(k, v)]).unwrap_err();
            assert!(e.contains(&format!("{k}={v}")), "{e}");
            assert!(e.ends_with("no device"), "{e}");
            assert_eq!(e.lines().count(), 1);
        }
    }
}
