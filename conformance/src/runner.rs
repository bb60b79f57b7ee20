//! Runs scenarios against a target and writes the reports: `report.json`, `junit.xml`,
//! `matrix.md`, and `pcap/<scenario-id>.pcap` for every failing case.
//!
//! With `--target self` every scenario gets a fresh RoCEmu RNIC seeded from its id, in virtual
//! time: a failure replays exactly. With `--target agent:ADDR` one agent connection and one port
//! serve the whole run, and `reset` clears the device between scenarios.
use crate::agent::client::JsonClient;
use crate::agent::{Agent, DeviceInfo};
use crate::cite::Source;
use crate::counters::{self, rnic_snapshot, Delta};
use crate::dut::{self_target, Link, SelfAgent, SharedDut, PEER_IP, PEER_MAC};
use crate::peer::Peer;
use crate::scenario::{Ctx, Scenario};
use rocemu_wire::eth::Mac;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One scenario's result.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub id: &'static str,
    pub title: &'static str,
    /// The scenario's citations in a few words ([`Scenario::spec`]).
    pub spec: String,
    pub passed: bool,
    /// The device lacks the optional feature the scenario is about: neither passed nor failed
    /// (`reason` says what is missing).
    pub unsupported: bool,
    /// Why it failed, or why it is unsupported (None when it passed).
    pub reason: Option<String>,
    /// Frames both ways.
    pub frames: usize,
    /// Time on the link's clock (virtual with `--target self`).
    pub link_time: Duration,
    /// Wall-clock time the scenario took.
    pub wall: Duration,
    /// The capture of a failing case, once written.
    pub pcap: Option<PathBuf>,
    /// How much the device's rdma_rxe-named counters moved during the scenario (None when they
    /// were not read, or a read failed).
    pub counters: Option<Delta>,
}

/// A result with the peer that ran it (its capture becomes the pcap of a failure).
#[derive(Debug)]
pub struct CaseRun {
    pub result: CaseResult,
    pub peer: Option<Peer>,
}

/// A stable seed for a scenario: FNV-1a of its id.
pub fn seed_for(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic".into()
    }
}

fn failed_setup(sc: &Scenario, why: String) -> CaseRun {
    CaseRun {
        result: CaseResult {
            id: sc.id,
            title: sc.title,
            spec: sc.spec(),
            passed: false,
            unsupported: false,
            reason: Some(why),
            frames: 0,
            link_time: Duration::ZERO,
            wall: Duration::ZERO,
            pcap: None,
            counters: None,
        },
        peer: None,
    }
}

/// Runs `sc` with `agent` and `peer`; a panic in the scenario is a failure, not a crash.
pub fn run_case(
    sc: &Scenario,
    agent: &mut dyn Agent,
    peer: Peer,
    dev: DeviceInfo,
    seed: u64,
) -> CaseRun {
    let wall = Instant::now();
    let mut ctx = Ctx::new(agent, peer, dev, seed);
    let start = ctx.peer.now();
    let outcome = catch_unwind(AssertUnwindSafe(|| (sc.run)(&mut ctx)))
        .unwrap_or_else(|p| Err(format!("the scenario panicked: {}", panic_text(p))));
    let peer = ctx.peer;
    CaseRun {
        result: CaseResult {
            id: sc.id,
            title: sc.title,
            spec: sc.spec(),
            passed: outcome.is_ok(),
            unsupported: outcome
                .as_ref()
                .err()
                .is_some_and(|r| crate::scenario::is_unsupported(r)),
            reason: outcome.err(),
            frames: peer.capture.len(),
            link_time: peer.now().saturating_sub(start),
            wall: wall.elapsed(),
            pcap: None,
            counters: None,
        },
        peer: Some(peer),
    }
}

/// Runs `sc` against a fresh RoCEmu RNIC in virtual time.
pub fn run_self(sc: &Scenario) -> CaseRun {
    run_self_with(sc, |_, a| Box::new(a))
}

