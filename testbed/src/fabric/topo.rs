//! Topologies as data: nodes (hosts and switches), links with a rate and a propagation delay,
//! the shortest-path routes each switch spreads over by ECMP, and the builders of the classic
//! experiments (dumbbell, incast, victim flow) and HPCC's topology file format.
//!
//! Invariants: node ids are dense (0..n); every link joins two distinct nodes; a host has one
//! link (its NIC); routes follow shortest paths in hops, hosts never forward.
use std::collections::VecDeque;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Host,
    Switch,
}

/// A full-duplex link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    pub a: usize,
    pub b: usize,
    /// Bits per second, each way.
    pub bps: u64,
    /// Propagation delay, nanoseconds.
    pub delay_ns: u64,
}

/// Nodes and links, and which way of which link is the experiment's bottleneck.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub kinds: Vec<NodeKind>,
    pub links: Vec<Link>,
    /// The bottleneck: the link from node `.0` to node `.1` (its egress queue at `.0`). `None`:
    /// the busiest link, and the deepest queue of any switch (the fat tree).
    pub bottleneck: Option<(usize, usize)>,
}

/// 1 µs per link, as HPCC's topologies.
pub const DEFAULT_DELAY_NS: u64 = 1_000;

impl Topology {
    fn with(n_hosts: usize, n_switches: usize) -> Topology {
        let mut kinds = vec![NodeKind::Host; n_hosts];
        kinds.extend(std::iter::repeat_n(NodeKind::Switch, n_switches));
        Topology {
            kinds,
            links: Vec::new(),
            bottleneck: None,
        }
    }

    fn link(&mut self, a: usize, b: usize, bps: u64) {
        self.links.push(Link {
            a,
            b,
            bps,
            delay_ns: DEFAULT_DELAY_NS,
        });
    }

    /// The hosts' node ids, in order.
    pub fn hosts(&self) -> Vec<usize> {
        (0..self.kinds.len())
            .filter(|&i| self.kinds[i] == NodeKind::Host)
            .collect()
    }

    /// `n` senders on a left switch, `n` receivers on a right one, one link between the two:
    /// hosts 0..n send, n..2n receive; the bottleneck is the left switch's uplink.
    pub fn dumbbell(n: usize, bps: u64) -> Topology {
        let (l, r) = (2 * n, 2 * n + 1);
        let mut t = Topology::with(2 * n, 2);
        for i in 0..n {
            t.link(i, l, bps);
            t.link(n + i, r, bps);
        }
        t.link(l, r, bps);
        t.bottleneck = Some((l, r));
        t
    }

    /// `n` senders and one receiver (host `n`) on one switch; the bottleneck is the receiver's port.
    pub fn incast(n: usize, bps: u64) -> Topology {
        let sw = n + 1;
        let mut t = Topology::with(n + 1, 1);
        for i in 0..=n {
            t.link(i, sw, bps);
        }
        t.bottleneck = Some((sw, n));
        t
    }

    /// The victim flow of PFC's classic experiment: switch L holds `k` incast senders
    /// (hosts 0..k) and the victim's sender (host k); switch R holds `k` more incast senders
    /// (k+1..=2k), the incast receiver (2k+1) and the victim's receiver (2k+2); one L–R link
    /// carries the victim and half the incast ([`VictimRoles`] names them). The bottleneck is
    /// R's port to the incast receiver.
    pub fn victim(k: usize, bps: u64) -> (Topology, VictimRoles) {
        // Hosts: 0..k on L (incast), k = V on L, k+1..2k+1 on R (incast), 2k+1 = incast
        // receiver on R, 2k+2 = the victim's receiver on R.
        let n_hosts = 2 * k + 3;
        let (l, r) = (n_hosts, n_hosts + 1);
        let mut t = Topology::with(n_hosts, 2);
        for h in 0..=k {
            t.link(h, l, bps);
        }
        for h in k + 1..n_hosts {
            t.link(h, r, bps);
        }
        t.link(l, r, bps);
        let roles = VictimRoles {
            incast_senders: (0..k).chain(k + 1..2 * k + 1).collect(),
            incast_receiver: 2 * k + 1,
            victim_sender: k,
            victim_receiver: 2 * k + 2,
        };
        t.bottleneck = Some((r, roles.incast_receiver));
        (t, roles)
    }

