//! The device's rdma_rxe-named counters around each scenario, and the comparison of two runs'
//! deltas (`docs/conformance.md`, "Counters against rdma_rxe").
//!
//! rxe's port counters are the 15 of `rxe_counter_name[]` in
//! `drivers/infiniband/sw/rxe/rxe_hw_counters.c`; [`RXE_COUNTERS`] lists them. A run keeps, per
//! scenario, how much each of them moved (`"counters"` in `report.json`): for `--target self`
//! read from the RoCEmu RNIC under test, for an agent target from a command whose output is
//! `rdma statistic show link DEV/PORT`'s ([`parse_rdma_statistic`]). [`compare`] then holds one
//! run's deltas against another's, scenario by scenario and counter by counter, and a list of
//! explained deviations ([`parse_deviations`]) says which differences are understood.
//!
//! Nothing here panics on what a command prints or what a file holds: a counter read that fails
//! leaves that scenario without counters, and a malformed line is an error with its number.
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// rdma_rxe's counter names (`rxe_counter_name[]`, `rxe_hw_counters.c`), in rxe's order.
pub const RXE_COUNTERS: &[&str] = &[
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "ack_deferred",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    "rdma_sends",
    "rdma_recvs",
];

/// Counter values by name.
pub type Snapshot = BTreeMap<String, u64>;
/// How much each counter moved, by name (negative when a counter went backwards).
pub type Delta = BTreeMap<String, i64>;

/// Parses `rdma statistic show link DEV/PORT` output: a line `link DEV/PORT name value name
/// value …` (iproute2's `rdma` prints one such line per port; more than one line, or a line
/// that is not a `link` line, is an error). Only rxe's names ([`RXE_COUNTERS`]) are kept, so a
/// device with more counters (mlx5's) still compares on rxe's.
pub fn parse_rdma_statistic(text: &str) -> Result<Snapshot, String> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let line = lines.next().ok_or("no output")?;
    if let Some(extra) = lines.next() {
        return Err(format!("more than one line (the second: {extra:?})"));
    }
    let mut words = line.split_whitespace();
    if words.next() != Some("link") {
        return Err(format!("not a `link DEV/PORT …` line: {line:?}"));
    }
    let port = words.next().ok_or("no DEV/PORT after `link`")?;
    if !port.contains('/') {
        return Err(format!("{port:?} is not DEV/PORT"));
    }
    let mut out = Snapshot::new();
    while let Some(name) = words.next() {
        let value = words
            .next()
            .ok_or_else(|| format!("counter {name} has no value"))?;
        let v: u64 = value
            .parse()
            .map_err(|_| format!("counter {name}: {value:?} is not a count"))?;
        if out.insert(name.to_string(), v).is_some() {
            return Err(format!("counter {name} given twice"));
        }
    }
    out.retain(|k, _| RXE_COUNTERS.contains(&k.as_str()));
    if out.is_empty() {
        return Err("no rdma_rxe counter in the output".into());
    }
    Ok(out)
}

/// The RoCEmu counters that carry rxe's names (`Counters::named` gives more, RoCEmu's and
/// mlx5's; those are left out).
pub fn rnic_snapshot(c: &rocemu_emulator::rnic::Counters) -> Snapshot {
    c.named()
        .into_iter()
        .filter(|(n, _)| RXE_COUNTERS.contains(n))
        .map(|(n, v)| (n.to_string(), v))
        .collect()
}

/// `after - before` for every counter in both snapshots.
pub fn delta(before: &Snapshot, after: &Snapshot) -> Delta {
    before
        .iter()
        .filter_map(|(k, b)| {
            let a = after.get(k)?;
            let d = (*a as i128 - *b as i128).clamp(i64::MIN as i128, i64::MAX as i128);
            Some((k.clone(), d as i64))
        })
        .collect()
}

/// Runs `cmd` with `sh -c` and parses its standard output as [`parse_rdma_statistic`] does.
/// A command that cannot start, exits with a failure or prints something else is an error.
pub fn read_with_command(cmd: &str) -> Result<Snapshot, String> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd}: {} ({})",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse_rdma_statistic(&String::from_utf8_lossy(&out.stdout)).map_err(|e| format!("{cmd}: {e}"))
}

/// One explained deviation: in `scenario`, `counter` may differ, because `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deviation {
    pub scenario: String,
    pub counter: String,
    pub reason: String,
}

