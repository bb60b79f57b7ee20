//! The congestion-control algorithms of `rnic/cc/` (issue 17, step 1), driven by scripted
//! events. Expected values come from the formulas, written here (the helpers below) or derived
//! by hand in the comments, never from the code under test.
use proptest::prelude::*;
use rocemu_emulator::rnic::cc::{CnpOutcome, DcqcnParams, DcqcnRp};
use rocemu_emulator::time::Nanos;

fn us(v: u64) -> Nanos {
    Nanos::from_micros(v)
}

// ---- the formulas (alpha held in 1/2^20, shown in 1/1024) ----

/// One alpha period: `alpha·g/1024 + (1024 − g)` with a CNP in it, `alpha·g/1024` without.
fn alpha_next(a_fine: u32, g: u32, cnp: bool) -> u32 {
    let d = (a_fine as u64 * g as u64 / 1024) as u32;
    if cnp {
        (d + ((1024 - g) << 10)).min((1024 << 10) - 1)
    } else {
        d
    }
}

/// The rate after a cut: `rc − min(rc·alpha/2^gd, rc·(1 − min_dec_fac))`, not below `min`.
fn cut(rc: u64, a_fine: u32, gd: u32, min_dec_fac: u64, min: u64) -> u64 {
    let by_alpha = ((rc as u128 * a_fine as u128) >> (gd + 10)) as u64;
    let by_fac = rc * (100 - min_dec_fac) / 100;
    (rc - by_alpha.min(by_fac)).max(min)
}

fn avg_up(a: u64, b: u64) -> u64 {
    (a + b).div_ceil(2)
}

const LINE_10G: u32 = 10_000;

#[test]
fn idle_rp_runs_at_line_rate_without_timers() {
    let mut rp = DcqcnRp::new(DcqcnParams::default(), LINE_10G);
    assert_eq!(rp.rate_kbps(), 10_000_000);
    assert_eq!(rp.next_deadline(), None);
    rp.on_tx(us(5), 1 << 30);
    rp.poll(us(10_000));
    assert_eq!(rp.rate_kbps(), 10_000_000);
    assert!(!rp.is_active());
}

#[test]
fn first_cnp_cuts_by_alpha() {
    let mut rp = DcqcnRp::new(DcqcnParams::default(), LINE_10G);
    assert_eq!(rp.on_cnp(us(0)), CnpOutcome::Handled);
    // alpha = initial_alpha_value 1023; cut = min(10^7·1023/2048, 10^7·50/100)
    // = min(4_995_117.19, 5_000_000) → 4_995_117 kb/s: the rate is 5_004_883 kb/s, the target
    // the old rate.
    assert_eq!(rp.rate_kbps(), 5_004_883);
    assert_eq!(rp.target_kbps(), 10_000_000);
    assert_eq!(rp.alpha(), 1023);
    // The alpha timer runs: the first tick 1 µs later.
    assert_eq!(rp.next_deadline(), Some(us(1)));
}

#[test]
fn min_dec_fac_bounds_the_cut() {
    // With rpg_gd 1 the alpha term would cut ~all of the rate; min_dec_fac 80 % keeps 80 %.
    let p = DcqcnParams {
        rpg_gd: 1,
        rpg_min_dec_fac: 80,
        ..DcqcnParams::default()
    };
    let mut rp = DcqcnRp::new(p, LINE_10G);
    rp.on_cnp(us(0));
    // min(10^7·1023/2, 10^7·20/100 = 2_000_000) → 8_000_000.
    assert_eq!(rp.rate_kbps(), 8_000_000);
}

#[test]
fn rate_to_set_on_first_cnp_sets_both_rates() {
    let p = DcqcnParams {
        rate_to_set_on_first_cnp: 2_000,
        ..DcqcnParams::default()
    };
    let mut rp = DcqcnRp::new(p, LINE_10G);
    rp.on_cnp(us(0));
    assert_eq!((rp.rate_kbps(), rp.target_kbps()), (2_000_000, 2_000_000));
}

