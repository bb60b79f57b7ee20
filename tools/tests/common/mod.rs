//! Two RoCEmu endpoints in one process over an in-memory pipe, for the one-end-per-process code
//! of `rocemu_tools::remote` (pingpong, perf) without root.
use rocemu_emulator::engine::Engine;
use rocemu_emulator::port::pipe::{pipe, PipePort};
use rocemu_emulator::rnic::{Rnic, RnicConfig};
use rocemu_tools::remote::Endpoint;
use rocemu_wire::eth::Mac;
use std::net::{IpAddr, Ipv4Addr};

/// Endpoint `last` of subnet `10.net.0.0/24` (MAC `02:00:00:00:net:last`), Ethernet MTU 1500.
pub fn endpoint(port: PipePort, net: u8, last: u8) -> Endpoint {
    let ip = IpAddr::V4(Ipv4Addr::new(10, net, 0, last));
    let mut cfg = RnicConfig::new(Mac([2, 0, 0, 0, net, last]), ip, last as u64);
    cfg.eth_mtu = 1500;
    Endpoint {
        rnic: Rnic::new(cfg),
        engine: Engine::new(Box::new(port)),
    }
}

/// Runs `server` on endpoint 10.net.0.1 in a thread of its own and `client` on 10.net.0.2 in
/// this one; returns both results. The client's endpoint keeps turning until the server is done
/// (it answers the server's last frames).
pub fn pair<S: Send + 'static, C>(
    net: u8,
    server: impl FnOnce(&mut Endpoint) -> S + Send + 'static,
    client: impl FnOnce(&mut Endpoint) -> C,
) -> (S, C) {
    pair_injected(net, &[], server, client)
}

/// [`pair`], with `frames` waiting on the server's port before it starts, as if they had come
/// off the wire first (forged frames, for hostile-peer tests).
#[allow(dead_code)] // not every test binary forges
pub fn pair_injected<S: Send + 'static, C>(
    net: u8,
    frames: &[Vec<u8>],
    server: impl FnOnce(&mut Endpoint) -> S + Send + 'static,
    client: impl FnOnce(&mut Endpoint) -> C,
) -> (S, C) {
    let (pa, pb) = pipe(Mac([2, 0, 0, 0, net, 1]), Mac([2, 0, 0, 0, net, 2]), 1500);
    for f in frames {
        pa.inject(f);
    }
    let s = std::thread::spawn(move || server(&mut endpoint(pa, net, 1)));
    let mut ep = endpoint(pb, net, 2);
    let c = client(&mut ep);
    while !s.is_finished() {
        let w = ep.engine.poll(&mut ep.rnic);
        ep.engine.idle(w);
    }
    (s.join().unwrap(), c)
}