    /// HPCC's fat tree (`simulation/mix/fat.txt`), built by its rule: 320 hosts (0–319), 20
    /// ToRs (320–339) of 16 hosts each at 100 Gb/s, 5 pods of 4 ToRs and 4 aggregation
    /// switches (340–359, every ToR to every aggregation switch of its pod at 400 Gb/s), 16
    /// cores (360–375; aggregation switch k of a pod to cores 360+4(k mod 4) … +3 at 400 Gb/s),
    /// 1 µs per link, the links in the file's order. (A helper regenerated the file's 480
    /// lines from this rule and found them identical.)
    pub fn fat_tree() -> Topology {
        let (g100, g400) = (100_000_000_000, 400_000_000_000);
        let mut t = Topology::with(320, 56);
        for h in 0..320 {
            t.link(h, 320 + h / 16, g100);
        }
        for tor in 0..20 {
            for k in 0..4 {
                t.link(320 + tor, 340 + 4 * (tor / 4) + k, g400);
            }
        }
        for agg in 0..20 {
            for j in 0..4 {
                t.link(340 + agg, 360 + 4 * (agg % 4) + j, g400);
            }
        }
        t
    }

    /// Reads HPCC's topology format (`simulation/mix/fat.txt`): a line `NODES SWITCHES LINKS`,
    /// a line of the switches' ids, then one line per link `A B RATE DELAY ERROR_RATE` with
    /// RATE as `100Gbps` and DELAY as `1000ns` (the error rate is ignored: links here do not
    /// lose frames).
    pub fn parse_hpcc(text: &str) -> Result<Topology, String> {
        let mut lines = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        let head: Vec<usize> = lines
            .next()
            .ok_or("an empty topology file")?
            .split_whitespace()
            .map(|w| w.parse().map_err(|_| format!("{w}: not a count")))
            .collect::<Result<_, _>>()?;
        let &[n, n_sw, n_links] = head.as_slice() else {
            return Err("the first line is NODES SWITCHES LINKS".into());
        };
        if n == 0 || n > 1 << 20 || n_sw > n || n_links > 1 << 22 {
            return Err(format!(
                "{n} nodes, {n_sw} switches, {n_links} links: out of range"
            ));
        }
        let mut kinds = vec![NodeKind::Host; n];
        if n_sw > 0 {
            let sw = lines.next().ok_or("the switches' line is missing")?;
            let ids: Vec<&str> = sw.split_whitespace().collect();
            if ids.len() != n_sw {
                return Err(format!(
                    "{} switch ids where the first line says {n_sw}",
                    ids.len()
                ));
            }
            for w in ids {
                let i: usize = w.parse().map_err(|_| format!("{w}: not a node id"))?;
                *kinds
                    .get_mut(i)
                    .ok_or(format!("switch {i}: no such node (there are {n})"))? = NodeKind::Switch;
            }
        }
        let mut t = Topology {
            kinds,
            links: Vec::with_capacity(n_links),
            bottleneck: None,
        };
        for (k, line) in lines.enumerate() {
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.len() < 4 {
                return Err(format!("link {k}: `{line}`: A B RATE DELAY [ERROR_RATE]"));
            }
            let node = |s: &str| -> Result<usize, String> {
                let i: usize = s
                    .parse()
                    .map_err(|_| format!("link {k}: {s}: not a node id"))?;
                (i < n)
                    .then_some(i)
                    .ok_or(format!("link {k}: node {i} does not exist"))
            };
            let (a, b) = (node(w[0])?, node(w[1])?);
            if a == b {
                return Err(format!("link {k}: joins node {a} to itself"));
            }
            t.links.push(Link {
                a,
                b,
                bps: parse_rate(w[2]).map_err(|e| format!("link {k}: {e}"))?,
                delay_ns: parse_delay(w[3]).map_err(|e| format!("link {k}: {e}"))?,
            });
        }
        if t.links.len() != n_links {
            return Err(format!(
                "{} links where the first line says {n_links}",
                t.links.len()
            ));
        }
        t.check()?;
        Ok(t)
    }