#[test]
fn alpha_and_rate_trajectory_of_a_cnp_script() {
    let p = DcqcnParams::default();
    let (g, gd, fac, min) = (p.dce_tcp_g, p.rpg_gd, p.rpg_min_dec_fac as u64, 1_000);
    let mut rp = DcqcnRp::new(p, LINE_10G);
    // CNPs at 0, 2.5 µs (in the monitor period of the first cut: ignored for the rate), 5 µs
    // (a cut), 6.2 µs (ignored), then none; alpha ticks every 1 µs from 1 µs.
    let cnps = [Nanos(0), Nanos(2_500), Nanos(5_000), Nanos(6_200)];
    let outcomes: Vec<_> = cnps.iter().map(|&t| rp.on_cnp(t)).collect();
    assert_eq!(
        outcomes,
        [
            CnpOutcome::Handled,
            CnpOutcome::Ignored,
            CnpOutcome::Handled,
            CnpOutcome::Ignored
        ]
    );
    // Replay the formulas: periods (k-1, k] µs with a CNP: k = 1 (t=0), 3 (2.5), 6 (5.0: the
    // tick at 5 µs is served before the CNP at 5 µs, so it falls in (5, 6]), 7 (6.2).
    let mut a = 1023 << 10;
    let mut rc = 10_000_000u64;
    rc = cut(rc, a, gd, fac, min); // at 0
    let mut want = Vec::new();
    for k in 1..=10u64 {
        a = alpha_next(a, g, matches!(k, 1 | 3 | 6 | 7));
        if k == 5 {
            rc = cut(rc, a, gd, fac, min); // the CNP at 5 µs sees alpha after the 5 µs tick
        }
        want.push((a, rc));
    }
    // Drive a fresh RP through the same script, observing after each tick.
    let mut rp = DcqcnRp::new(p, LINE_10G);
    let mut got = Vec::new();
    let mut script = cnps.iter().peekable();
    for k in 1..=10u64 {
        while let Some(&&t) = script.peek() {
            if t < us(k) || (t == us(k) && k != 5) {
                rp.on_cnp(t);
                script.next();
            } else {
                break;
            }
        }
        rp.poll(us(k));
        if k == 5 {
            rp.on_cnp(us(5));
            script.next();
        }
        got.push((rp.alpha_fine(), rp.rate_kbps()));
    }
    assert_eq!(got, want);
    // By hand for the first tick: 1023·1024·1019/1024 + 5·1024 = 1_042_437 + 5_120 = 1_047_557.
    assert_eq!(want[0].0, 1_047_557);
}

#[test]
fn without_cnps_alpha_halves_in_about_141_us() {
    let mut rp = DcqcnRp::new(DcqcnParams::default(), LINE_10G);
    rp.on_cnp(us(0));
    rp.poll(us(1)); // the period of the CNP: alpha stays at its top (1023)
    assert_eq!(rp.alpha(), 1023);
    let start = rp.alpha_fine();
    let mut periods = 0;
    let mut a = start;
    while rp.alpha_fine() > start / 2 {
        periods += 1;
        rp.poll(us(1 + periods));
        a = alpha_next(a, 1019, false);
        assert_eq!(rp.alpha_fine(), a, "period {periods}");
        assert!(periods < 1_000);
    }
    // ln 2 / ln(1024/1019) = 141.6 periods of dce_tcp_rtt = 1 µs.
    assert!((141..=142).contains(&periods), "{periods} periods");
}

#[test]
fn one_cut_per_monitor_period_in_a_cnp_burst() {
    let p = DcqcnParams::default();
    let mut rp = DcqcnRp::new(p, LINE_10G);
    // A CNP every 100 ns for 20 µs: cuts at 0, 4, 8, 12, 16 µs only.
    let mut handled = Vec::new();
    for i in 0..200u64 {
        if rp.on_cnp(Nanos(i * 100)) == CnpOutcome::Handled {
            handled.push(i * 100);
        }
    }
    assert_eq!(handled, [0, 4_000, 8_000, 12_000, 16_000]);
    // The rate: five cuts, each with alpha after the ticks before it (every period had CNPs).
    let mut a = 1023 << 10;
    let mut rc = 10_000_000u64;
    for k in 0..5u32 {
        if k > 0 {
            for _ in 0..4 {
                a = alpha_next(a, p.dce_tcp_g, true);
            }
        }
        rc = cut(rc, a, p.rpg_gd, p.rpg_min_dec_fac as u64, 1_000);
    }
    assert_eq!(rp.rate_kbps(), rc);
}