/// Runs `sc` against a fresh RoCEmu RNIC whose agent is `wrap`ped (and whose frames the
/// wrapper may filter through the [`SharedDut`]): how the tests break the device on purpose.
pub fn run_self_with(
    sc: &Scenario,
    wrap: impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent>,
) -> CaseRun {
    let seed = seed_for(sc.id);
    let (dut, agent, link) = self_target(seed);
    let mut agent = wrap(&dut, agent);
    let dev = match agent.query_device() {
        Ok(d) => d,
        Err(e) => return failed_setup(sc, format!("query_device: {e}")),
    };
    let Some(&dut_ip) = dev.gids.first() else {
        return failed_setup(sc, "the device has no GID".into());
    };
    let peer = Peer::new(Box::new(link), (PEER_MAC, PEER_IP), (dev.mac, dut_ip));
    let before = rnic_snapshot(&dut.borrow().rnic.counters());
    let mut run = run_case(sc, &mut *agent, peer, dev, seed);
    let after = rnic_snapshot(&dut.borrow().rnic.counters());
    run.result.counters = Some(counters::delta(&before, &after));
    run
}

/// A device behind an agent, facing the peer through a real port.
pub struct AgentTarget {
    pub agent: JsonClient,
    pub dev: DeviceInfo,
    /// The GID index of the device's address to use.
    pub dut_ip: IpAddr,
    pub peer_mac: Mac,
    pub peer_ip: IpAddr,
    /// How long the peer listens for frames that should, or should not, come.
    pub settle: Duration,
    /// A shell command printing the device's counters as `rdma statistic show link DEV/PORT`
    /// does, run before and after each scenario (None: counters not read).
    pub counters_cmd: Option<String>,
    /// Counter reads so far, and the wall-clock time they took.
    pub counter_reads: (usize, Duration),
    link: Option<Box<dyn Link>>,
}

impl std::fmt::Debug for AgentTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTarget")
            .field("agent", &self.agent)
            .field("dut_ip", &self.dut_ip)
            .field("peer_ip", &self.peer_ip)
            .finish_non_exhaustive()
    }
}

impl AgentTarget {
    /// Connects to the agent at `addr`, asks where the device is, and keeps `link` (the port the
    /// peer uses, at `peer_mac` / `peer_ip`).
    pub fn connect(
        addr: &str,
        link: Box<dyn Link>,
        peer_mac: Mac,
        peer_ip: IpAddr,
        gid_index: usize,
    ) -> Result<AgentTarget, String> {
        let mut agent = JsonClient::connect(addr)?;
        let dev = agent.query_device()?;
        let dut_ip = *dev.gids.get(gid_index).ok_or_else(|| {
            format!(
                "the device has {} GIDs, no index {gid_index}",
                dev.gids.len()
            )
        })?;
        Ok(AgentTarget {
            agent,
            dev,
            dut_ip,
            peer_mac,
            peer_ip,
            settle: Duration::from_millis(100),
            counters_cmd: None,
            counter_reads: (0, Duration::ZERO),
            link: Some(link),
        })
    }

    /// Runs `sc`: reset the device, hand the link to a new peer, take it back afterwards.
    pub fn run(&mut self, sc: &Scenario) -> CaseRun {
        if let Err(e) = self.agent.reset() {
            return failed_setup(sc, format!("reset: {e}"));
        }
        let Some(link) = self.link.take() else {
            return failed_setup(sc, "the link was lost by an earlier scenario".into());
        };
        let mut peer = Peer::new(
            link,
            (self.peer_mac, self.peer_ip),
            (self.dev.mac, self.dut_ip),
        );
        peer.settle = self.settle;
        let dev = self.dev.clone();
        let read = |cmd: &Option<String>, reads: &mut (usize, Duration)| {
            let t = Instant::now();
            let r = cmd.as_deref().map(counters::read_with_command);
            if r.is_some() {
                reads.0 += 1;
                reads.1 += t.elapsed();
            }
            r
        };
        let before = read(&self.counters_cmd, &mut self.counter_reads);
        let mut run = run_case(sc, &mut self.agent, peer, dev, seed_for(sc.id) ^ now_seed());
        let after = read(&self.counters_cmd, &mut self.counter_reads);
        // A failed read leaves this scenario without counters; it fails nothing.
        run.result.counters = match (before, after) {
            (Some(Ok(b)), Some(Ok(a))) => Some(counters::delta(&b, &a)),
            (Some(Err(e)), _) | (_, Some(Err(e))) => {
                eprintln!("conformance: {}: counters not read: {e}", sc.id);
                None
            }
            _ => None,
        };
        if let Some(p) = run.peer.take() {
            let capture = p.capture.clone();
            let (mac, ip, dmac, dip) = (p.mac, p.ip, p.dut_mac, p.dut_ip);
            self.link = Some(p.into_link());
            // Keep the capture for the pcap: a peer without a link.
            let mut keep = Peer::new(Box::new(NoLink), (mac, ip), (dmac, dip));
            keep.capture = capture;
            run.peer = Some(keep);
        }
        run
    }
}