/// Parses a deviations file: one `scenario counter reason…` a line; blank lines and lines
/// starting with `#` are skipped. A line without a reason is an error (a deviation is listed
/// because it is understood), as is one naming a counter that is not rxe's or listed twice.
pub fn parse_deviations(text: &str) -> Result<Vec<Deviation>, String> {
    let mut out: Vec<Deviation> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(3, char::is_whitespace);
        let (Some(scenario), Some(counter), Some(reason)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "line {}: want `scenario counter reason…`, got {line:?}",
                i + 1
            ));
        };
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(format!("line {}: {scenario} {counter}: no reason", i + 1));
        }
        if !RXE_COUNTERS.contains(&counter) {
            return Err(format!(
                "line {}: {counter} is not one of rdma_rxe's counters",
                i + 1
            ));
        }
        if out
            .iter()
            .any(|d| d.scenario == scenario && d.counter == counter)
        {
            return Err(format!("line {}: {scenario} {counter} listed twice", i + 1));
        }
        out.push(Deviation {
            scenario: scenario.into(),
            counter: counter.into(),
            reason: reason.into(),
        });
    }
    Ok(out)
}

/// The per-scenario counter deltas of a `report.json`: scenarios without `"counters"` (their
/// read failed) are left out; a value that is not an integer is an error.
pub fn report_deltas(report: &Value) -> Result<BTreeMap<String, Delta>, String> {
    let cases = report["scenarios"]
        .as_array()
        .ok_or("a report without \"scenarios\"")?;
    let mut out = BTreeMap::new();
    for c in cases {
        let id = c["id"].as_str().ok_or("a scenario without an id")?;
        let Some(obj) = c.get("counters").and_then(Value::as_object) else {
            continue;
        };
        let mut d = Delta::new();
        for (k, v) in obj {
            let v = v
                .as_i64()
                .ok_or_else(|| format!("{id}: counter {k}: {v} is not an integer"))?;
            d.insert(k.clone(), v);
        }
        out.insert(id.to_string(), d);
    }
    Ok(out)
}

/// A difference nobody explained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub scenario: String,
    pub counter: String,
    /// The delta in the first run (ours) and in the second (the reference).
    pub ours: i64,
    pub theirs: i64,
}

/// What [`compare`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comparison {
    /// (scenario, counter) pairs present in both runs.
    pub pairs: usize,
    /// Pairs in which either run's delta is not zero (the rest are 0 = 0).
    pub moved: usize,
    pub same: usize,
    /// Pairs that differ as a deviation says they may.
    pub explained: usize,
    pub problems: Vec<Problem>,
    /// Deviations listed that the runs did not show (the two deltas were equal, or the pair
    /// was not in both runs): stale entries, reported but not problems.
    pub unused: Vec<Deviation>,
    /// Scenarios that have counters in one run only.
    pub one_sided: Vec<String>,
}

impl Comparison {
    /// The per-problem lines, the notes, and the summary line
    /// (`conformance-rxe: counters: N pairs compared, S same, E explained, P problems`).
    pub fn text(&self) -> String {
        let mut s = String::new();
        for p in &self.problems {
            let _ = writeln!(
                s,
                "conformance-rxe: counters: PROBLEM {} {}: ours {}, rxe {}",
                p.scenario, p.counter, p.ours, p.theirs
            );
        }
        for d in &self.unused {
            let _ = writeln!(
                s,
                "conformance-rxe: counters: note: deviation {} {} not seen in these runs",
                d.scenario, d.counter
            );
        }
        for id in &self.one_sided {
            let _ = writeln!(
                s,
                "conformance-rxe: counters: note: {id} has counters in one run only"
            );
        }
        let _ = writeln!(
            s,
            "conformance-rxe: counters: {} of the pairs moved in one run or both",
            self.moved
        );
        let _ = writeln!(
            s,
            "conformance-rxe: counters: {} pairs compared, {} same, {} explained, {} problems",
            self.pairs,
            self.same,
            self.explained,
            self.problems.len()
        );
        s
    }
}

