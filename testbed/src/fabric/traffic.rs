//! Traffic: long flows, and Poisson arrivals of flows whose sizes come from a flow-size CDF at a
//! given load (the WebSearch and FB Hadoop distributions as the HPCC simulator ships them in
//! `traffic_gen/`: the numbers are facts of those workloads, the code here is ours).
//!
//! Invariants: the same seed gives the same flows; sizes are at least one byte and at most the
//! CDF's largest point.
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng as _, SeedableRng};

/// A flow to run: `bytes` `None` is a long flow (it sends until the run ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSpec {
    pub src: usize,
    pub dst: usize,
    pub bytes: Option<u64>,
    pub start_ns: u64,
}

/// A flow-size distribution: points (size in bytes, cumulative probability 0…1), sizes between
/// points interpolated linearly as HPCC's `traffic_gen.py` does.
#[derive(Debug, Clone, PartialEq)]
pub struct Cdf {
    pub name: &'static str,
    pub points: Vec<(f64, f64)>,
}

impl Cdf {
    /// From `(size, percent)` pairs as in HPCC's distribution files.
    fn from_percent(name: &'static str, pts: &[(f64, f64)]) -> Cdf {
        Cdf {
            name,
            points: pts.iter().map(|&(s, p)| (s, p / 100.0)).collect(),
        }
    }

    /// WebSearch (DCTCP's measurement), as `traffic_gen/WebSearch_distribution.txt`.
    pub fn websearch() -> Cdf {
        Cdf::from_percent("websearch", WEBSEARCH)
    }

    /// Facebook Hadoop, as `traffic_gen/FbHdp_distribution.txt`.
    pub fn fbhdp() -> Cdf {
        Cdf::from_percent("fbhdp", FBHDP)
    }

    pub fn by_name(name: &str) -> Result<Cdf, String> {
        match name {
            "websearch" => Ok(Cdf::websearch()),
            "fbhdp" => Ok(Cdf::fbhdp()),
            _ => Err(format!("--cdf {name}: websearch or fbhdp")),
        }
    }

    /// The size at cumulative probability `u` (0…1).
    pub fn quantile(&self, u: f64) -> f64 {
        let p = &self.points;
        if u <= p[0].1 {
            return p[0].0;
        }
        for w in p.windows(2) {
            let ((s0, c0), (s1, c1)) = (w[0], w[1]);
            if u <= c1 {
                if c1 <= c0 {
                    return s1;
                }
                return s0 + (s1 - s0) * (u - c0) / (c1 - c0);
            }
        }
        p[p.len() - 1].0
    }

    /// The mean size, bytes (the integral of the interpolated distribution).
    pub fn mean(&self) -> f64 {
        let p = &self.points;
        let mut m = p[0].0 * p[0].1;
        for w in p.windows(2) {
            let ((s0, c0), (s1, c1)) = (w[0], w[1]);
            m += (s0 + s1) / 2.0 * (c1 - c0);
        }
        m
    }
}

/// A uniform draw in [0, 1) from `rng`'s top 53 bits.
pub fn unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Poisson arrivals over `hosts` (every host a source, each destination uniform among the
/// others) at `load` of each host's `bps`, for `duration_ns`, sizes from `cdf`.
pub fn poisson(
    hosts: &[usize],
    bps: u64,
    load: f64,
    cdf: &Cdf,
    duration_ns: u64,
    seed: u64,
) -> Vec<FlowSpec> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7472_6166_6669_6300);
    let mut unit = move || unit(&mut rng);
    // Flows per second over all hosts: load · n · bps / (8 · mean size).
    let rate = load * hosts.len() as f64 * bps as f64 / (8.0 * cdf.mean());
    let mut t = 0.0f64;
    let mut out = Vec::new();
    if hosts.len() < 2 || !(rate > 0.0 && rate.is_finite()) {
        return out;
    }
    loop {
        t += -(1.0 - unit()).ln() / rate * 1e9;
        // (One past the simulator's limit is enough for it to refuse the run.)
        if t >= duration_ns as f64 || out.len() > super::sim::MAX_FLOWS {
            return out;
        }
        let src = (unit() * hosts.len() as f64) as usize % hosts.len();
        let mut dst = (unit() * (hosts.len() - 1) as f64) as usize % (hosts.len() - 1);
        if dst >= src {
            dst += 1;
        }
        let bytes = cdf.quantile(unit()).round().max(1.0) as u64;
        out.push(FlowSpec {
            src: hosts[src],
            dst: hosts[dst],
            bytes: Some(bytes),
            start_ns: t as u64,
        });
    }
}

// (size in bytes, cumulative percent): the points of HPCC's distribution files.
const WEBSEARCH: &[(f64, f64)] = &[
    (0.0, 0.0),
    (10_000.0, 15.0),
    (20_000.0, 20.0),
    (30_000.0, 30.0),
    (50_000.0, 40.0),
    (80_000.0, 53.0),
    (200_000.0, 60.0),
    (1_000_000.0, 70.0),
    (2_000_000.0, 80.0),
    (5_000_000.0, 90.0),
    (10_000_000.0, 97.0),
    (30_000_000.0, 100.0),
];
const FBHDP: &[(f64, f64)] = &[
    (0.0, 0.0),
    (100.0, 1.0),
    (200.0, 2.0),
    (300.0, 5.0),
    (350.0, 15.0),
    (400.0, 20.0),
    (500.0, 30.0),
    (600.0, 40.0),
    (700.0, 50.0),
    (1_000.0, 60.0),
    (2_000.0, 67.0),
    (7_000.0, 70.0),
    (30_000.0, 72.0),
    (50_000.0, 82.0),
    (80_000.0, 87.0),
    (120_000.0, 90.0),
    (300_000.0, 95.0),
    (1_000_000.0, 97.5),
    (2_000_000.0, 99.0),
    (10_000_000.0, 100.0),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let c = Cdf {
            name: "t",
            points: vec![(100.0, 0.0), (200.0, 0.5), (1000.0, 1.0)],
        };
        assert_eq!(c.quantile(0.0), 100.0);
        assert_eq!(c.quantile(0.25), 150.0);
        assert_eq!(c.quantile(0.75), 600.0);
        assert_eq!(c.quantile(1.0), 1000.0);
        assert!((c.mean() - (150.0 * 0.5 + 600.0 * 0.5)).abs() < 1e-9);
    }

    #[test]
    fn the_means_are_hpccs() {
        // traffic_gen's getAvg over the same points: 1,711,250 B and 120,420.75 B.
        assert!((Cdf::websearch().mean() - 1_711_250.0).abs() < 1.0);
        assert!((Cdf::fbhdp().mean() - 120_420.75).abs() < 0.01);
    }

    #[test]
    fn poisson_is_seeded_and_loads_as_asked() {
        let hosts: Vec<usize> = (0..16).collect();
        let c = Cdf::websearch();
        let a = poisson(&hosts, 100_000_000_000, 0.3, &c, 50_000_000, 7);
        assert_eq!(a, poisson(&hosts, 100_000_000_000, 0.3, &c, 50_000_000, 7));
        assert_ne!(a, poisson(&hosts, 100_000_000_000, 0.3, &c, 50_000_000, 8));
        assert!(a.iter().all(|f| f.src != f.dst && f.bytes.unwrap() >= 1));
        // Offered bytes over capacity: the load, within sampling noise.
        let bytes: u64 = a.iter().map(|f| f.bytes.unwrap()).sum();
        let offered = bytes as f64 * 8.0 / (16.0 * 100e9 * 0.05);
        assert!((offered - 0.3).abs() < 0.06, "offered load {offered}");
    }
}