/// Real devices pick their own keys and QPNs: the peer's PSNs need not be replayable.
fn now_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A link that carries nothing (a finished peer's capture outlives its link).
struct NoLink;

impl Link for NoLink {
    fn send(&mut self, _: &[u8]) {}
    fn recv(&mut self, _: Duration) -> Option<(Duration, Vec<u8>)> {
        None
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct Report {
    /// `self`, or `agent:ADDR`.
    pub target: String,
    /// The device as its agent described it.
    pub device: String,
    pub cases: Vec<CaseResult>,
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

impl Report {
    pub fn passed(&self) -> usize {
        self.cases.iter().filter(|c| c.passed).count()
    }
    pub fn failed(&self) -> usize {
        self.cases.len() - self.passed() - self.unsupported()
    }
    /// Scenarios about a feature the device does not have: neither passed nor failed.
    pub fn unsupported(&self) -> usize {
        self.cases.iter().filter(|c| c.unsupported).count()
    }

    /// One line per scenario, then the totals.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for c in &self.cases {
            let verdict = match (c.passed, c.unsupported) {
                (true, _) => "PASS",
                (false, true) => "UNSUPPORTED",
                (false, false) => "FAIL",
            };
            let _ = write!(s, "{verdict} {}", c.id);
            if let Some(r) = &c.reason {
                let _ = write!(s, ": {r}");
            }
            s.push('\n');
        }
        let unsupported = match self.unsupported() {
            0 => String::new(),
            n => format!(", {n} unsupported"),
        };
        let _ = writeln!(
            s,
            "conformance ({}): {} passed, {} failed{unsupported}, {} scenarios",
            self.target,
            self.passed(),
            self.failed(),
            self.cases.len()
        );
        s
    }

    pub fn json(&self) -> Value {
        json!({
            "target": self.target,
            "device": self.device,
            "passed": self.passed(),
            "failed": self.failed(),
            "unsupported": self.unsupported(),
            "scenarios": self.cases.iter().map(|c| {
                let mut o = json!({
                    "id": c.id,
                    "title": c.title,
                    "spec": c.spec,
                    "result": match (c.passed, c.unsupported) {
                        (true, _) => "pass",
                        (false, true) => "unsupported",
                        (false, false) => "fail",
                    },
                    "reason": c.reason,
                    "frames": c.frames,
                    "link_ms": c.link_time.as_secs_f64() * 1e3,
                    "wall_ms": c.wall.as_secs_f64() * 1e3,
                    "pcap": c.pcap.as_ref().map(|p| p.display().to_string()),
                });
                // Absent, not null, when the counters were not read.
                if let Some(d) = &c.counters {
                    o["counters"] = json!(d);
                }
                o
            }).collect::<Vec<_>>(),
        })
    }

    pub fn junit(&self) -> String {
        let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let total: f64 = self.cases.iter().map(|c| c.wall.as_secs_f64()).sum();
        let _ = writeln!(
            s,
            "<testsuite name=\"rocemu-conformance ({})\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"{total:.3}\">",
            xml_escape(&self.target),
            self.cases.len(),
            self.failed(),
            self.unsupported()
        );
        for c in &self.cases {
            let class = c.id.split('.').next().unwrap_or(c.id);
            let _ = write!(
                s,
                "  <testcase classname=\"conformance.{}\" name=\"{}\" time=\"{:.3}\">",
                xml_escape(class),
                xml_escape(c.id),
                c.wall.as_secs_f64()
            );
            if let (true, Some(r)) = (c.unsupported, &c.reason) {
                let _ = write!(s, "\n    <skipped message=\"{}\"/>\n  ", xml_escape(r));
            } else if let Some(r) = &c.reason {
                let _ = write!(
                    s,
                    "\n    <failure message=\"{}\">{} — {}</failure>\n  ",
                    xml_escape(r),
                    xml_escape(&c.spec),
                    xml_escape(r)
                );
            }
            s.push_str("</testcase>\n");
        }
        s.push_str("</testsuite>\n");
        s
    }

    /// The catalogue table: id, what it checks, where the spec says so, the result.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Target `{}` ({}): {} of {} scenarios pass{}.\n",
            self.target,
            self.device,
            self.passed(),
            self.cases.len(),
            match self.unsupported() {
                0 => String::new(),
                n => format!(", {n} unsupported"),
            }
        );
        s.push_str("| id | what | citation | result |\n|---|---|---|---|\n");
        for c in &self.cases {
            let result = match &c.reason {
                None => "pass".to_string(),
                Some(r) if c.unsupported => md_cell(r),
                Some(r) => format!("**FAIL**: {}", md_cell(r)),
            };
            let _ = writeln!(
                s,
                "| `{}` | {} | {} | {} |",
                c.id,
                md_cell(c.title),
                md_cell(&c.spec),
                result
            );
        }
        s
    }

    /// Writes `report.json`, `junit.xml` and `matrix.md` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let put = |name: &str, text: String| {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
        };
        put("report.json", format!("{:#}\n", self.json()))?;
        put("junit.xml", self.junit())?;
        put("matrix.md", self.markdown())
    }
}

