//! DCQCN's reaction point (RP): one QP's sending rate, cut by CNPs and recovered by a timer and a
//! byte counter, with mlx5's parameter names, defaults and units ([`DcqcnParams`]).
//!
//! The state machine, in integer arithmetic (rates in kb/s, alpha in 1/1024 units):
//!
//! - **Idle** until the first CNP: the QP sends at line rate ([`DcqcnParams::max_rate_mbps`]) and
//!   no timer runs. The first CNP activates the RP with `alpha = initial_alpha_value`, starts the
//!   alpha timer (every `dce_tcp_rtt`) and cuts the rate (or sets current and target rate to
//!   `rate_to_set_on_first_cnp` when that is not 0).
//! - **Alpha**: at every `dce_tcp_rtt` tick, `alpha = alpha·g/1024 + (1024 − g)` if a CNP came
//!   in the period that ends, `alpha·g/1024` otherwise (`g` = `dce_tcp_g`). Alpha is shown in
//!   1/1024 units ([`DcqcnRp::alpha`]) but held with 10 more fraction bits (1/2^20,
//!   [`DcqcnRp::alpha_fine`]), products floored: with 10 bits only, the floor of every step
//!   makes alpha halve in 127 periods instead of the formula's 141.6 (the issue expects about
//!   141; with 20 bits it is 142). ConnectX's internal precision is unverified.
//! - **Cut**: a CNP cuts at most once per `rate_reduce_monitor_period` (a CNP inside the period of
//!   the last cut is *ignored* for the rate — mlx5's `rp_cnp_ignored` — but still counts for
//!   alpha). A cut: `rt = rc` when `clamp_tgt_rate` is set, at the first cut after activation,
//!   and at a cut after an increase event of the byte counter (or of the timer, with
//!   `clamp_tgt_rate_after_time_inc`); the other cuts of an episode leave `rt`. Then `rc -= min(rc·alpha >> rpg_gd, rc·(100 − rpg_min_dec_fac)/100)` (with
//!   the fine alpha, `>> (rpg_gd + 10)`), never below `rpg_min_rate`; the increase stages
//!   `T`, `BC`, the byte count and the `rpg_time_reset` timer restart.
//! - **Increase events**: every `rpg_time_reset` µs (`T += 1`) and every `rpg_byte_reset`·64 bytes
//!   sent (`BC += 1`). With `F = rpg_threshold`, counted after the increment:
//!   `max(T, BC) ≤ F` → fast recovery `rc = ⌈(rt + rc)/2⌉`; `min(T, BC) > F` → hyper increase
//!   `rt += rpg_hai_rate`, `rc = ⌈(rt + rc)/2⌉`; otherwise additive increase `rt += rpg_ai_rate`,
//!   (with `rpg_byte_reset` 0, the byte counter is off and `BC` is taken as `T`),
//!   `rc = ⌈(rt + rc)/2⌉`. `rt` and `rc` never exceed the line rate. The average rounds up so
//!   that `rc` reaches `rt` (a floored average stops one kb/s short). When `rc` and `rt` are both
//!   back at line rate the RP goes idle again (its timers stop, as a released rate limiter).
//!
//! Timers are data: [`DcqcnRp::next_deadline`] says when [`DcqcnRp::poll`] has work; `on_cnp`
//! and `on_tx` poll first, so events are seen in time order. `poll` is idempotent. Ticks due at
//! the same instant are served alpha first, then the increase timer.
//!
//! Sources (checked, see `docs/congestion.md`): the parameter names are the fields of mlx5's
//! `cong_control_r_roce_ecn_rp` / `_np` as Linux `drivers/infiniband/hw/mlx5/cong.c` reads and
//! writes them (`rpg_time_reset`, `rpg_byte_reset`, `rpg_threshold`, `rpg_ai_rate`,
//! `rpg_hai_rate`, `rpg_min_dec_fac`, `rpg_min_rate`, `rate_to_set_on_first_cnp`, `dce_tcp_g`,
//! `dce_tcp_rtt`, `rate_reduce_monitor_period`, `initial_alpha_value`, `rpg_gd`,
//! `clamp_tgt_rate`, `clamp_tgt_rate_after_time_inc`, `cnp_dscp`, `cnp_802p_prio`); NVIDIA's
//! "DCQCN CC Parameters" page (DOCA 3.4.0 archive) for `dce_tcp_g` (fixed point, 10 fraction
//! bits, default 1019), `dce_tcp_rtt` (µs, default 1), `initial_alpha_value` (default 1023),
//! `rate_to_set_on_first_cnp` (Mb/s, 0), `rpg_min_dec_fac` (%, 50), `rpg_min_rate` (Mb/s, 1),
//! `rpg_gd` (α to rate-reduction shift) and the alpha rule (up with a CNP in the period, down
//! otherwise); the increase rules follow the DCQCN paper (Zhu et al., SIGCOMM 2015), not read
//! here. The two clamps follow Mellanox's descriptions as an ns-3 RDMA simulator's `third.cc`
//! quotes them ("clamp_tgt_rate (false) - when receiving a CNP, the target rate is always updated
//! to be the current rate"; "clamp_tgt_rate_after_time_inc (true) - … updated to be the current
//! rate also if the last rate increase event was due to the timer, and not only due to the byte
//! counter"): a secondary source, NVIDIA's own page is not in the stored copies. HPCC's
//! simulator does the same with its defaults (no clamp while still in stage 0).
//! **Unverified**: the exact stage conditions and the hyper-increase step on ConnectX, whether the first CNP cuts as well
//! as setting `rate_to_set_on_first_cnp`, and the units of `rpg_time_reset` / `rpg_byte_reset`
//! beyond the issue's statement. NVIDIA calls `rpg_min_dec_fac` "the maximal ratio of rate
//! decrease in a single event"; the bound here is the issue's `rc·(1 − min_dec_fac)`, the same
//! at the default 50 %.
use crate::time::Nanos;

