//! Wire benchmarks: frame parse and build in packets per second, ICRC in bytes per second next to
//! plain crc32fast over the same bytes (the cost of masking). `cargo bench -p rocemu-wire`.
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rocemu_wire::eth::{EthernetRepr, Mac};
use rocemu_wire::frame::IpRepr;
use rocemu_wire::icrc;
use rocemu_wire::ip::Ipv4Repr;
use rocemu_wire::*;

fn write_first(payload: usize) -> (FrameRepr, Vec<u8>) {
    write_frame(Opcode::RC_RDMA_WRITE_FIRST, payload)
}

fn write_frame(op: Opcode, payload: usize) -> (FrameRepr, Vec<u8>) {
    let mut bth = BthRepr::new(op, Qpn::new(0x11), Psn::new(100));
    bth.pad = rocemu_wire::frame::pad_for(payload);
    let r = FrameRepr {
        eth: EthernetRepr {
            dst: Mac([2, 0, 0, 0, 0, 2]),
            src: Mac([2, 0, 0, 0, 0, 1]),
            vlan: None,
            ethertype: 0,
        },
        ip: IpRepr::V4(Ipv4Repr {
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            dscp: 0,
            ecn: 2,
            ident: 7,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            checksum: 0,
            header_len: 20,
            total_len: 0,
        }),
        sport: udp_sport_for_qpn(Qpn::new(0x11)),
        dport: ROCEV2_UDP_PORT,
        bth,
        ext: ExtHeaders {
            reth: Some(RethRepr {
                va: 0x7f00_0000_1000,
                rkey: RKey(0x1234),
                dma_len: 65536,
            }),
            ..Default::default()
        },
    };
    let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let mut buf = vec![0u8; r.frame_len(payload)];
    r.emit_with_payload(&mut buf, &data).unwrap();
    (r, buf)
}

fn parse(c: &mut Criterion) {
    let (_, frame) = write_first(1024);
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(1));
    g.bench_function("bth+reth", |b| {
        b.iter(|| {
            let p = parse_frame(black_box(&frame)).unwrap();
            black_box((p.bth.psn, p.ext.reth, p.payload.len()))
        })
    });
    // Conservative: every field of the parsed frame is materialised.
    g.bench_function("bth+reth/all_fields", |b| {
        b.iter(|| {
            let p = parse_frame(black_box(&frame)).unwrap();
            black_box(&p);
        })
    });
    g.bench_function("bth+reth+icrc_check/1024B", |b| {
        b.iter(|| black_box(parse_frame(black_box(&frame)).unwrap().icrc_ok()))
    });
    g.finish();
}

fn build(c: &mut Criterion) {
    let mut g = c.benchmark_group("build");
    g.throughput(Throughput::Elements(1));
    for payload in [64usize, 1024] {
        let (r, frame) = write_first(payload);
        let data = vec![0xabu8; payload];
        let mut buf = vec![0u8; frame.len()];
        g.bench_with_input(
            BenchmarkId::new("write_first+icrc", payload),
            &payload,
            |b, _| b.iter(|| black_box(r.emit_with_payload(black_box(&mut buf), &data).unwrap())),
        );
    }
    g.finish();
}

fn icrc_vs_plain(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for size in [64usize, 256, 1024, 4096] {
        // a datagram of `size` bytes: IPv4 + UDP + BTH + RETH + payload (ICRC excluded)
        let payload = size - 20 - 8 - 12 - 16;
        let (_, frame) = write_first(payload);
        let dg = &frame[14..frame.len() - 4];
        assert_eq!(
            dg.len() + rocemu_wire::frame::pad_for(payload) as usize,
            size
        );
        g.throughput(Throughput::Bytes(dg.len() as u64));
        g.bench_with_input(BenchmarkId::new("icrc", size), &size, |b, _| {
            b.iter(|| black_box(icrc::compute(black_box(dg), 20, false)))
        });
        let mut owned = frame.clone();
        let end = owned.len();
        g.bench_with_input(BenchmarkId::new("icrc_in_place", size), &size, |b, _| {
            b.iter(|| {
                black_box(icrc::compute_in_place(
                    black_box(&mut owned),
                    14,
                    20,
                    false,
                    end,
                ))
            })
        });
        let fr = frame.clone();
        let fl = fr.len();
        g.bench_with_input(
            BenchmarkId::new("plain_frame_from6", size),
            &size,
            |b, _| b.iter(|| black_box(crc32fast::hash(black_box(&fr[6..fl - 4])))),
        );
        g.bench_with_input(BenchmarkId::new("plain_crc32fast", size), &size, |b, _| {
            b.iter(|| black_box(crc32fast::hash(black_box(dg))))
        });
    }
    g.finish();
}

/// The frame of a 64-byte RDMA WRITE ONLY (138 bytes, a 124-byte datagram): what each end of a
/// 64-byte message-rate test must at least do per message besides moving the frame — the
/// receiver parses it and verifies its ICRC, the sender stamps it from the QP's template with
/// the payload and the ICRC (docs/performance.md, "Real datapaths").
fn write64(c: &mut Criterion) {
    let (r, frame) = write_frame(Opcode::RC_RDMA_WRITE_ONLY, 64);
    assert_eq!(frame.len(), 138);
    let mut g = c.benchmark_group("write64");
    g.throughput(Throughput::Elements(1));
    let mut owned = frame.clone();
    let end = owned.len();
    g.bench_function("icrc_in_place", |b| {
        b.iter(|| {
            black_box(icrc::compute_in_place(
                black_box(&mut owned),
                14,
                20,
                false,
                end,
            ))
        })
    });
    let mut rx = frame.clone();
    g.bench_function("parse+icrc_check_in_place", |b| {
        b.iter(|| {
            let (p, ok) = parse_frame_in_place(black_box(&mut rx)).unwrap();
            black_box((p.bth.psn, p.ext.reth, p.payload.len(), ok))
        })
    });
    let t = HeaderTemplate::new(&r);
    let data = vec![0xabu8; 64];
    let mut buf = vec![0u8; 2048];
    g.bench_function("template_build+icrc", |b| {
        b.iter(|| {
            black_box(
                t.emit(black_box(&mut buf), 7, &r.bth, &r.ext, 64, |d| {
                    d.copy_from_slice(&data)
                })
                .unwrap(),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, parse, build, icrc_vs_plain, write64);
criterion_main!(benches);