/// Keeps a case's result, writing its capture to `out/pcap/<id>.pcap` when it failed.
pub fn record(run: CaseRun, out: Option<&Path>) -> CaseResult {
    let mut r = run.result;
    let failed = !r.passed && !r.unsupported;
    if let (true, Some(dir), Some(peer)) = (failed, out, run.peer.as_ref()) {
        let d = dir.join("pcap");
        let p = d.join(format!("{}.pcap", r.id));
        let written = std::fs::create_dir_all(&d)
            .map_err(|e| format!("{}: {e}", d.display()))
            .and_then(|()| peer.write_pcap(&p));
        match written {
            Ok(()) => r.pcap = Some(p),
            Err(e) => {
                let reason = r.reason.take().unwrap_or_default();
                r.reason = Some(format!("{reason} (and its pcap could not be written: {e})"));
            }
        }
    }
    r
}

/// The catalogue as text: id, title, and each citation with its release and the source that
/// confirms it, or `unverified`.
pub fn list(scenarios: &[Scenario]) -> String {
    let mut s = String::new();
    let (mut checked, mut unverified) = (0, 0);
    for sc in scenarios {
        let _ = writeln!(s, "{}\n    {}", sc.id, sc.title);
        for c in sc.cites {
            let doc = match c.release {
                "A17 (2014)" => "RoCEv2 Annex A17, 2014".to_string(),
                "ReDMArk (2021)" => "USENIX Security 2021".to_string(),
                "not stated" => "IBTA Vol. 1, release not stated".to_string(),
                r => format!("IBTA Vol. 1 Release {r}"),
            };
            let _ = writeln!(s, "    {} ({doc}): {}", c.clause, c.rule);
            match c.source {
                Source::Checked(src) => {
                    checked += 1;
                    let _ = writeln!(s, "        source: {src}");
                }
                Source::Unverified => {
                    unverified += 1;
                    let _ = writeln!(
                        s,
                        "        unverified: no public source read confirms this number"
                    );
                }
            }
        }
    }
    let _ = writeln!(
        s,
        "{} scenarios; {checked} citations checked against a source, {unverified} unverified",
        scenarios.len()
    );
    s
}

