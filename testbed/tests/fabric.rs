//! The fabric simulator's experiments, checked against the goals (docs/congestion.md,
//! "The fabric simulator", has the figures and the commands).
use rocemu_emulator::rnic::cc::CcAlgo;
use rocemu_testbed::fabric::sim::{headroom_need, Fabric, FabricConfig};
use rocemu_testbed::fabric::topo::Topology;
use rocemu_testbed::fabric::{FlowSpec, Report, Scenario, SimArgs};
use rocemu_wire::pfc::PfcRepr;

fn run(scenario: Scenario, cc: CcAlgo, pfc: bool, ms: u64, f: impl Fn(&mut SimArgs)) -> Report {
    let mut a = SimArgs::new(scenario, cc);
    a.duration_ns = ms * 1_000_000;
    a.fabric.pfc = pfc;
    f(&mut a);
    a.run(&mut |_, _| {}).unwrap()
}

/// mlx5's DCQCN defaults but the rate floor: with `rpg_min_rate` 1 Mb/s, eight or more
/// senders at 100 Gb/s cut each other to the floor and sit there for `rpg_time_reset`
/// (docs/congestion.md shows it); 1 Gb/s is HPCC's floor.
fn floor_1g(a: &mut SimArgs) {
    a.fabric.cc.set("rpg_min_rate", 1000).unwrap();
}

/// The incast profile (docs/congestion.md, "Incast up to 64:1"): the 1 Gb/s floor, a first CNP
/// that sets current and target rate to 20 Gb/s (`rate_to_set_on_first_cnp`), and increase steps
/// ten times mlx5's (50 and 500 Mb/s, scaled from the 40-Gb/s era defaults to 100 Gb/s). With
/// the floor alone, 64 senders recover together towards the 100-Gb/s target each episode began
/// at and refill the queue: 3,740 pauses against 15,947 without CC.
fn incast_profile(a: &mut SimArgs) {
    floor_1g(a);
    for (k, v) in [
        ("rate_to_set_on_first_cnp", 20_000),
        ("rpg_ai_rate", 50),
        ("rpg_hai_rate", 500),
    ] {
        a.fabric.cc.set(k, v).unwrap();
    }
}

/// An incast of `n` long flows into host `n` at 100 Gb/s, built by hand (to reach the fabric's
/// own records: the PFC frames, the watchdog).
fn incast_fabric(n: usize, cfg: FabricConfig) -> Fabric {
    let mut f = Fabric::new(Topology::incast(n, 100_000_000_000), cfg).unwrap();
    for src in 0..n {
        let spec = FlowSpec {
            src,
            dst: n,
            bytes: None,
            start_ns: 0,
        };
        f.add_flow(spec).unwrap();
    }
    f
}

#[test]
fn dumbbell_two_flows_dcqcn_defaults_share_fully_with_a_short_queue() {
    let r = run(
        Scenario::Dumbbell { flows: 2 },
        CcAlgo::Dcqcn,
        true,
        40,
        |_| {},
    );
    assert!(r.jain.unwrap() >= 0.99, "{}", r.text());
    assert!(r.utilization >= 0.95, "{}", r.text());
    let kmax = FabricConfig::new(1).kmax_bytes;
    assert!(r.queue_max_bytes < kmax, "{}", r.text());
    assert_eq!(r.pause_frames, 0, "{}", r.text());
    assert!(r.cnps > 0 && r.ecn_marked > 0, "{}", r.text());
}

#[test]
fn incast_dcqcn_pauses_ten_times_less_and_shares_fairly() {
    for n in [2, 8, 32, 64] {
        let none = run(
            Scenario::Incast { senders: n },
            CcAlgo::None,
            true,
            20,
            |_| {},
        );
        let dcqcn = run(
            Scenario::Incast { senders: n },
            CcAlgo::Dcqcn,
            true,
            20,
            incast_profile,
        );
        assert!(
            none.pause_frames > 0,
            "{n}:1 without CC paused nothing\n{}",
            none.text()
        );
        assert!(
            dcqcn.pause_frames * 10 <= none.pause_frames,
            "{n}:1: {} pauses with DCQCN, {} without",
            dcqcn.pause_frames,
            none.pause_frames
        );
        assert!(dcqcn.jain.unwrap() >= 0.95, "{n}:1\n{}", dcqcn.text());
        assert_eq!((none.drops, dcqcn.drops), (0, 0), "{n}:1 dropped with PFC");
        // Not bought with an idle link: the profile keeps the bottleneck busy.
        assert!(dcqcn.utilization >= 0.85, "{n}:1\n{}", dcqcn.text());
    }
}

/// The floor alone is not enough at 64:1 (the reason for the profile above): if this starts
/// passing, the profile's extra parameters are no longer needed and the docs say the wrong thing.
#[test]
fn incast_64_with_the_floor_alone_still_pauses() {
    let none = run(
        Scenario::Incast { senders: 64 },
        CcAlgo::None,
        true,
        20,
        |_| {},
    );
    let floor = run(
        Scenario::Incast { senders: 64 },
        CcAlgo::Dcqcn,
        true,
        20,
        floor_1g,
    );
    assert!(
        floor.pause_frames * 10 > none.pause_frames,
        "64:1 with the floor alone: {} pauses, {} without CC",
        floor.pause_frames,
        none.pause_frames
    );
}

#[test]
fn incast_without_pfc_or_cc_drops_and_goes_back_n() {
    let r = run(
        Scenario::Incast { senders: 8 },
        CcAlgo::None,
        false,
        10,
        |_| {},
    );
    assert!(r.drops > 0, "{}", r.text());
    assert!(r.retransmitted_pkts > 0, "{}", r.text());
    assert_eq!(r.pause_frames, 0);
}