/// mlx5's DCQCN parameters (reaction and notification point), named as the device's fields.
/// Units as mlx5 gives them; every field is settable, [`Default`] is ConnectX's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcqcnParams {
    /// µs between timer-driven increase events.
    pub rpg_time_reset: u32,
    /// 64-byte units sent between byte-counter increase events (0: the byte counter is off).
    pub rpg_byte_reset: u32,
    /// `F`: the stage count that separates fast recovery, additive and hyper increase.
    pub rpg_threshold: u32,
    /// Mb/s added to the target rate by an additive increase.
    pub rpg_ai_rate: u32,
    /// Mb/s added to the target rate by a hyper increase.
    pub rpg_hai_rate: u32,
    /// The shift between alpha and the cut: `rc·alpha >> rpg_gd` (alpha in 1/1024).
    pub rpg_gd: u32,
    /// %: a cut keeps at least this share of the rate (at most `100 − this` % is cut).
    pub rpg_min_dec_fac: u32,
    /// Mb/s: the rate never goes below this.
    pub rpg_min_rate: u32,
    /// Mb/s: the rate ceiling; 0 is the line rate.
    pub rpg_max_rate: u32,
    /// Alpha's gain, of 1024.
    pub dce_tcp_g: u32,
    /// µs: alpha's update period.
    pub dce_tcp_rtt: u32,
    /// µs: at most one cut per this period.
    pub rate_reduce_monitor_period: u32,
    /// Alpha (of 1024) at the first CNP.
    pub initial_alpha_value: u32,
    /// 1: the target rate is set to the current rate only at the first cut (unverified).
    pub clamp_tgt_rate: u32,
    /// Stored only: its effect on ConnectX is unverified and none is modelled.
    pub clamp_tgt_rate_after_time_inc: u32,
    /// Mb/s: current and target rate at the first CNP; 0 is off.
    pub rate_to_set_on_first_cnp: u32,
    /// µs: the NP sends at most one CNP per QP per this period.
    pub min_time_between_cnps: u32,
    /// The DSCP of the CNPs the NP sends.
    pub cnp_dscp: u8,
    /// The 802.1p priority of the CNPs the NP sends (on a VLAN).
    pub cnp_802p_prio: u8,
}

