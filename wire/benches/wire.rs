//! Wire benchmarks: frame parse and build in packets per second, ICRC in bytes per second next to
//! plain crc32fast over the same bytes (the cost of masking), and what an incremental ICRC is
//! worth (`icrc_floor`). `cargo bench -p rocemu-wire`.
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
            reth: op.info().has(opcode::hdr::RETH).then_some(RethRepr {
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
    // The same build without the ICRC: with `icrc_in_place` (the CRC of a frame written long
    // before), what the CRC of a frame just written costs beyond its own work (its 16-byte loads
    // of bytes stored piecewise a moment before wait for those stores: docs/performance.md).
    let t0 = HeaderTemplate::new(&r).without_icrc();
    let mut buf0 = vec![0u8; 2048];
    g.bench_function("template_build_no_icrc", |b| {
        b.iter(|| {
            black_box(
                t0.emit(black_box(&mut buf0), 7, &r.bth, &r.ext, 64, |d| {
                    d.copy_from_slice(&data)
                })
                .unwrap(),
            )
        })
    });
    g.finish();
}

/// A 4 KiB RDMA WRITE MIDDLE frame (a 64 KiB WRITE's usual packet at MTU 4096), its payload
/// taken in turn from the 16 pages of a 64 KiB region (as `rocemu perf write -s 65536`): built
/// with the payload copied in through `CopyIn` (hashed as it is copied where the CPU has the wide
/// kernel) and written directly (copied, then hashed with the frame), and the receive path's
/// parse and check (docs/performance.md, "Wire").
fn write4k(c: &mut Criterion) {
    let (r, frame) = write_frame(Opcode::RC_RDMA_WRITE_MIDDLE, 4096);
    let mut g = c.benchmark_group("write4k");
    g.throughput(Throughput::Bytes(4096));
    let t = HeaderTemplate::new(&r);
    let region: Vec<u8> = (0..65536u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut buf = vec![0u8; 4200];
    let mut page = 0;
    g.bench_function("build_copy_in", |b| {
        b.iter(|| {
            page = (page + 4096) % region.len();
            let src = &region[page..page + 4096];
            black_box(
                t.emit(black_box(&mut buf), 7, &r.bth, &r.ext, 4096, |d| {
                    icrc::CopyIn::copy_in(d, 0, src)
                })
                .unwrap(),
            )
        })
    });
    g.bench_function("build_written", |b| {
        b.iter(|| {
            page = (page + 4096) % region.len();
            let src = &region[page..page + 4096];
            black_box(
                t.emit(black_box(&mut buf), 7, &r.bth, &r.ext, 4096, |d| {
                    d.copy_from_slice(src)
                })
                .unwrap(),
            )
        })
    });
    let mut rx = frame.clone();
    g.bench_function("parse+icrc_check_in_place", |b| {
        b.iter(|| {
            let (p, ok) = parse_frame_in_place(black_box(&mut rx)).unwrap();
            black_box((p.bth.psn, p.payload.len(), ok))
        })
    });
    g.bench_function("plain_crc32fast", |b| {
        b.iter(|| black_box(crc32fast::hash(black_box(&frame[6..]))))
    });
    g.finish();
}

/// A prototype of the incremental ICRC for an untagged IPv4 frame, kept in the bench because it
/// measured no faster than the plain one (docs/performance.md, "Incremental ICRC"): the masked
/// 48-byte head is compared with the flow's (its variant bytes left out), the CRC state after it
/// is the precomputed state of the invariant bytes plus a table value per variant byte (CRC-32 is
/// affine: crc(a ^ b) = crc(a) ^ crc(b) ^ crc(0) for equal lengths), and the rest is hashed from
/// that state.
struct HeadProto {
    keep: [[u8; 16]; 3],
    expect: [[u8; 16]; 3],
    base: u32,
    tables: Box<[[u32; 256]; 12]>,
}

/// Pseudo-packet offsets of the masked head's variant bytes (IPv4): total length,
/// identification, UDP length, BTH opcode and byte 1, BTH byte 8 and the PSN.
const V4_VARIANT: [usize; 12] = [10, 11, 12, 13, 32, 33, 36, 37, 44, 45, 46, 47];

impl HeadProto {
    fn new(frame: &[u8]) -> HeadProto {
        let mut head = [0u8; 48];
        head[..8].fill(0xff);
        head[8..].copy_from_slice(&frame[14..54]);
        for (at, n) in [(9, 1), (16, 1), (18, 2), (34, 2), (40, 1)] {
            head[at..at + n].fill(0xff);
        }
        let mut keep = [0xffu8; 48];
        for &p in &V4_VARIANT {
            keep[p] = 0;
            head[p] = 0;
        }
        let zero = crc32fast::hash(&[0u8; 48]);
        let mut tables = Box::new([[0u32; 256]; 12]);
        for (t, &p) in tables.iter_mut().zip(&V4_VARIANT) {
            for (v, e) in t.iter_mut().enumerate() {
                let mut z = [0u8; 48];
                z[p] = v as u8;
                *e = crc32fast::hash(&z) ^ zero;
            }
        }
        let chunks = |b: &[u8; 48]| {
            let mut c = [[0u8; 16]; 3];
            for (i, x) in c.iter_mut().enumerate() {
                x.copy_from_slice(&b[i * 16..i * 16 + 16]);
            }
            c
        };
        HeadProto {
            keep: chunks(&keep),
            expect: chunks(&head),
            base: crc32fast::hash(&head),
            tables,
        }
    }

    #[inline]
    fn icrc(&self, frame: &[u8]) -> Option<u32> {
        const MASK: [[u8; 16]; 3] = {
            let mut m = [[0u8; 16]; 3];
            let mut i = 0;
            while i < 8 {
                m[0][i] = 0xff;
                i += 1;
            }
            m[0][9] = 0xff;
            m[1][0] = 0xff;
            m[1][2] = 0xff;
            m[1][3] = 0xff;
            m[2][2] = 0xff;
            m[2][3] = 0xff;
            m[2][8] = 0xff;
            m
        };
        // Fixed-size copies so that the compare is three vector ORs, ANDs and compares.
        let head: &[u8; 48] = frame.get(6..54)?.try_into().ok()?;
        let mut diff = 0u8;
        for i in 0..3 {
            for k in 0..16 {
                let x = head[i * 16 + k] | MASK[i][k];
                diff |= (x & self.keep[i][k]) ^ self.expect[i][k];
            }
        }
        if diff != 0 {
            return None;
        }
        let mut s = self.base;
        for (t, &p) in self.tables.iter().zip(&V4_VARIANT) {
            s ^= t[head[p] as usize];
        }
        let mut h = crc32fast::Hasher::new_with_initial(s);
        h.update(frame.get(54..frame.len().checked_sub(4)?)?);
        Some(h.finalize())
    }
}

/// What an incremental ICRC is worth (issue 19, item 3; docs/performance.md, "Incremental ICRC"),
/// for the 138-byte frame of a 64-byte WRITE ONLY and a 4 KiB WRITE FIRST frame: today's in-place
/// ICRC (`plain_in_place`), the bench-only prototype above (`prototype_incremental`), and the
/// floors of any computation that starts from a state after the masked head: hashing only the
/// bytes after it from a cloned hasher (`floor_rest_only`; no way to give a clone a start state),
/// the same with four more bytes (`floor_rest_plus4`: a start state forged into the last four
/// head bytes), and with a hasher made from the state (`floor_rest_new_with_initial`, which runs
/// crc32fast's CPU feature detection).
fn icrc_floor(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc_floor");
    g.throughput(Throughput::Elements(1));
    for (name, (_, frame)) in [
        ("138B", write_frame(Opcode::RC_RDMA_WRITE_ONLY, 64)),
        ("4KiB", write_first(4096)),
    ] {
        let mut owned = frame.clone();
        let end = owned.len();
        g.bench_function(BenchmarkId::new("plain_in_place", name), |b| {
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
        let proto = crc32fast::Hasher::new();
        // the masked head is pseudo-packet bytes 0..48: frame bytes 6..54
        let rest = &frame[54..end - 4];
        g.bench_function(BenchmarkId::new("floor_rest_only", name), |b| {
            b.iter(|| {
                let mut h = proto.clone();
                h.update(black_box(rest));
                black_box(h.finalize())
            })
        });
        let rest4 = &frame[50..end - 4];
        g.bench_function(BenchmarkId::new("floor_rest_plus4", name), |b| {
            b.iter(|| {
                let mut h = proto.clone();
                h.update(black_box(rest4));
                black_box(h.finalize())
            })
        });
        let proto_head = HeadProto::new(&frame);
        assert_eq!(
            proto_head.icrc(&frame),
            Some(icrc::compute_in_place(
                &mut frame.clone(),
                14,
                20,
                false,
                end
            ))
        );
        g.bench_function(BenchmarkId::new("prototype_incremental", name), |b| {
            b.iter(|| black_box(proto_head.icrc(black_box(&frame))))
        });
        g.bench_function(BenchmarkId::new("floor_rest_new_with_initial", name), |b| {
            b.iter(|| {
                let mut h = crc32fast::Hasher::new_with_initial(black_box(0x1234_5678));
                h.update(black_box(rest));
                black_box(h.finalize())
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    parse,
    build,
    icrc_vs_plain,
    write64,
    write4k,
    icrc_floor
);
criterion_main!(benches);