#[test]
fn the_cuts_of_one_episode_keep_its_target() {
    // The defaults (clamp_tgt_rate 0, clamp_tgt_rate_after_time_inc 1): the first cut sets the
    // target, later cuts with no increase event between leave it; a cut after a timer
    // increase sets it again, and so does one after a byte-counter increase.
    let p = DcqcnParams::default();
    let mut rp = DcqcnRp::new(p, LINE_10G);
    rp.on_cnp(us(0));
    let first = rp.rate_kbps();
    assert_eq!(rp.target_kbps(), 10_000_000);
    rp.on_cnp(us(4));
    rp.on_cnp(us(8));
    assert!(rp.rate_kbps() < first);
    assert_eq!(rp.target_kbps(), 10_000_000, "the episode keeps its target");
    // The timer's first increase (fast recovery) at 8 + 300 µs, then a CNP: the target follows.
    rp.poll(us(308));
    assert_eq!(rp.stages(), (1, 0));
    rp.on_cnp(us(309));
    let before = rp.target_kbps();
    assert!(before < 10_000_000);
    // With clamp_tgt_rate_after_time_inc 0, a timer increase does not move it.
    let q = DcqcnParams {
        clamp_tgt_rate_after_time_inc: 0,
        ..p
    };
    let mut r2 = DcqcnRp::new(q, LINE_10G);
    r2.on_cnp(us(0));
    r2.on_cnp(us(4));
    r2.poll(us(304));
    r2.on_cnp(us(305));
    assert_eq!(r2.target_kbps(), 10_000_000);
    // A byte-counter increase does (rpg_byte_reset · 64 bytes sent).
    r2.on_tx(us(306), u64::from(q.rpg_byte_reset) * 64);
    assert_eq!(r2.stages().1, 1);
    let rc = r2.rate_kbps();
    r2.on_cnp(us(320));
    assert_eq!(r2.target_kbps(), rc);
}

#[test]
fn recovery_fast_then_additive_then_hyper() {
    // clamp_tgt_rate: every CNP sets the target to the current rate.
    let p = DcqcnParams {
        clamp_tgt_rate: 1,
        ..DcqcnParams::default()
    };
    let mut rp = DcqcnRp::new(p, LINE_10G);
    // Two cuts so that the target is below line rate: at 0 and at 4 µs.
    rp.on_cnp(us(0));
    rp.on_cnp(us(4));
    let mut a = 1023 << 10;
    let mut rc = cut(10_000_000, a, p.rpg_gd, 50, 1_000);
    for k in 1..=4 {
        a = alpha_next(a, p.dce_tcp_g, k == 1);
    }
    let mut rt = rc;
    rc = cut(rc, a, p.rpg_gd, 50, 1_000);
    assert_eq!((rp.rate_kbps(), rp.target_kbps()), (rc, rt));
    // Timer events every 300 µs from the last cut (4 µs). T=1: max(T,BC)=1 ≤ F=1: fast recovery.
    rp.poll(us(304));
    rc = avg_up(rt, rc);
    assert_eq!(
        (rp.stages(), rp.rate_kbps(), rp.target_kbps()),
        ((1, 0), rc, rt)
    );
    // T=2: max 2 > F, min 0 ≤ F: additive, rt + 5 Mb/s.
    rp.poll(us(604));
    rt += 5_000;
    rc = avg_up(rt, rc);
    assert_eq!(
        (rp.stages(), rp.rate_kbps(), rp.target_kbps()),
        ((2, 0), rc, rt)
    );
    // Bytes: 32767·64 = 2_097_088 bytes make BC=1: min(2,1)=1 ≤ F: additive again.
    rp.on_tx(us(700), 2_097_087);
    assert_eq!(rp.stages(), (2, 0));
    rp.on_tx(us(700), 1);
    rt += 5_000;
    rc = avg_up(rt, rc);
    assert_eq!(
        (rp.stages(), rp.rate_kbps(), rp.target_kbps()),
        ((2, 1), rc, rt)
    );
    // BC=2: min(2,2)=2 > F: hyper increase, rt + 50 Mb/s.
    rp.on_tx(us(701), 2_097_088);
    rt += 50_000;
    rc = avg_up(rt, rc);
    assert_eq!(
        (rp.stages(), rp.rate_kbps(), rp.target_kbps()),
        ((2, 2), rc, rt)
    );
    // A cut resets the stages.
    rp.on_cnp(us(702));
    assert_eq!(rp.stages(), (0, 0));
}