    /// Writes the topology in HPCC's format (what [`Topology::parse_hpcc`] reads).
    pub fn to_hpcc(&self) -> String {
        let sw: Vec<String> = (0..self.kinds.len())
            .filter(|&i| self.kinds[i] == NodeKind::Switch)
            .map(|i| i.to_string())
            .collect();
        let mut s = format!(
            "{} {} {}\n{}\n",
            self.kinds.len(),
            sw.len(),
            self.links.len(),
            sw.join(" ")
        );
        for l in &self.links {
            s += &format!(
                "{} {} {}Gbps {}ns 0\n",
                l.a,
                l.b,
                l.bps as f64 / 1e9,
                l.delay_ns
            );
        }
        s
    }

    /// Every host has exactly one link; every node is reachable.
    pub fn check(&self) -> Result<(), String> {
        let mut deg = vec![0usize; self.kinds.len()];
        for l in &self.links {
            deg[l.a] += 1;
            deg[l.b] += 1;
            if l.bps == 0 {
                return Err(format!("link {}–{}: a rate of 0", l.a, l.b));
            }
        }
        for (i, k) in self.kinds.iter().enumerate() {
            if *k == NodeKind::Host && deg[i] != 1 {
                return Err(format!("host {i} has {} links (a host has one)", deg[i]));
            }
        }
        let hosts = self.hosts();
        if hosts.len() < 2 {
            return Err("fewer than two hosts".into());
        }
        let d = self.distances_from(hosts[0]);
        if let Some(i) = d.iter().position(|&x| x == u32::MAX) {
            return Err(format!("node {i} is not connected to host {}", hosts[0]));
        }
        Ok(())
    }

    /// Each node's neighbours: (peer, link index).
    pub fn adjacency(&self) -> Vec<Vec<(usize, usize)>> {
        let mut adj = vec![Vec::new(); self.kinds.len()];
        for (k, l) in self.links.iter().enumerate() {
            adj[l.a].push((l.b, k));
            adj[l.b].push((l.a, k));
        }
        adj
    }

    /// Hops from `src` to every node, through switches only (`u32::MAX`: unreachable).
    pub fn distances_from(&self, src: usize) -> Vec<u32> {
        let adj = self.adjacency();
        let mut d = vec![u32::MAX; self.kinds.len()];
        d[src] = 0;
        let mut q = VecDeque::from([src]);
        while let Some(u) = q.pop_front() {
            if u != src && self.kinds[u] == NodeKind::Host {
                continue;
            }
            for &(v, _) in &adj[u] {
                if d[v] == u32::MAX {
                    d[v] = d[u] + 1;
                    q.push_back(v);
                }
            }
        }
        d
    }
}

/// Who is who in the victim-flow topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VictimRoles {
    pub incast_senders: Vec<usize>,
    pub incast_receiver: usize,
    pub victim_sender: usize,
    pub victim_receiver: usize,
}

/// A number with one of `units` (suffix, multiplier; longer suffixes first), or a bare number
/// (multiplier 1), case-insensitive.
fn with_unit(s: &str, units: &[(&str, f64)]) -> Option<f64> {
    let l = s.to_ascii_lowercase();
    let (num, mul) = units
        .iter()
        .find_map(|&(u, m)| l.strip_suffix(u).map(|x| (x, m)))
        .unwrap_or((l.as_str(), 1.0));
    num.parse::<f64>().ok().map(|v| v * mul)
}

/// `100Gbps`, `25Gbps`, `400Mbps`, `10000000000bps` or a bare number of bits per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let units = [("gbps", 1e9), ("mbps", 1e6), ("kbps", 1e3), ("bps", 1.0)];
    let bps = with_unit(s, &units).ok_or(format!("{s}: not a rate (as 100Gbps)"))?;
    if !(1e3..=1e13).contains(&bps) {
        return Err(format!("{s}: a rate between 1 kb/s and 10 Tb/s"));
    }
    Ok(bps as u64)
}

/// `1000ns`, `1us`, `0.001ms`, `1e-6s` or a bare number of nanoseconds.
pub fn parse_delay(s: &str) -> Result<u64, String> {
    let units = [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)];
    let ns = with_unit(s, &units).ok_or(format!("{s}: not a delay (as 1000ns)"))?;
    if !(0.0..=1e9).contains(&ns) {
        return Err(format!("{s}: a delay between 0 and 1 s"));
    }
    Ok(ns.round() as u64)
}