/// Compares `ours` (a `report.json`) with `theirs` scenario by scenario, for every counter in
/// both: equal deltas are the same; different ones are explained when `deviations` lists the
/// pair, problems otherwise.
pub fn compare(
    ours: &Value,
    theirs: &Value,
    deviations: &[Deviation],
) -> Result<Comparison, String> {
    let (a, b) = (report_deltas(ours)?, report_deltas(theirs)?);
    let mut c = Comparison::default();
    let mut used = vec![false; deviations.len()];
    for (id, da) in &a {
        let Some(db) = b.get(id) else {
            c.one_sided.push(id.clone());
            continue;
        };
        for (counter, &x) in da {
            let Some(&y) = db.get(counter) else { continue };
            c.pairs += 1;
            if x != 0 || y != 0 {
                c.moved += 1;
            }
            if x == y {
                c.same += 1;
                continue;
            }
            match deviations
                .iter()
                .position(|d| d.scenario == *id && d.counter == *counter)
            {
                Some(i) => {
                    used[i] = true;
                    c.explained += 1;
                }
                None => c.problems.push(Problem {
                    scenario: id.clone(),
                    counter: counter.clone(),
                    ours: x,
                    theirs: y,
                }),
            }
        }
    }
    c.one_sided
        .extend(b.keys().filter(|id| !a.contains_key(*id)).cloned());
    c.unused = deviations
        .iter()
        .zip(used)
        .filter(|(_, u)| !u)
        .map(|(d, _)| d.clone())
        .collect();
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RXE_LINE: &str = "link rxe0/1 sent_pkts 12 rcvd_pkts 10 duplicate_request 1 \
        out_of_seq_request 0 rcvd_rnr_err 0 send_rnr_err 0 rcvd_seq_err 0 ack_deferred 0 \
        retry_exceeded_err 0 retry_rnr_exceeded_err 0 completer_retry_err 0 send_err 0 \
        link_downed 0 rdma_sends 3 rdma_recvs 2\n";

    #[test]
    fn parses_rdma_statistic_output() {
        let s = parse_rdma_statistic(RXE_LINE).unwrap();
        assert_eq!(s.len(), 15);
        assert_eq!(s["sent_pkts"], 12);
        assert_eq!(s["duplicate_request"], 1);
        assert_eq!(s["rdma_recvs"], 2);
    }

    #[test]
    fn keeps_only_rxe_names() {
        let s = parse_rdma_statistic("link mlx5_0/1 rx_write_requests 5 rdma_sends 7").unwrap();
        assert_eq!(s, Snapshot::from([("rdma_sends".into(), 7)]));
    }

    #[test]
    fn malformed_output_is_an_error_not_a_panic() {
        for bad in [
            "",
            "\n\n",
            "error: no such device",
            "link",
            "link rxe0",
            "link rxe0/1",
            "link rxe0/1 sent_pkts",
            "link rxe0/1 sent_pkts -1",
            "link rxe0/1 sent_pkts 1x",
            "link rxe0/1 sent_pkts 99999999999999999999999",
            "link rxe0/1 sent_pkts 1 sent_pkts 2",
            "link rxe0/1 foo 1",
            "dev rxe0 sent_pkts 1",
            "link rxe0/1 sent_pkts 1\nlink rxe1/1 sent_pkts 2",
            "\u{0}\u{ffff} link rxe0/1",
        ] {
            assert!(parse_rdma_statistic(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn delta_takes_the_names_in_both() {
        let b = Snapshot::from([("a".into(), 5), ("b".into(), 1)]);
        let a = Snapshot::from([("a".into(), 7), ("c".into(), 1)]);
        assert_eq!(delta(&b, &a), Delta::from([("a".into(), 2)]));
        let back = Snapshot::from([("a".into(), 3)]);
        assert_eq!(delta(&b, &back), Delta::from([("a".into(), -2)]));
        let big = Snapshot::from([("a".into(), u64::MAX)]);
        let zero = Snapshot::from([("a".into(), 0)]);
        assert_eq!(delta(&zero, &big)["a"], i64::MAX);
    }

    #[test]
    fn a_failing_command_is_an_error() {
        assert!(read_with_command("exit 3").is_err());
        assert!(read_with_command("echo nonsense").is_err());
        let s = read_with_command("echo link rxe0/1 rdma_sends 4").unwrap();
        assert_eq!(s["rdma_sends"], 4);
    }

    #[test]
    fn parses_deviations() {
        let d = parse_deviations(
            "# comment\n\nqp.err.flushes-work rdma_sends rxe counts it in do_complete()\n",
        )
        .unwrap();
        assert_eq!(
            d,
            vec![Deviation {
                scenario: "qp.err.flushes-work".into(),
                counter: "rdma_sends".into(),
                reason: "rxe counts it in do_complete()".into(),
            }]
        );
        for bad in [
            "x rdma_sends",
            "x rdma_sends   ",
            "x",
            "x not_a_counter because",
            "x rdma_sends a\nx rdma_sends b",
        ] {
            assert!(parse_deviations(bad).is_err(), "{bad:?} was accepted");
        }
    }

    fn report(cases: Value) -> Value {
        json!({ "scenarios": cases })
    }

    #[test]
    fn compare_counts_same_explained_and_problems() {
        let ours = report(json!([
            {"id": "s1", "counters": {"rdma_sends": 1, "sent_pkts": 2}},
            {"id": "s2", "counters": {"rdma_sends": 0, "rcvd_seq_err": 1, "send_err": 0}},
            {"id": "s3"},
            {"id": "s4", "counters": {"rdma_sends": 1}},
        ]));
        let theirs = report(json!([
            {"id": "s1", "counters": {"rdma_sends": 1, "sent_pkts": 3, "ack_deferred": 4}},
            {"id": "s2", "counters": {"rdma_sends": 1, "rcvd_seq_err": 0, "send_err": 0}},
            {"id": "s3", "counters": {"rdma_sends": 9}},
        ]));
        let dev = parse_deviations("s2 rdma_sends because\ns9 sent_pkts stale\n").unwrap();
        let c = compare(&ours, &theirs, &dev).unwrap();
        assert_eq!((c.pairs, c.moved, c.same, c.explained), (5, 4, 2, 1));
        assert_eq!(
            c.problems,
            vec![
                Problem {
                    scenario: "s1".into(),
                    counter: "sent_pkts".into(),
                    ours: 2,
                    theirs: 3
                },
                Problem {
                    scenario: "s2".into(),
                    counter: "rcvd_seq_err".into(),
                    ours: 1,
                    theirs: 0
                },
            ]
        );
        assert_eq!(c.unused.len(), 1);
        assert_eq!(c.one_sided, vec!["s4".to_string(), "s3".to_string()]);
        let text = c.text();
        assert!(text.ends_with(
            "conformance-rxe: counters: 5 pairs compared, 2 same, 1 explained, 2 problems\n"
        ));
        assert!(text.contains("PROBLEM s1 sent_pkts: ours 2, rxe 3"));
    }

    #[test]
    fn self_runs_keep_the_rnics_deltas_and_the_report_carries_them() {
        let pick = |id: &str| crate::scenarios::select(id).remove(0);
        // A send posted to a QP in ERR is flushed, and counted as rxe counts it.
        let flush = crate::runner::run_self(&pick("qp.err.flushes-work")).result;
        let c = flush
            .counters
            .clone()
            .expect("self runs read the RNIC's counters");
        assert_eq!(c.len(), 14, "{c:?}"); // all of rxe's 15 but ack_deferred
        assert_eq!(c["rdma_sends"], 1);
        assert_eq!(c["sent_pkts"], 0);
        let dup = crate::runner::run_self(&pick("psn.dup.send-reacked-once-delivered")).result;
        assert_eq!(dup.counters.as_ref().unwrap()["duplicate_request"], 1);
        let mut unread = dup.clone();
        unread.counters = None;
        let r = crate::runner::Report {
            target: "self".into(),
            device: "test".into(),
            cases: vec![flush, unread],
        };
        let j = r.json();
        assert_eq!(j["scenarios"][0]["counters"]["rdma_sends"], 1);
        assert!(j["scenarios"][1].get("counters").is_none());
        let d = report_deltas(&j).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d["qp.err.flushes-work"]["rdma_sends"], 1);
    }

    #[test]
    fn compare_rejects_a_bad_report() {
        let ok = report(json!([]));
        assert!(compare(&json!({}), &ok, &[]).is_err());
        let bad = report(json!([{"id": "s", "counters": {"rdma_sends": "one"}}]));
        assert!(compare(&bad, &ok, &[]).is_err());
        assert_eq!(compare(&ok, &ok, &[]).unwrap().pairs, 0);
    }
}