#[test]
fn full_recovery_goes_idle() {
    let mut rp = DcqcnRp::new(DcqcnParams::default(), 100);
    rp.on_cnp(us(0));
    assert!(rp.rate_kbps() < 100_000);
    // The target is line rate; every 300 µs the rate halves its distance to it (rounded up):
    // from ~50_000 kb/s short, 17 steps at most.
    rp.poll(us(300 * 20));
    assert_eq!(rp.rate_kbps(), 100_000);
    assert!(!rp.is_active());
    assert_eq!(rp.next_deadline(), None);
}

#[test]
fn a_long_gap_with_no_increase_steps_is_served_at_once() {
    // rpg_ai_rate = rpg_hai_rate = 0 and rt = rc: increases change nothing, and an hour of
    // 1 µs increase ticks (3.6·10^9) is counted, not looped (alpha has decayed to 0 meanwhile).
    let p = DcqcnParams {
        rpg_ai_rate: 0,
        rpg_hai_rate: 0,
        rpg_time_reset: 1,
        ..DcqcnParams::default()
    };
    let mut rp = DcqcnRp::new(p, LINE_10G);
    rp.on_cnp(us(0));
    rp.on_cnp(us(4)); // a second cut: rt = rc
    rp.poll(us(100)); // fast recovery leaves rc = rt; ticks at 5..=100 µs
    assert_eq!(rp.rate_kbps(), rp.target_kbps());
    assert_eq!(rp.stages().0, 96);
    let hour = 3_600_000_000u64; // µs
    rp.poll(us(hour));
    assert_eq!(rp.stages().0 as u64, (hour - 4).min(u32::MAX as u64));
    assert_eq!(rp.alpha(), 0);
    assert!(rp.next_deadline().unwrap() > us(hour));
}

#[derive(Debug, Clone)]
enum Ev {
    Cnp(u64),
    Tx(u64, u64),
    Poll(u64),
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0u64..20_000).prop_map(Ev::Cnp),
        (0u64..20_000, 0u64..10_000_000).prop_map(|(d, b)| Ev::Tx(d, b)),
        (0u64..2_000_000).prop_map(Ev::Poll),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn rate_stays_between_min_and_line(
        line in 1u32..400_000,
        min_rate in 0u32..200,
        gd in 0u32..16,
        fac in 0u32..=100,
        ai in 0u32..1_000,
        hai in 0u32..10_000,
        time_reset in 0u32..1_000,
        byte_reset in 0u32..100_000,
        threshold in 0u32..6,
        first in 0u32..500_000,
        clamp in 0u32..2,
        events in proptest::collection::vec(ev(), 1..200),
    ) {
        let p = DcqcnParams {
            rpg_min_rate: min_rate,
            rpg_gd: gd,
            rpg_min_dec_fac: fac,
            rpg_ai_rate: ai,
            rpg_hai_rate: hai,
            rpg_time_reset: time_reset,
            rpg_byte_reset: byte_reset,
            rpg_threshold: threshold,
            rate_to_set_on_first_cnp: first,
            clamp_tgt_rate: clamp,
            ..DcqcnParams::default()
        };
        let mut rp = DcqcnRp::new(p, line);
        let (lo, hi) = ((min_rate.min(line)) as u64 * 1_000, line as u64 * 1_000);
        let mut now = 0u64;
        for e in events {
            match e {
                Ev::Cnp(d) => { now += d; rp.on_cnp(Nanos(now)); }
                Ev::Tx(d, b) => { now += d; rp.on_tx(Nanos(now), b); }
                Ev::Poll(d) => { now += d; rp.poll(Nanos(now)); }
            }
            prop_assert!(rp.rate_kbps() >= lo && rp.rate_kbps() <= hi, "rate {}", rp.rate_kbps());
            prop_assert!(rp.rate_kbps() <= rp.target_kbps() && rp.target_kbps() <= hi);
            prop_assert!(rp.alpha() <= 1023);
            if let Some(d) = rp.next_deadline() {
                prop_assert!(d > Nanos(now));
            }
        }
    }
}