/// Each switch's next hops towards each host: `routes[switch][host_index]` lists the switch's
/// port numbers (indexes into its adjacency) on a shortest path. Hosts have an empty table.
pub fn routes(t: &Topology) -> Vec<Vec<Vec<u16>>> {
    let adj = t.adjacency();
    let hosts = t.hosts();
    let mut r = vec![Vec::new(); t.kinds.len()];
    for (u, kind) in t.kinds.iter().enumerate() {
        if *kind == NodeKind::Switch {
            r[u] = vec![Vec::new(); hosts.len()];
        }
    }
    for (hi, &h) in hosts.iter().enumerate() {
        let d = t.distances_from(h);
        for (u, kind) in t.kinds.iter().enumerate() {
            if *kind != NodeKind::Switch || d[u] == u32::MAX {
                continue;
            }
            r[u][hi] = adj[u]
                .iter()
                .enumerate()
                .filter(|(_, &(v, _))| {
                    d[v] != u32::MAX
                        && d[v] + 1 == d[u]
                        && (t.kinds[v] == NodeKind::Switch || v == h)
                })
                .map(|(p, _)| p as u16)
                .collect();
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumbbell_routes_cross_the_middle_link() {
        let t = Topology::dumbbell(2, 100_000_000_000);
        t.check().unwrap();
        let r = routes(&t);
        // Left switch (4) to receiver 2 (host index 2): its port 2, the link to the right switch.
        assert_eq!(r[4][2], vec![2]);
        assert_eq!(r[4][0], vec![0]);
        assert_eq!(r[5][0], vec![2]);
    }

    #[test]
    fn hpcc_format_round_trips_and_rejects_nonsense() {
        let (t, _) = Topology::victim(2, 100_000_000_000);
        let mut u = Topology::parse_hpcc(&t.to_hpcc()).unwrap();
        u.bottleneck = t.bottleneck;
        assert_eq!(t, u);
        for bad in [
            "",
            "3 1 2\n2\n0 2 100Gbps 1000ns 0\n",
            "3 1 2\n2\n0 2 100Gbps 1000ns 0\n1 9 100Gbps 1000ns 0\n",
            "3 1 2\n2\n0 2 fastGbps 1000ns 0\n1 2 100Gbps 1000ns 0\n",
            "3 1 2\n2\n0 0 100Gbps 1000ns 0\n1 2 100Gbps 1000ns 0\n",
            "3 1 1\n2\n0 2 100Gbps 1000ns 0\n",
            "99999999999 1 1\n",
        ] {
            assert!(Topology::parse_hpcc(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_fat_tree_is_hpccs() {
        let t = Topology::fat_tree();
        t.check().unwrap();
        assert_eq!(
            (t.kinds.len(), t.links.len(), t.hosts().len()),
            (376, 480, 320)
        );
        let text = t.to_hpcc();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("376 56 480"));
        let l: Vec<&str> = text.lines().collect();
        // HPCC's first, 320th and last link lines (its rates and delays as ours print them).
        assert_eq!(l[2], "0 320 100Gbps 1000ns 0");
        assert_eq!(l[321], "319 339 100Gbps 1000ns 0");
        assert_eq!(l[322], "320 340 400Gbps 1000ns 0");
        assert_eq!(l[481], "359 375 400Gbps 1000ns 0");
        assert_eq!(Topology::parse_hpcc(&text).unwrap(), t);
        // Across pods, 6 hops; 16 ways up from a ToR's host to a core, so ECMP has choices.
        let d = t.distances_from(0);
        assert_eq!(d[319], 6);
        let r = routes(&t);
        assert_eq!(r[320][319].len(), 4);
    }

    #[test]
    fn rates_and_delays() {
        assert_eq!(parse_rate("100Gbps").unwrap(), 100_000_000_000);
        assert_eq!(parse_rate("400Mbps").unwrap(), 400_000_000);
        assert_eq!(parse_delay("1000ns").unwrap(), 1000);
        assert_eq!(parse_delay("1us").unwrap(), 1000);
        assert_eq!(parse_delay("0.001ms").unwrap(), 1000);
        assert!(parse_rate("0Gbps").is_err());
        assert!(parse_delay("-1ns").is_err());
    }
}