#[test]
fn the_victim_collapses_under_pfc_alone_and_keeps_its_share_with_dcqcn() {
    // Two incast senders behind each switch into one receiver, the victim across the shared
    // link to another: max-min gives the incast 25 Gb/s a flow and the victim the rest of the
    // shared link, 50 Gb/s.
    let fair = 50.0 * 1024.0 / (1024.0 + 82.0);
    let victim = |r: &Report| r.flows.last().unwrap().gbps;
    let pfc = run(
        Scenario::Victim { senders: 2 },
        CcAlgo::None,
        true,
        20,
        |_| {},
    );
    let dcqcn = run(
        Scenario::Victim { senders: 2 },
        CcAlgo::Dcqcn,
        true,
        20,
        floor_1g,
    );
    assert!(pfc.pause_frames > 0);
    assert!(victim(&pfc) < 0.5 * fair, "PFC alone: {}", pfc.text());
    assert!(victim(&dcqcn) >= 0.8 * fair, "DCQCN: {}", dcqcn.text());
}

#[test]
fn pause_frames_are_8021qbb_and_headroom_decides_loss() {
    // 8:1 without CC: the computed headroom loses nothing, a quarter of it loses frames.
    let ok = run(
        Scenario::Incast { senders: 8 },
        CcAlgo::None,
        true,
        5,
        |_| {},
    );
    assert!(ok.pause_frames > 0 && ok.resume_frames > 0);
    assert_eq!(ok.drops, 0, "{}", ok.text());
    let need = headroom_need(100_000_000_000, 1_000);
    assert_eq!(ok.headroom, (need, need));
    let short = run(
        Scenario::Incast { senders: 8 },
        CcAlgo::None,
        true,
        5,
        |a| {
            a.fabric.headroom_bytes = Some(need / 4);
        },
    );
    assert!(short.drops > 0, "{}", short.text());

    // The frames themselves, as a switch sent them.
    let mut f = incast_fabric(4, FabricConfig::new(3));
    f.run(1_000_000, 2_000_000, 2_000_000, &mut |_, _| {});
    let frames = &f.totals.pfc_frames;
    assert!(frames
        .iter()
        .any(|b| PfcRepr::parse(b).unwrap().unwrap().quanta[3] == 0xffff));
    assert!(frames
        .iter()
        .any(|b| PfcRepr::parse(b).unwrap().unwrap().quanta[3] == 0));
    for b in frames {
        assert_eq!(b.len(), 60);
        assert_eq!(&b[0..6], &[0x01, 0x80, 0xc2, 0, 0, 1]);
        assert_eq!(&b[12..16], &[0x88, 0x08, 0x01, 0x01]);
        let p = PfcRepr::parse(b).unwrap().unwrap();
        assert_eq!(p.enable, 1 << 3, "priority 3 only");
    }
}

#[test]
fn the_watchdog_fires_within_its_detection_time() {
    // The receiver's NIC pauses its switch port without end from 1 ms (a pause storm).
    let mut cfg = FabricConfig::new(5);
    cfg.watchdog_detect_ns = 2_000_000;
    cfg.watchdog_restore_ns = 2_000_000;
    let mut f = incast_fabric(2, cfg);
    f.pause_storm(2, 1_000_000);
    f.run(4_000_000, 8_000_000, 8_000_000, &mut |_, _| {});
    let w = f.totals.watchdog.first().expect("the watchdog fired");
    assert_eq!((w.switch, w.prio), (3, 3));
    assert!(
        w.stalled_ns >= 1_000_000 && w.stalled_ns < 1_010_000,
        "{w:?}"
    );
    assert!(w.fired_ns - w.stalled_ns <= 2_000_000 + 1_000, "{w:?}");
    assert!(f.totals.drops > 0, "the stormed queue's frames are dropped");
}

#[test]
fn the_same_seed_gives_the_same_json() {
    let strip = |r: &Report| {
        let mut j = r.json();
        j.as_object_mut().unwrap().remove("events_per_second");
        j.to_string()
    };
    let go = |seed, icrc| {
        run(
            Scenario::FatTree {
                load: 0.3,
                cdf: "websearch".into(),
            },
            CcAlgo::Dcqcn,
            true,
            1,
            |a| {
                a.fabric.seed = seed;
                a.fabric.icrc = icrc;
            },
        )
    };
    let (a, b, c) = (go(7, true), go(7, true), go(8, true));
    assert_eq!(strip(&a), strip(&b));
    assert_ne!(strip(&a), strip(&c));
    // Without ICRCs (`--icrc off`, for speed) nothing the run reports changes.
    assert_eq!(strip(&a), strip(&go(7, false)));
    let done = a.flows.iter().filter(|f| f.fct_us.is_some()).count();
    assert!(
        a.flows.len() > 100 && done * 10 >= a.flows.len() * 9,
        "{}",
        a.text()
    );
}

/// PFC without CC over the fat tree: frames cross several switches and some are admitted into
/// a port's headroom; each switch accounts its own admission (a headroom flag carried over from
/// the previous switch once released bytes from the wrong counter: thousands of drops).
#[test]
fn the_fat_tree_without_cc_pauses_but_drops_nothing() {
    let r = run(
        Scenario::FatTree {
            load: 0.3,
            cdf: "websearch".into(),
        },
        CcAlgo::None,
        true,
        1,
        |_| {},
    );
    assert!(r.pause_frames > 0, "{}", r.text());
    assert_eq!(r.drops, 0, "{}", r.text());
    assert!(r.flows.iter().all(|f| f.fct_us.is_some()), "{}", r.text());
}