// ---- the notification point ----

mod np {
    use super::us;
    use rocemu_emulator::rnic::cc::{build_cnp, CnpFields, CnpPacer, DcqcnParams};
    use rocemu_emulator::time::Nanos;
    use rocemu_wire::capture::CaptureReader;
    use rocemu_wire::eth::Mac;
    use rocemu_wire::{parse_frame, Opcode, Qpn};
    use std::path::PathBuf;

    #[test]
    fn one_cnp_per_qp_per_min_time_between_cnps() {
        let p = DcqcnParams::default();
        let mut pacer = CnpPacer::new(64, p.min_time_between_cnps);
        // Three QPs (distinct entries of the 64), a CE-marked packet every 100 ns in turn for
        // 20 µs: each QP gets a CNP at its first mark and then at the first mark ≥ 4 µs later.
        let qps = [Qpn::new(0x11), Qpn::new(0x12), Qpn::new(0x118)];
        let mut sent: Vec<Vec<u64>> = vec![Vec::new(); 3];
        for i in 0..600u64 {
            let t = i / 3 * 100; // the three QPs' marks at the same instant, every 100 ns
            let q = (i % 3) as usize;
            if pacer.on_ce(qps[q], Nanos(t)) {
                sent[q].push(t);
            }
        }
        // QP q's marks are at i ≡ q (mod 3), t = ⌊i/3⌋·100 ns. Expected: its first mark, then
        // each first mark ≥ 4000 ns after the last CNP: 0, 4, 8, 12, 16 µs.
        for (q, got) in sent.iter().enumerate() {
            let marks: Vec<u64> = (0..600u64)
                .filter(|i| i % 3 == q as u64)
                .map(|i| i / 3 * 100)
                .collect();
            let mut want = vec![marks[0]];
            for &m in &marks {
                if m >= want.last().unwrap() + 4_000 {
                    want.push(m);
                }
            }
            assert_eq!(got, &want, "QP {q}");
            assert_eq!(got, &[0, 4_000, 8_000, 12_000, 16_000], "QP {q}");
        }
    }

    #[test]
    fn a_shared_entry_never_withholds_a_cnp() {
        // One entry for two QPs: they evict each other, and each gets a CNP on every mark.
        let mut pacer = CnpPacer::new(1, 4);
        assert_eq!(pacer.entries(), 1);
        let (a, b) = (Qpn::new(5), Qpn::new(6));
        assert!(pacer.on_ce(a, us(0)));
        assert!(!pacer.on_ce(a, us(1)));
        assert!(pacer.on_ce(b, us(1)));
        assert!(pacer.on_ce(a, us(2)));
        // Zero entries are one entry; the clock going back does not open the gate.
        let mut p0 = CnpPacer::new(0, 4);
        assert!(p0.on_ce(a, us(10)));
        assert!(!p0.on_ce(a, us(9)));
        assert!(p0.on_ce(a, us(14)));
    }

    fn capture() -> Vec<u8> {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wire/tests/data/cx4lx_cnp.pcap");
        let mut r = CaptureReader::open(path).unwrap();
        r.next_frame().unwrap().unwrap().data
    }