impl Default for DcqcnParams {
    fn default() -> Self {
        DcqcnParams {
            rpg_time_reset: 300,
            rpg_byte_reset: 32767,
            rpg_threshold: 1,
            rpg_ai_rate: 5,
            rpg_hai_rate: 50,
            rpg_gd: 11,
            rpg_min_dec_fac: 50,
            rpg_min_rate: 1,
            rpg_max_rate: 0,
            dce_tcp_g: 1019,
            dce_tcp_rtt: 1,
            rate_reduce_monitor_period: 4,
            initial_alpha_value: 1023,
            clamp_tgt_rate: 0,
            clamp_tgt_rate_after_time_inc: 1,
            rate_to_set_on_first_cnp: 0,
            min_time_between_cnps: 4,
            cnp_dscp: 48,
            cnp_802p_prio: 6,
        }
    }
}

impl DcqcnParams {
    /// The ceiling in Mb/s for a port of `line_rate_mbps`: `rpg_max_rate` when set and lower.
    pub fn max_rate_mbps(&self, line_rate_mbps: u32) -> u32 {
        match self.rpg_max_rate {
            0 => line_rate_mbps,
            m => m.min(line_rate_mbps),
        }
    }
}

/// Alpha's full scale: alpha is shown in 1/1024 units, at most 1023.
pub const ALPHA_ONE: u32 = 1024;
/// The extra fraction bits alpha is held with.
pub const ALPHA_FINE_BITS: u32 = 10;
const ALPHA_FINE_MAX: u32 = (ALPHA_ONE << ALPHA_FINE_BITS) - 1;

/// What a CNP did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CnpOutcome {
    /// It cut the rate (or set `rate_to_set_on_first_cnp`): mlx5's `rp_cnp_handled`.
    Handled,
    /// Inside the monitor period of the last cut: counted for alpha only (`rp_cnp_ignored`).
    Ignored,
}

/// One QP's DCQCN reaction point. Sans-IO: every entry point takes `now`.
#[derive(Debug, Clone)]
pub struct DcqcnRp {
    p: DcqcnParams,
    /// The ceiling, kb/s.
    max: u64,
    /// The floor, kb/s (at most the ceiling).
    min: u64,
    /// Current rate, kb/s.
    rc: u64,
    /// Target rate, kb/s.
    rt: u64,
    alpha: u32,
    active: bool,
    cnp_in_period: bool,
    next_alpha: Nanos,
    next_increase: Option<Nanos>,
    last_cut: Option<Nanos>,
    cuts: u32,
    t_stage: u32,
    bc_stage: u32,
    bytes: u64,
    /// What drove the last increase event since the last cut (none yet: `None`).
    last_increase: Option<Increase>,
}

/// What an increase event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Increase {
    Timer,
    Bytes,
}

fn us(v: u32) -> u64 {
    u64::from(v) * 1_000
}

impl DcqcnRp {
    /// An idle RP at line rate.
    pub fn new(p: DcqcnParams, line_rate_mbps: u32) -> DcqcnRp {
        let max = u64::from(p.max_rate_mbps(line_rate_mbps)) * 1_000;
        let min = (u64::from(p.rpg_min_rate) * 1_000).min(max);
        DcqcnRp {
            p,
            max,
            min,
            rc: max,
            rt: max,
            alpha: p.initial_alpha_value.min(ALPHA_ONE - 1) << ALPHA_FINE_BITS,
            active: false,
            cnp_in_period: false,
            next_alpha: Nanos::ZERO,
            next_increase: None,
            last_cut: None,
            cuts: 0,
            t_stage: 0,
            bc_stage: 0,
            bytes: 0,
            last_increase: None,
        }
    }

