//! `rocemu perf --threads N` in process: each device split into N shards by QPN, one polling
//! thread per shard. With B's QPs placed on the shard after A's, every frame is for another
//! thread's shard and must be steered there; every test then still verifies through the wire,
//! and the steering counted the frames it handed over. With B's QPs on the same shard, nothing
//! is steered.
use rocemu_emulator::inproc::Impairments;
use rocemu_emulator::rnic::cc::CcConfig;
use rocemu_emulator::rnic::Mtu;
use rocemu_tools::perf::{cq_moderation, run_bw, Opts, Test};

fn opts(test: Test, size: usize, qps: usize, threads: usize, offset: usize) -> Opts {
    Opts {
        test,
        size,
        iters: 300,
        duration: None,
        qps,
        mtu: Mtu::M1024,
        tx_depth: 32,
        cq_mod: cq_moderation(None, size, 32),
        verify: true,
        lat: false,
        imp: Impairments::none(),
        seed: 7,
        qp_timeout: 14,
        cc: CcConfig::default(),
        threads,
        b_shard_offset: offset,
    }
}

#[test]
fn frames_for_another_threads_qp_are_steered_to_it() {
    for (test, size) in [
        (Test::Write, 3000),
        (Test::Read, 3000),
        (Test::Atomic { cmp_swap: false }, 8),
        (Test::Atomic { cmp_swap: true }, 8),
    ] {
        for threads in [2, 3] {
            let r = run_bw(&opts(test, size, 6, threads, 1)).unwrap();
            assert_eq!(r.errors, 0, "{test:?} x{threads}: {:?}", r.first_error);
            assert_eq!(
                r.verified,
                Some(true),
                "{test:?} x{threads}: {}",
                r.verify_detail
            );
            assert_eq!(r.messages, 6 * 300, "{test:?} x{threads}");
            // Every request and every response crossed: at least one frame each way per
            // message.
            let steered = r.steered.expect("several threads count what they steer");
            assert!(
                steered >= 2 * r.messages,
                "{test:?} x{threads}: {steered} frames steered for {} messages",
                r.messages
            );
        }
    }
}

#[test]
fn qps_on_the_same_shard_need_no_steering() {
    for test in [Test::Write, Test::Send] {
        let r = run_bw(&opts(test, 4096, 8, 2, 0)).unwrap();
        assert_eq!(r.verified, Some(true), "{test:?}: {}", r.verify_detail);
        assert_eq!(r.messages, 8 * 300);
        assert_eq!(r.steered, Some(0), "{test:?}");
    }
    let one = run_bw(&opts(Test::Write, 4096, 8, 1, 0)).unwrap();
    assert_eq!(one.verified, Some(true));
    assert_eq!(one.steered, None, "one thread has nothing to steer");
}

#[test]
fn threads_without_a_qp_each_are_refused() {
    let e = run_bw(&opts(Test::Write, 64, 2, 3, 0)).unwrap_err();
    assert!(e.contains("at least one QP per thread"), "{e}");
    let e = run_bw(&opts(Test::Send, 64, 4, 2, 1)).unwrap_err();
    assert!(e.contains("same shard"), "{e}");
}