    fn cx4lx_fields() -> CnpFields {
        // The capture's fields (wire/tests/data/PROVENANCE.md): e4:1d:2d:ab:2b:c2 ←
        // 7c:fe:90:64:3b:32, 10.0.17.1 → 10.0.18.1, TOS 0xc2, ident 0x718c, TTL 64, UDP source
        // port 0, DQPN 0x118.
        CnpFields {
            src_mac: Mac([0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32]),
            dst_mac: Mac([0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2]),
            src_ip: "10.0.17.1".parse().unwrap(),
            dst_ip: "10.0.18.1".parse().unwrap(),
            dqpn: Qpn::new(0x118),
            pkey: rocemu_wire::PKey::DEFAULT,
            dscp: DcqcnParams::default().cnp_dscp,
            ecn: 2,
            vlan: None,
            prio: DcqcnParams::default().cnp_802p_prio,
            ttl: 64,
            ip_ident: 0x718c,
            udp_sport: 0,
            flow_label: 0,
        }
    }

    #[test]
    fn cnp_is_bit_exact_with_the_connectx4_lx_capture() {
        let want = capture();
        assert_eq!(want.len(), 74);
        let mut buf = [0u8; 128];
        let n = build_cnp(&mut buf, &cx4lx_fields()).unwrap();
        assert_eq!(&buf[..n], &want[..], "every byte, ICRC 82fd002a included");
        assert_eq!(&buf[70..74], &[0x82, 0xfd, 0x00, 0x2a]);
    }

    #[test]
    fn tagged_cnp_carries_the_802_1p_priority() {
        let mut f = cx4lx_fields();
        f.vlan = Some(100);
        let mut buf = [0u8; 128];
        let n = build_cnp(&mut buf, &f).unwrap();
        assert_eq!(n, 78);
        let p = parse_frame(&buf[..n]).unwrap();
        let tag = p.eth.vlan.unwrap();
        assert_eq!((tag.pcp, tag.vid), (6, 100));
        assert_eq!(p.opcode(), Opcode::CNP);
        assert!(p.bth.becn && p.icrc_ok());
        assert_eq!(
            (p.bth.dqpn, p.bth.psn.value(), p.ip.dscp()),
            (Qpn::new(0x118), 0, 48)
        );
        // A buffer too small is an error, not a panic.
        assert!(build_cnp(&mut buf[..70], &f).is_err());
    }
}

// ---- the rate limiter ----

mod limiter {
    use proptest::prelude::*;
    use rocemu_emulator::rnic::cc::RateLimiter;
    use rocemu_emulator::time::Nanos;

    /// A greedy sender: each packet leaves as early as the limiter allows, from `start` on.
    fn greedy(l: &mut RateLimiter, start: u64, sizes: &[u64]) -> Vec<u64> {
        let mut now = Nanos(start);
        sizes
            .iter()
            .map(|&b| {
                now = l.earliest(now, b).unwrap();
                assert!(l.may_send(now, b));
                l.on_send(now, b);
                now.as_nanos()
            })
            .collect()
    }

    #[test]
    fn paces_at_the_rate() {
        // 1000 bytes at 1 Gb/s = 8000 bits / 10^9 b/s = 8 µs apart, no burst.
        let mut l = RateLimiter::new(1_000_000, 0);
        let d = greedy(&mut l, 0, &[1000; 10]);
        assert_eq!(d, (0..10).map(|k| k * 8_000).collect::<Vec<_>>());
        // Not before its time: 1 ns early is refused.
        assert!(!l.may_send(Nanos(79_999), 1000));
        assert!(l.may_send(Nanos(80_000), 1000));
    }

    #[test]
    fn fractional_nanoseconds_do_not_drift() {
        // 64 bytes at 100 Gb/s = 512 bits / 10^11 b/s = 5.12 ns: the k-th at ⌊5.12·k⌋ ns.
        let mut l = RateLimiter::new(100_000_000, 0);
        let d = greedy(&mut l, 0, &[64; 1000]);
        let want: Vec<u64> = (0..1000u64).map(|k| k * 512 / 100).collect();
        assert_eq!(d, want);
    }

    #[test]
    fn burst_then_rate() {
        // Burst 4000 bytes at 1 Gb/s: four 1000-byte packets at once, then one per 8 µs.
        let mut l = RateLimiter::new(1_000_000, 4000);
        let d = greedy(&mut l, 0, &[1000; 7]);
        assert_eq!(d, [0, 0, 0, 0, 8_000, 16_000, 24_000]);
        // Idle refills the bucket, not beyond the burst.
        let d = greedy(&mut l, 1_000_000, &[1000; 5]);
        assert_eq!(d, [1_000_000, 1_000_000, 1_000_000, 1_000_000, 1_008_000]);
        // A packet larger than the burst goes alone once the bucket is full.
        let mut l = RateLimiter::new(1_000_000, 100);
        assert_eq!(greedy(&mut l, 0, &[1000, 1000]), [0, 8_000]);
    }