    pub fn params(&self) -> &DcqcnParams {
        &self.p
    }
    /// The current rate, kb/s.
    pub fn rate_kbps(&self) -> u64 {
        self.rc
    }
    /// The target rate, kb/s.
    pub fn target_kbps(&self) -> u64 {
        self.rt
    }
    /// Alpha, of 1024 (floored).
    pub fn alpha(&self) -> u32 {
        self.alpha >> ALPHA_FINE_BITS
    }
    /// Alpha as held, of 2^20.
    pub fn alpha_fine(&self) -> u32 {
        self.alpha
    }
    /// Whether the RP is limiting the QP (false: idle at line rate, no timers).
    pub fn is_active(&self) -> bool {
        self.active
    }
    /// The increase stages `(T, BC)`.
    pub fn stages(&self) -> (u32, u32) {
        (self.t_stage, self.bc_stage)
    }

    fn alpha_period(&self) -> Nanos {
        Nanos(us(self.p.dce_tcp_rtt.max(1)))
    }

    /// When `poll` next has work; `None` when idle.
    pub fn next_deadline(&self) -> Option<Nanos> {
        if !self.active {
            return None;
        }
        Some(match self.next_increase {
            Some(t) => t.min(self.next_alpha),
            None => self.next_alpha,
        })
    }

    /// When the next increase event (the `rpg_time_reset` timer) is due; `None` when idle.
    /// The alpha ticks between now and then change no rate: a caller that wakes only for
    /// this deadline (and polls at every event) sees the same trajectory as one that serves
    /// every tick on time, since [`DcqcnRp::poll`] serves the ticks in time order.
    pub fn next_increase(&self) -> Option<Nanos> {
        if self.active {
            self.next_increase
        } else {
            None
        }
    }

    /// A CNP for this QP arrived at `now`.
    pub fn on_cnp(&mut self, now: Nanos) -> CnpOutcome {
        self.poll(now);
        self.cnp_in_period = true;
        if !self.active {
            self.active = true;
            self.alpha = self.p.initial_alpha_value.min(ALPHA_ONE - 1) << ALPHA_FINE_BITS;
            self.next_alpha = now + self.alpha_period();
            self.cuts = 0;
            if self.p.rate_to_set_on_first_cnp != 0 {
                let r =
                    (u64::from(self.p.rate_to_set_on_first_cnp) * 1_000).clamp(self.min, self.max);
                self.rc = r;
                self.rt = r;
                self.after_cut(now);
                return CnpOutcome::Handled;
            }
        }
        if let Some(last) = self.last_cut {
            if now < last + Nanos(us(self.p.rate_reduce_monitor_period)) {
                return CnpOutcome::Ignored;
            }
        }
        // The target rate: set to the current rate at every CNP with `clamp_tgt_rate`;
        // otherwise only at the first cut, and at a cut that follows an increase event (one of
        // the byte counter, or one of the timer with `clamp_tgt_rate_after_time_inc`). The cuts
        // of one episode of congestion keep the target where the episode began, so that fast
        // recovery goes back towards it.
        let clamp = self.p.clamp_tgt_rate != 0
            || self.cuts == 0
            || match self.last_increase {
                Some(Increase::Bytes) => true,
                Some(Increase::Timer) => self.p.clamp_tgt_rate_after_time_inc != 0,
                None => false,
            };
        if clamp {
            self.rt = self.rc;
        }
        let by_alpha = (u128::from(self.rc) * u128::from(self.alpha))
            >> (self.p.rpg_gd + ALPHA_FINE_BITS).min(127);
        let fac = u64::from(100 - self.p.rpg_min_dec_fac.min(100));
        let by_fac = u128::from(self.rc) * u128::from(fac) / 100;
        let cut = by_alpha.min(by_fac) as u64;
        self.rc = self.rc.saturating_sub(cut).max(self.min);
        self.after_cut(now);
        CnpOutcome::Handled
    }

    fn after_cut(&mut self, now: Nanos) {
        self.last_cut = Some(now);
        self.cuts = self.cuts.saturating_add(1);
        self.t_stage = 0;
        self.bc_stage = 0;
        self.bytes = 0;
        self.last_increase = None;
        self.next_increase = match self.p.rpg_time_reset {
            0 => None,
            t => Some(now + Nanos(us(t))),
        };
    }

