//! TIMELY (Mittal et al., "TIMELY: RTT-based Congestion Control for the Datacenter", SIGCOMM
//! 2015): one QP's rate from RTT samples (request sent to its ACK), in integer arithmetic.
//!
//! Per sample `rtt` (Algorithm 1 of the paper):
//!
//! ```text
//! new_rtt_diff = rtt − prev_rtt                      (0 at the first sample);  prev_rtt = rtt
//! rtt_diff     = (1 − α)·rtt_diff + α·new_rtt_diff   (EWMA)
//! gradient     = rtt_diff / min_rtt
//! rtt < Tlow:        rate += δ
//! rtt > Thigh:       rate ·= 1 − β·(1 − Thigh/rtt)
//! gradient ≤ 0:      rate += N·δ,  N = 5 after 5 consecutive negative gradients (HAI), else 1
//! otherwise:         rate ·= 1 − β·gradient
//! ```
//!
//! and the rate stays within `[min_rate, line rate]`. Integers: rates in kb/s, times in ns, α
//! and β in 1/1000, `rtt_diff` in 1/1000 ns and the gradient in 1/1000; every division
//! truncates toward zero. The negative-gradient count follows every sample's gradient sign
//! (a sample whose gradient is not negative resets it), whatever branch the RTT takes.
//!
//! Defaults ([`TimelyParams::default`]): Tlow 50 µs, Thigh 500 µs, min_rtt 20 µs, β 0.8,
//! α 0.875, δ 10 Mb/s, as the TIMELY fluid model of Zhu et al. ("ECN or Delay", CoNEXT 2016)
//! sets them (`fluidmodel/timely/timely2.m` in the repository `jitupadhye-zz/rdma`, read through
//! the search tool) and cites §4.4 of the paper for the thresholds. **Unverified**: that these
//! are the paper's own defaults (the paper was not read here; that file marks α "unsure"); HAI's
//! exact trigger (negative vs non-positive gradients, and which samples reset the count); the
//! floor `min_rate` (1 Mb/s, ours — the paper gives none). In the datapath through `qp.rs`.

/// TIMELY's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelyParams {
    /// µs: below it the rate grows by δ whatever the gradient.
    pub t_low_us: u32,
    /// µs: above it the rate is cut by β·(1 − Thigh/rtt).
    pub t_high_us: u32,
    /// µs: the gradient's normaliser.
    pub min_rtt_us: u32,
    /// Multiplicative decrease, 1/1000.
    pub beta_milli: u32,
    /// EWMA weight of the newest RTT difference, 1/1000.
    pub alpha_milli: u32,
    /// Mb/s: the additive step.
    pub delta_mbps: u32,
    /// Consecutive negative gradients before hyper-additive increase.
    pub hai_after: u32,
    /// Steps of δ per increase in HAI mode.
    pub hai_n: u32,
    /// Mb/s: the floor.
    pub min_rate_mbps: u32,
}

impl Default for TimelyParams {
    fn default() -> Self {
        TimelyParams {
            t_low_us: 50,
            t_high_us: 500,
            min_rtt_us: 20,
            beta_milli: 800,
            alpha_milli: 875,
            delta_mbps: 10,
            hai_after: 5,
            hai_n: 5,
            min_rate_mbps: 1,
        }
    }
}

/// Which rule a sample applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimelyRule {
    BelowTlow,
    AboveThigh,
    Increase { n: u32 },
    Decrease,
}

/// One QP's TIMELY state.
#[derive(Debug, Clone)]
pub struct TimelyRp {
    p: TimelyParams,
    max: u64,
    min: u64,
    rate: u64,
    prev_rtt: Option<u64>,
    /// 1/1000 ns.
    rtt_diff: i64,
    neg: u32,
}

impl TimelyRp {
    /// At line rate.
    pub fn new(p: TimelyParams, line_rate_mbps: u32) -> TimelyRp {
        let max = u64::from(line_rate_mbps) * 1_000;
        TimelyRp {
            p,
            max,
            min: (u64::from(p.min_rate_mbps) * 1_000).min(max),
            rate: max,
            prev_rtt: None,
            rtt_diff: 0,
            neg: 0,
        }
    }

    pub fn params(&self) -> &TimelyParams {
        &self.p
    }
    /// kb/s.
    pub fn rate_kbps(&self) -> u64 {
        self.rate
    }
    /// The EWMA of RTT differences, 1/1000 ns.
    pub fn rtt_diff_milli_ns(&self) -> i64 {
        self.rtt_diff
    }
    /// The normalised gradient, 1/1000.
    pub fn gradient_milli(&self) -> i64 {
        self.rtt_diff / (i64::from(self.p.min_rtt_us.max(1)) * 1_000)
    }

    /// An RTT sample of `rtt_ns`: the new rate, and the rule that made it.
    pub fn on_rtt(&mut self, rtt_ns: u64) -> TimelyRule {
        let rtt_ns = rtt_ns.min(i64::MAX as u64 / 4_000);
        let new_diff = match self.prev_rtt {
            Some(prev) => rtt_ns as i64 - prev as i64,
            None => 0,
        };
        self.prev_rtt = Some(rtt_ns);
        let a = i64::from(self.p.alpha_milli.min(1_000));
        self.rtt_diff = ((1_000 - a) * self.rtt_diff + a * new_diff * 1_000) / 1_000;
        let g = self.gradient_milli();
        self.neg = if g < 0 { self.neg.saturating_add(1) } else { 0 };
        let beta = u128::from(self.p.beta_milli.min(1_000));
        let delta = u64::from(self.p.delta_mbps) * 1_000;
        let (t_low, t_high) = (us(self.p.t_low_us), us(self.p.t_high_us));
        let rule = if rtt_ns < t_low {
            self.rate = self.rate.saturating_add(delta);
            TimelyRule::BelowTlow
        } else if rtt_ns > t_high {
            // rate·β·(rtt − Thigh)/rtt, β in 1/1000
            let cut = u128::from(self.rate) * beta * u128::from(rtt_ns - t_high)
                / (u128::from(rtt_ns) * 1_000);
            self.rate = self.rate.saturating_sub(cut as u64);
            TimelyRule::AboveThigh
        } else if g <= 0 {
            let n = if self.neg >= self.p.hai_after {
                self.p.hai_n
            } else {
                1
            };
            self.rate = self.rate.saturating_add(delta.saturating_mul(u64::from(n)));
            TimelyRule::Increase { n }
        } else {
            // rate·β·g, both in 1/1000
            let cut = u128::from(self.rate) * beta * g as u128 / 1_000_000;
            self.rate = self
                .rate
                .saturating_sub(cut.min(u128::from(u64::MAX)) as u64);
            TimelyRule::Decrease
        };
        self.rate = self.rate.clamp(self.min, self.max);
        rule
    }
}

fn us(v: u32) -> u64 {
    u64::from(v) * 1_000
}