    #[test]
    fn rate_change_and_zero_rate() {
        let mut l = RateLimiter::new(1_000_000, 0);
        l.on_send(Nanos(0), 1000); // next at 8 µs at 1 Gb/s
        l.set_rate(2_000_000); // what is sent from now on costs half: 1000 bytes = 4 µs
        assert_eq!(greedy(&mut l, 0, &[1000, 1000]), [8_000, 12_000]);
        l.set_rate(0);
        assert_eq!(l.earliest(Nanos(50_000), 64), None);
        assert!(!l.may_send(Nanos(u64::MAX), 64));
    }

    proptest! {
        #[test]
        fn bytes_in_any_window_within_burst_plus_rate(
            rate in 1u64..200_000_000,
            burst in 0u64..20_000,
            sizes in proptest::collection::vec(1u64..9_000, 1..100),
        ) {
            let mut l = RateLimiter::new(rate, burst);
            let d = greedy(&mut l, 0, &sizes);
            let cap = burst.max(*sizes.iter().max().unwrap()) as u128;
            for i in 0..d.len() {
                for j in i..d.len() {
                    let bytes: u128 = sizes[i..=j].iter().map(|&b| b as u128).sum();
                    // In bytes·8·10^6 (= ns·kb/s): the burst (or the largest packet) plus the
                    // window at the rate, plus 1 ns of the departures' rounding down.
                    let allowed = cap * 8_000_000 + ((d[j] - d[i]) as u128 + 1) * rate as u128;
                    prop_assert!(bytes * 8_000_000 <= allowed,
                        "{bytes} bytes in [{}, {}]", d[i], d[j]);
                }
            }
        }
    }
}

// ---- TIMELY ----

mod timely {
    use proptest::prelude::*;
    use rocemu_emulator::rnic::cc::{TimelyParams, TimelyRp, TimelyRule};

    const LINE: u32 = 10_000; // Mb/s

    #[test]
    fn trace_by_hand() {
        let mut t = TimelyRp::new(TimelyParams::default(), LINE);
        // 1) 600 µs > Thigh: rate·(1 − 0.8·(1 − 500/600)) = 10^7 − 10^7·0.8/6 = 10^7 − 1_333_333.
        assert_eq!(t.on_rtt(600_000), TimelyRule::AboveThigh);
        assert_eq!(t.rate_kbps(), 8_666_667);
        // 2) 100 µs: diff −500 µs, EWMA 0.875·(−500) = −437.5 µs, gradient −437.5/20 < 0: +δ.
        assert_eq!(t.on_rtt(100_000), TimelyRule::Increase { n: 1 });
        assert_eq!(t.rtt_diff_milli_ns(), -437_500_000);
        assert_eq!(t.gradient_milli(), -21_875);
        assert_eq!(t.rate_kbps(), 8_676_667);
        // 3) 120 µs: diff +20 µs, EWMA 0.125·(−437.5) + 0.875·20 = −37.1875 µs: +δ.
        assert_eq!(t.on_rtt(120_000), TimelyRule::Increase { n: 1 });
        assert_eq!(t.rtt_diff_milli_ns(), -37_187_500);
        assert_eq!(t.rate_kbps(), 8_686_667);
        // 4) 30 µs < Tlow: +δ whatever the gradient.
        assert_eq!(t.on_rtt(30_000), TimelyRule::BelowTlow);
        assert_eq!(t.rate_kbps(), 8_696_667);
    }