    /// `bytes` were sent at `now` (they feed the byte counter while the RP is active).
    pub fn on_tx(&mut self, now: Nanos, bytes: u64) {
        self.poll(now);
        if !self.active || self.p.rpg_byte_reset == 0 {
            return;
        }
        let step = u64::from(self.p.rpg_byte_reset) * 64;
        self.bytes = self.bytes.saturating_add(bytes);
        while self.active && self.bytes >= step {
            self.bytes -= step;
            self.bc_stage = self.bc_stage.saturating_add(1);
            self.last_increase = Some(Increase::Bytes);
            self.increase();
        }
    }

    /// Serves every tick due at or before `now`.
    pub fn poll(&mut self, now: Nanos) {
        while let Some(d) = self.next_deadline() {
            if d > now {
                break;
            }
            if self.next_alpha <= d {
                self.alpha_tick(now);
            } else {
                let t = us(self.p.rpg_time_reset.max(1));
                if self.rc == self.rt && self.p.rpg_ai_rate == 0 && self.p.rpg_hai_rate == 0 {
                    // No increase can change a rate (rt = rc, no steps): serve every due tick
                    // at once, so that a long gap with such parameters costs no loop.
                    let n = (now.as_nanos() - d.as_nanos()) / t + 1;
                    self.next_increase = Some(Nanos(d.as_nanos().saturating_add(n * t)));
                    self.t_stage = self
                        .t_stage
                        .saturating_add(n.min(u64::from(u32::MAX)) as u32);
                    continue;
                }
                self.next_increase = Some(d + Nanos(t));
                self.t_stage = self.t_stage.saturating_add(1);
                self.last_increase = Some(Increase::Timer);
                self.increase();
            }
        }
    }

    fn alpha_tick(&mut self, now: Nanos) {
        let g = self.p.dce_tcp_g.min(ALPHA_ONE);
        let period = self.alpha_period();
        if !self.cnp_in_period && self.alpha == 0 {
            // Nothing changes until a CNP: skip the idle ticks up to the next increase event
            // (or `now`) in one step, so that a long gap costs no loop.
            let until = self.next_increase.unwrap_or(now).min(now);
            let n =
                (until.as_nanos().saturating_sub(self.next_alpha.as_nanos())) / period.as_nanos();
            self.next_alpha = Nanos(self.next_alpha.as_nanos() + (n + 1) * period.as_nanos());
            return;
        }
        let decayed = (u64::from(self.alpha) * u64::from(g) / u64::from(ALPHA_ONE)) as u32;
        self.alpha = if self.cnp_in_period {
            (decayed + ((ALPHA_ONE - g) << ALPHA_FINE_BITS)).min(ALPHA_FINE_MAX)
        } else {
            decayed
        };
        self.cnp_in_period = false;
        self.next_alpha = self.next_alpha + period;
    }

    fn increase(&mut self) {
        let f = self.p.rpg_threshold;
        let t = self.t_stage;
        // With the byte counter off (`rpg_byte_reset` 0) the timer's stage alone decides, as
        // in the DCQCN variants that have no byte counter (HPCC's simulator); otherwise a
        // counter that never moves would hold the RP out of hyper increase for good.
        let bc = if self.p.rpg_byte_reset == 0 {
            t
        } else {
            self.bc_stage
        };
        if t.max(bc) <= f {
            // fast recovery
        } else if t.min(bc) > f {
            self.rt = (self.rt + u64::from(self.p.rpg_hai_rate) * 1_000).min(self.max);
        } else {
            self.rt = (self.rt + u64::from(self.p.rpg_ai_rate) * 1_000).min(self.max);
        }
        self.rc = (self.rt + self.rc).div_ceil(2).min(self.max);
        if self.rc >= self.max && self.rt >= self.max {
            self.active = false;
            self.next_increase = None;
            self.last_cut = None;
            self.cnp_in_period = false;
        }
    }
}