/// A Markdown matrix of several runs side by side (their `report.json` objects): one row per
/// scenario, one result column per run, headed by `names` (default: each run's device).
pub fn side_by_side(reports: &[Value], names: &[String]) -> Result<String, String> {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    let mut results: Vec<std::collections::HashMap<String, String>> = Vec::new();
    let mut heads = Vec::new();
    for (i, r) in reports.iter().enumerate() {
        let cases = r["scenarios"]
            .as_array()
            .ok_or("a report without \"scenarios\"")?;
        let mut m = std::collections::HashMap::new();
        for c in cases {
            let id = c["id"]
                .as_str()
                .ok_or("a scenario without an id")?
                .to_string();
            if !rows.iter().any(|(r, _, _)| *r == id) {
                let text = |k: &str| c[k].as_str().unwrap_or("").to_string();
                rows.push((id.clone(), text("title"), text("spec")));
            }
            let res = match c["reason"].as_str() {
                None => "pass".to_string(),
                Some(why) if c["result"] == "unsupported" => md_cell(why),
                Some(why) => format!("**FAIL**: {}", md_cell(why)),
            };
            m.insert(id, res);
        }
        let head = names
            .get(i)
            .cloned()
            .unwrap_or_else(|| r["device"].as_str().unwrap_or("?").to_string());
        let passed = r["passed"].as_u64().unwrap_or(0);
        heads.push(format!("{} ({passed}/{})", md_cell(&head), cases.len()));
        results.push(m);
    }
    let mut s = String::new();
    let _ = writeln!(s, "| id | what | citation | {} |", heads.join(" | "));
    let _ = writeln!(s, "|---|---|---|{}", "---|".repeat(heads.len()));
    for (id, title, spec) in &rows {
        let cells: Vec<String> = results
            .iter()
            .map(|m| m.get(id).cloned().unwrap_or_else(|| "—".into()))
            .collect();
        let _ = writeln!(
            s,
            "| `{id}` | {} | {} | {} |",
            md_cell(title),
            md_cell(spec),
            cells.join(" | ")
        );
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(id: &'static str, reason: Option<&str>) -> CaseResult {
        CaseResult {
            id,
            title: "t",
            spec: "s".into(),
            passed: reason.is_none(),
            unsupported: reason.is_some_and(crate::scenario::is_unsupported),
            reason: reason.map(str::to_string),
            frames: 0,
            link_time: Duration::ZERO,
            wall: Duration::ZERO,
            pcap: None,
            counters: None,
        }
    }

    #[test]
    fn unsupported_is_neither_pass_nor_fail_in_every_format() {
        let why = "unsupported: no FLUSH";
        let r = Report {
            target: "self".into(),
            device: "d".into(),
            cases: vec![
                case("a.pass", None),
                case("b.fail", Some("wrong")),
                case("c.unsup", Some(why)),
            ],
        };
        assert_eq!((r.passed(), r.failed(), r.unsupported()), (1, 1, 1));
        let j = r.json();
        assert_eq!(j["unsupported"], 1);
        assert_eq!(j["failed"], 1);
        let results: Vec<&str> = j["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["result"].as_str().unwrap())
            .collect();
        assert_eq!(results, ["pass", "fail", "unsupported"]);
        let x = r.junit();
        assert!(
            x.contains("failures=\"1\"") && x.contains("skipped=\"1\""),
            "{x}"
        );
        assert!(
            x.contains("<skipped message=\"unsupported: no FLUSH\"/>"),
            "{x}"
        );
        assert_eq!(x.matches("<failure").count(), 1, "{x}");
        let m = r.markdown();
        assert!(m.contains("1 of 3 scenarios pass, 1 unsupported"), "{m}");
        assert!(m.contains("| unsupported: no FLUSH |"), "{m}");
        assert_eq!(m.matches("**FAIL**").count(), 1, "{m}");
        let s = r.summary();
        assert!(s.contains("UNSUPPORTED c.unsup") && s.contains("1 failed, 1 unsupported"));
        let side = side_by_side(&[j], &[]).unwrap();
        assert_eq!(side.matches("**FAIL**").count(), 1, "{side}");
        // A failing case keeps its capture; an unsupported one writes none.
        let dir = std::env::temp_dir().join(format!("rcf-unsup-{}", std::process::id()));
        let peer = |id| CaseRun {
            result: case(id, Some(why)),
            peer: Some(Peer::new(
                Box::new(NoLink),
                (PEER_MAC, PEER_IP),
                (PEER_MAC, PEER_IP),
            )),
        };
        assert!(record(peer("c.unsup"), Some(&dir)).pcap.is_none());
        let mut failing = peer("b.fail");
        failing.result = case("b.fail", Some("wrong"));
        let kept = record(failing, Some(&dir));
        assert!(kept.pcap.as_ref().is_some_and(|p| p.exists()), "{kept:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