    #[test]
    fn rising_rtt_cuts_by_beta_times_gradient() {
        let mut t = TimelyRp::new(TimelyParams::default(), LINE);
        t.on_rtt(100_000); // first sample: gradient 0, +δ at line rate stays at line rate
        assert_eq!(t.rate_kbps(), 10_000_000);
        // 110 µs: EWMA 0.875·10 µs = 8.75 µs, gradient 8.75/20 = 0.4375 → 437 (1/1000, floored);
        // cut 10^7·0.8·0.437 = 3_496_000.
        assert_eq!(t.on_rtt(110_000), TimelyRule::Decrease);
        assert_eq!(t.gradient_milli(), 437);
        assert_eq!(t.rate_kbps(), 6_504_000);
    }

    #[test]
    fn a_zero_gradient_increases() {
        // With min_rtt 1 s every gradient truncates to 0 (1/1000): the rule is +δ, not a cut of 0.
        let p = TimelyParams {
            min_rtt_us: 1_000_000,
            ..TimelyParams::default()
        };
        let mut t = TimelyRp::new(p, LINE);
        t.on_rtt(600_000);
        assert_eq!(t.rate_kbps(), 8_666_667);
        assert_eq!(t.on_rtt(300_000), TimelyRule::Increase { n: 1 });
        assert_eq!(t.gradient_milli(), 0);
        assert_eq!(t.rate_kbps(), 8_676_667);
    }

    #[test]
    fn hyper_additive_after_five_negative_gradients() {
        let mut t = TimelyRp::new(TimelyParams::default(), LINE);
        t.on_rtt(600_000); // below line rate first
        let r0 = t.rate_kbps();
        // Falling RTTs between Tlow and Thigh: every gradient negative.
        let rules: Vec<_> = (0..8u64).map(|k| t.on_rtt(400_000 - k * 10_000)).collect();
        let ns: Vec<u32> = rules
            .iter()
            .map(|r| match r {
                TimelyRule::Increase { n } => *n,
                other => panic!("{other:?}"),
            })
            .collect();
        // The count: 1 at 400 µs (diff −200 µs), …, 5 at the fifth sample: N = 5 from there.
        assert_eq!(ns, [1, 1, 1, 1, 5, 5, 5, 5]);
        let steps: u64 = ns.iter().map(|&n| n as u64).sum();
        assert_eq!(t.rate_kbps(), r0 + steps * 10_000);
    }

    /// The formula, in the units of the module doc, for the proptest's trace comparison.
    fn model(p: &TimelyParams, line: u64, rtts: &[u64]) -> Vec<u64> {
        let (mut rate, mut prev, mut diff, mut neg) = (line, None::<i64>, 0i64, 0u32);
        let (a, b) = (p.alpha_milli as i64, p.beta_milli as u128);
        let mut out = Vec::new();
        for &r in rtts {
            let nd = prev.map_or(0, |q| r as i64 - q);
            prev = Some(r as i64);
            diff = ((1000 - a) * diff + a * nd * 1000) / 1000;
            let g = diff / (p.min_rtt_us as i64 * 1000);
            neg = if g < 0 { neg + 1 } else { 0 };
            let d = p.delta_mbps as u64 * 1000;
            rate = if r < p.t_low_us as u64 * 1000 {
                rate + d
            } else if r > p.t_high_us as u64 * 1000 {
                let th = p.t_high_us as u128 * 1000;
                rate.saturating_sub(
                    (rate as u128 * b * (r as u128 - th) / (r as u128 * 1000)) as u64,
                )
            } else if g <= 0 {
                rate + d * if neg >= p.hai_after {
                    p.hai_n as u64
                } else {
                    1
                }
            } else {
                rate.saturating_sub((rate as u128 * b * g as u128 / 1_000_000) as u64)
            };
            rate = rate.clamp(p.min_rate_mbps as u64 * 1000, line);
            out.push(rate);
        }
        out
    }

    proptest! {
        #[test]
        fn rate_follows_the_formula_within_bounds(rtts in proptest::collection::vec(0u64..2_000_000, 1..300)) {
            let p = TimelyParams::default();
            let mut t = TimelyRp::new(p, LINE);
            let got: Vec<u64> = rtts.iter().map(|&r| { t.on_rtt(r); t.rate_kbps() }).collect();
            for &r in &got {
                prop_assert!((1_000..=10_000_000).contains(&r));
            }
            prop_assert_eq!(got, model(&p, 10_000_000, &rtts));
        }
    }
}
