//! The contract's copy-and-CRC limit (`rocemu perf`'s `limit_gbps`: per MTU chunk a copy into a
//! frame, two CRC passes, a copy out) with its buffers one MTU long, as the contract measures it
//! (they stay in L1), and walking a 64 KiB and a 2 MiB region, as a 64 KiB WRITE's payload
//! walks its message and a run over many QPs walks its regions. The ratio between them is what
//! the L1 limit leaves out of `ratio_to_limit` at 64 KiB. `cargo bench -p rocemu-tools --bench
//! limit`.
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rocemu_tools::perf::LimitKernel;

fn limit(c: &mut Criterion) {
    let mtu = 4096;
    let mut g = c.benchmark_group("limit_4096_chunk");
    g.throughput(Throughput::Bytes(mtu as u64));
    for (name, region) in [
        ("l1", mtu),
        ("region_64k", 64 << 10),
        ("region_2m", 2 << 20),
    ] {
        let mut k = LimitKernel::new(mtu, region);
        let mut i = 0usize;
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                black_box(k.chunk(i))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, limit);
criterion_main!(benches);
