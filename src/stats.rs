//! `rocemu stats [NAME] [--qp] [--json] [--watch SECS] [--prometheus] [--listen ADDR]`
//! (contract: shared/contracts.md): the running devices, and one device's counters as
//! `rdma statistic show` prints them, per QP, as rates, as JSON or in the Prometheus text
//! exposition format (also served on HTTP for a scraper). The sockets and their protocol are
//! `rocemu_emulator::stats`'.
use rocemu_emulator::stats::client::{self, AskError, Entry};
use rocemu_emulator::stats::{run_dir, Request};
use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Devices answer on sockets NAME@PID.sock in /run/rocemu (or $ROCEMU_RUN_DIR). \
A NAME that two running devices share is ambiguous: give NAME@PID, as the listing shows it."
)]
pub struct Args {
    /// The device: its name, or NAME@PID. Without it: one line per running device.
    name: Option<String>,
    /// Each QP's state and counters too.
    #[arg(long)]
    qp: bool,
    /// One JSON object (with NAME: {"device", "counters", "qps", ...}; without: an array of
    /// devices). The object always has "qps".
    #[arg(long)]
    json: bool,
    /// Print the counters' rates (per second) every SECS seconds, until interrupted.
    #[arg(short = 'w', long, value_name = "SECS")]
    watch: Option<f64>,
    /// With --watch: stop after N reports.
    #[arg(short = 'c', long, value_name = "N", requires = "watch")]
    count: Option<u64>,
    /// The Prometheus text exposition format: rocemu_COUNTER{device="NAME",pid="PID"}
    /// (with --qp also rocemu_qp_COUNTER and QP gauges, labelled by qpn). Without NAME:
    /// every running device.
    #[arg(long, conflicts_with_all = ["json", "watch"])]
    prometheus: bool,
    /// Serve the Prometheus format on HTTP GET /metrics at ADDR (e.g. 127.0.0.1:9464) until
    /// killed: of NAME, or of every running device.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["json", "watch"])]
    listen: Option<String>,
    /// With --listen: accept an address other than loopback.
    #[arg(long, requires = "listen")]
    allow_remote: bool,
}

impl Args {
    /// It serves HTTP (`--listen`): a scraper going away must not end it.
    pub fn serves(&self) -> bool {
        self.listen.is_some()
    }
}

pub fn run(a: &Args) -> Res<ExitCode> {
    let dir = run_dir();
    if let Some(addr) = &a.listen {
        return serve_http(a, &dir, addr);
    }
    if let Some(w) = a.watch {
        if !(w > 0.0 && w <= 86400.0) {
            return Err(format!("--watch {w}: between 0 and 86400 seconds").into());
        }
    }
    let Some(name) = &a.name else {
        if a.watch.is_some() {
            return Err("--watch needs a device: rocemu stats NAME --watch SECS".into());
        }
        if a.prometheus {
            print!("{}", prometheus(&all_stats(&dir, a.qp)?, a.qp));
            return Ok(ExitCode::SUCCESS);
        }
        return list(&dir, a.json);
    };
    let entries = client::list(&dir)?;
    let e = client::find(&entries, name, &dir)?.clone();
    if let Some(secs) = a.watch {
        return watch(a, &e, Duration::from_secs_f64(secs));
    }
    let v = stats_of(&e, true)?;
    if a.json {
        println!("{v}");
    } else if a.prometheus {
        print!("{}", prometheus(&[v], a.qp));
    } else {
        print!("{}", text(&v, a.qp));
    }
    Ok(ExitCode::SUCCESS)
}

/// One device's stats, or an error that names it.
fn stats_of(e: &Entry, qps: bool) -> Result<Value, String> {
    client::ask(&e.path, Request::Stats { qps }).map_err(|err| match err {
        AskError::Refused => format!(
            "{}: its socket refused the connection: the process is gone (socket removed)",
            e.id()
        ),
        err => format!("{}: {err}", e.id()),
    })
}

/// Every running device's stats (those that do not answer are left out, said on stderr).
fn all_stats(dir: &Path, qps: bool) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for e in client::list(dir)? {
        match client::ask(&e.path, Request::Stats { qps }) {
            Ok(v) => out.push(v),
            Err(AskError::Refused) => {}
            Err(err) => eprintln!("rocemu stats: {}: {err}", e.id()),
        }
    }
    Ok(out)
}

fn list(dir: &Path, json_out: bool) -> Res<ExitCode> {
    let mut rows = Vec::new();
    for e in client::list(dir)? {
        let (datapath, address) = match client::ask(&e.path, Request::Info) {
            Ok(v) => (str_of(&v, "datapath"), str_of(&v, "address")),
            Err(AskError::Refused) => continue,
            Err(err) => ("?".to_string(), format!("(not answering: {err})")),
        };
        rows.push((e, datapath, address));
    }
    if json_out {
        let a: Vec<Value> = rows
            .iter()
            .map(|(e, d, ad)| json!({"device": e.name, "pid": e.pid, "datapath": d, "address": ad}))
            .collect();
        println!("{}", Value::Array(a));
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        eprintln!(
            "rocemu stats: no RoCEmu device is running (no socket in {})",
            dir.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let w = rows
        .iter()
        .map(|(e, ..)| e.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let wd = rows
        .iter()
        .map(|(_, d, _)| d.len())
        .max()
        .unwrap_or(8)
        .max(8);
    println!("{:<w$}  {:>7}  {:<wd$}  ADDRESS", "NAME", "PID", "DATAPATH");
    for (e, d, ad) in &rows {
        println!("{:<w$}  {:>7}  {:<wd$}  {ad}", e.name, e.pid, d);
    }
    Ok(ExitCode::SUCCESS)
}

fn str_of(v: &Value, k: &str) -> String {
    v.get(k)
        .map(|x| {
            x.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| x.to_string())
        })
        .unwrap_or_else(|| "?".into())
}

fn u64_of(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// The reply's counters, in its order.
fn counters(v: &Value) -> Vec<(String, u64)> {
    v.get("counters")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, x)| (k.clone(), x.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

fn qps_of(v: &Value) -> &[Value] {
    v.get("qps")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn heading(v: &Value) -> String {
    format!(
        "{}@{} {} {} {}",
        str_of(v, "device"),
        u64_of(v, "pid"),
        str_of(v, "datapath"),
        str_of(v, "address"),
        str_of(v, "mac")
    )
}

/// `name value` per line (a heading first), then with `qp` the QP table.
fn text(v: &Value, qp: bool) -> String {
    let mut s = heading(v);
    s.push('\n');
    for (n, x) in counters(v) {
        let _ = writeln!(s, "{n} {x}");
    }
    if qp {
        s.push('\n');
        s.push_str(&qp_table(qps_of(v), None));
    }
    s
}

/// The QPs as a table; with `rates`, each counter as a rate against the earlier reply's QPs
/// over that many seconds.
fn qp_table(qps: &[Value], rates: Option<(&[Value], f64)>) -> String {
    let cnames: Vec<String> = qps
        .first()
        .and_then(|q| q.get("counters"))
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let mut s = String::new();
    let _ = write!(
        s,
        "{:<8} {:<4} {:<5} {:<8} {:<8} {:<8} {:>5} {:>5} {:>9} {:>5} {:<14}",
        "QPN",
        "TYPE",
        "STATE",
        "DEST_QPN",
        "SQ_PSN",
        "EPSN",
        "OUTST",
        "RETRY",
        "RATE_MBPS",
        "ALPHA",
        "LAST_ERROR"
    );
    for c in &cnames {
        let _ = write!(s, " {:>w$}", c, w = c.len().max(10));
    }
    s.push('\n');
    for q in qps {
        let last = q
            .get("last_error")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string();
        let _ = write!(
            s,
            "{:<8} {:<4} {:<5} {:<8} {:<8} {:<8} {:>5} {:>5} {:>9} {:>5} {:<14}",
            format!("{:#08x}", u64_of(q, "qpn")),
            str_of(q, "type"),
            str_of(q, "state"),
            format!("{:#08x}", u64_of(q, "dest_qpn")),
            format!("{:#08x}", u64_of(q, "sq_psn")),
            format!("{:#08x}", u64_of(q, "epsn")),
            u64_of(q, "send_outstanding"),
            format!(
                "{}/{}",
                u64_of(q, "retry_left"),
                u64_of(q, "rnr_retry_left")
            ),
            q.get("rate_kbps")
                .and_then(Value::as_u64)
                .map_or("-".to_string(), |k| format!("{:.1}", k as f64 / 1000.0)),
            q.get("alpha")
                .and_then(Value::as_u64)
                .map_or("-".to_string(), |a| a.to_string()),
            last
        );
        let before = rates.and_then(|(old, _)| old.iter().find(|o| o.get("qpn") == q.get("qpn")));
        for c in &cnames {
            let now = q["counters"].get(c).and_then(Value::as_u64).unwrap_or(0);
            let w = c.len().max(10);
            match rates {
                Some((_, secs)) => {
                    let then = before
                        .and_then(|b| b["counters"].get(c))
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    let _ = write!(s, " {:>w$.1}", now.saturating_sub(then) as f64 / secs);
                }
                None => {
                    let _ = write!(s, " {now:>w$}");
                }
            }
        }
        s.push('\n');
    }
    s
}

/// Reprints the rates every `every` until interrupted (or `--count` reports).
fn watch(a: &Args, e: &Entry, every: Duration) -> Res<ExitCode> {
    let mut before = stats_of(e, a.qp)?;
    let mut t0 = Instant::now();
    let mut n = 0u64;
    while a.count.is_none_or(|c| n < c) {
        std::thread::sleep(every);
        let now = stats_of(e, a.qp)?;
        let t1 = Instant::now();
        let secs = (t1 - t0).as_secs_f64().max(1e-9);
        let old: std::collections::HashMap<String, u64> = counters(&before).into_iter().collect();
        let cur = counters(&now);
        let rate = |name: &str, x: u64| {
            x.saturating_sub(old.get(name).copied().unwrap_or(0)) as f64 / secs
        };
        let mut out = String::new();
        if a.json {
            let mut rates = Map::new();
            let mut totals = Map::new();
            for (name, x) in &cur {
                rates.insert(name.clone(), json!(rate(name, *x)));
                totals.insert(name.clone(), json!(x));
            }
            let o = json!({"device": str_of(&now, "device"), "pid": u64_of(&now, "pid"),
                "interval_s": secs, "counters": totals, "rates": rates});
            let _ = writeln!(out, "{o}");
        } else {
            let _ = writeln!(out, "{} (rates over {secs:.2} s)", heading(&now));
            for (name, x) in &cur {
                let _ = writeln!(out, "{name} {x} {:.1}/s", rate(name, *x));
            }
            if a.qp {
                out.push('\n');
                out.push_str(&qp_table(qps_of(&now), Some((qps_of(&before), secs))));
            }
            out.push('\n');
        }
        let mut so = std::io::stdout().lock();
        so.write_all(out.as_bytes())?;
        so.flush()?;
        before = now;
        t0 = t1;
        n += 1;
    }
    Ok(ExitCode::SUCCESS)
}

/// A Prometheus metric name from ours: `rocemu_` and the name, with anything outside
/// `[a-zA-Z0-9_]` made `_`.
fn metric(prefix: &str, name: &str) -> String {
    let mut m = String::from(prefix);
    m.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        }
    }));
    m
}

/// A label value, escaped as the text format wants (backslash, double quote, newline).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One metric family: its HELP and TYPE, then its samples (labels, value).
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, String)]) {
    if samples.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    }
}

/// The Prometheus text exposition format (version 0.0.4) of the devices' replies.
fn prometheus(devs: &[Value], qp: bool) -> String {
    let dev_labels = |v: &Value| {
        format!(
            "device=\"{}\",pid=\"{}\"",
            label(&str_of(v, "device")),
            u64_of(v, "pid")
        )
    };
    // Families in the first device's order, then any name only a later one has.
    let mut names: Vec<String> = Vec::new();
    for v in devs {
        for (n, _) in counters(v) {
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    let mut out = String::new();
    for n in &names {
        let samples: Vec<(String, String)> = devs
            .iter()
            .filter_map(|v| {
                let x = v.get("counters")?.get(n)?.as_u64()?;
                Some((dev_labels(v), x.to_string()))
            })
            .collect();
        family(
            &mut out,
            &metric("rocemu_", n),
            "counter",
            &format!("RoCEmu device counter {n}."),
            &samples,
        );
    }
    if !qp {
        return out;
    }
    let qp_labels =
        |v: &Value, q: &Value| format!("{},qpn=\"{:#08x}\"", dev_labels(v), u64_of(q, "qpn"));
    let mut cnames: Vec<String> = Vec::new();
    for v in devs {
        for q in qps_of(v) {
            for k in q
                .get("counters")
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(|m| m.keys())
            {
                if !cnames.contains(k) {
                    cnames.push(k.clone());
                }
            }
        }
    }
    let per_qp = |f: &dyn Fn(&Value) -> Option<String>| -> Vec<(String, String)> {
        devs.iter()
            .flat_map(|v| qps_of(v).iter().map(move |q| (v, q)))
            .filter_map(|(v, q)| Some((qp_labels(v, q), f(q)?)))
            .collect()
    };
    for c in &cnames {
        let s = per_qp(&|q| Some(q.get("counters")?.get(c)?.as_u64()?.to_string()));
        family(
            &mut out,
            &metric("rocemu_qp_", c),
            "counter",
            &format!("RoCEmu QP counter {c}."),
            &s,
        );
    }
    for (k, help) in [
        (
            "send_outstanding",
            "Send work requests posted and not yet completed.",
        ),
        (
            "recv_posted",
            "Receive work requests posted on the QP's own receive queue.",
        ),
        ("retry_left", "Transport retries left (retry_cnt)."),
        ("rnr_retry_left", "RNR retries left (rnr_retry)."),
        ("sq_psn", "The next PSN the requester sends."),
        ("epsn", "The responder's expected PSN."),
        (
            "rate_kbps",
            "The QP's reaction point's current rate in kb/s (QPs with one only).",
        ),
        ("alpha", "DCQCN's alpha, of 1024 (QPs under DCQCN only)."),
    ] {
        let s = per_qp(&|q| Some(q.get(k)?.as_u64()?.to_string()));
        family(&mut out, &metric("rocemu_qp_", k), "gauge", help, &s);
    }
    let info: Vec<(String, String)> = devs
        .iter()
        .flat_map(|v| qps_of(v).iter().map(move |q| (v, q)))
        .map(|(v, q)| {
            (
                format!(
                    "{},type=\"{}\",state=\"{}\",dest_qpn=\"{:#08x}\",last_error=\"{}\"",
                    qp_labels(v, q),
                    label(&str_of(q, "type")),
                    label(&str_of(q, "state")),
                    u64_of(q, "dest_qpn"),
                    label(q.get("last_error").and_then(Value::as_str).unwrap_or(""))
                ),
                "1".to_string(),
            )
        })
        .collect();
    family(
        &mut out,
        "rocemu_qp_info",
        "gauge",
        "A live QP: its type, state, peer and last error as labels.",
        &info,
    );
    out
}

/// `--listen`: the Prometheus format on HTTP/1.1 GET /metrics, one connection at a time, each
/// bounded in size and time.
fn serve_http(a: &Args, dir: &Path, addr: &str) -> Res<ExitCode> {
    let l = TcpListener::bind(addr).map_err(|e| format!("--listen {addr}: {e}"))?;
    let local = l.local_addr()?;
    if !local.ip().is_loopback() && !a.allow_remote {
        return Err(format!(
            "--listen {addr}: not a loopback address; add --allow-remote to serve other hosts"
        )
        .into());
    }
    eprintln!(
        "rocemu stats: serving http://{local}/metrics ({})",
        a.name.as_deref().unwrap_or("every running device")
    );
    for s in l.incoming() {
        match s {
            Ok(s) => {
                if let Err(e) = answer_http(a, dir, s) {
                    eprintln!("rocemu stats: http: {e}");
                }
            }
            Err(e) => {
                eprintln!("rocemu stats: accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The longest request head read.
const HTTP_HEAD_MAX: usize = 8192;

fn answer_http(a: &Args, dir: &Path, mut s: TcpStream) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    let complete = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || head.len() > HTTP_HEAD_MAX {
            break false;
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut chunk) {
            Ok(0) => break false,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break false,
        }
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            break true;
        }
    };
    let line = String::from_utf8_lossy(head.split(|&b| b == b'\n').next().unwrap_or(&[]))
        .trim_end()
        .to_string();
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = if !complete {
        (
            "400 Bad Request",
            "text/plain",
            "a request head within 2 s and 8 KiB\n".to_string(),
        )
    } else if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".to_string(),
        )
    } else if path == "/metrics" {
        match metrics_body(a, dir) {
            Ok(b) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", b),
            Err(e) => ("503 Service Unavailable", "text/plain", format!("{e}\n")),
        }
    } else if path == "/" {
        (
            "200 OK",
            "text/plain",
            "rocemu stats: the metrics are at /metrics\n".to_string(),
        )
    } else {
        (
            "404 Not Found",
            "text/plain",
            "not found: GET /metrics\n".to_string(),
        )
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
        body.len(),
        if status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" }
    );
    if method != "HEAD" {
        resp.push_str(&body);
    }
    s.write_all(resp.as_bytes())?;
    s.flush()
}

fn metrics_body(a: &Args, dir: &Path) -> Result<String, String> {
    let devs = match &a.name {
        Some(n) => {
            let entries = client::list(dir)?;
            vec![stats_of(client::find(&entries, n, dir)?, a.qp)?]
        }
        None => all_stats(dir, a.qp)?,
    };
    Ok(prometheus(&devs, a.qp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply() -> Value {
        json!({"device": "d\"x", "pid": 7, "datapath": "af_packet:v0", "address": "10.0.0.1",
            "mac": "02:00:00:00:00:01",
            "counters": {"sent_pkts": 5, "rcvd_pkts": 3, "port_rx_frames": 9},
            "qps": [{"qpn": 17, "type": "RC", "state": "RTS", "dest_qpn": 18, "sq_psn": 100,
                "acked_psn": 99, "epsn": 7, "send_outstanding": 2, "recv_posted": 0,
                "retry_left": 7, "rnr_retry_left": 6, "last_error": "RetryExcErr",
                "rate_kbps": 5004883, "alpha": 1023, "counters": {"sent_pkts": 4}}]})
    }

    #[test]
    fn text_is_name_value_lines_and_a_qp_table() {
        let t = text(&reply(), true);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "d\"x@7 af_packet:v0 10.0.0.1 02:00:00:00:00:01");
        assert_eq!(
            &lines[1..4],
            ["sent_pkts 5", "rcvd_pkts 3", "port_rx_frames 9"]
        );
        assert!(lines[5].starts_with("QPN      TYPE STATE"), "{t}");
        assert!(
            lines[6].starts_with(
                "0x000011 RC   RTS   0x000012 0x000064 0x000007     2   7/6    5004.9  1023 RetryExcErr"
            ),
            "{t}"
        );
    }

    #[test]
    fn prometheus_has_types_labels_and_escapes() {
        let p = prometheus(&[reply()], true);
        assert!(p.contains("# TYPE rocemu_sent_pkts counter\nrocemu_sent_pkts{device=\"d\\\"x\",pid=\"7\"} 5\n"), "{p}");
        assert!(
            p.contains("rocemu_qp_sent_pkts{device=\"d\\\"x\",pid=\"7\",qpn=\"0x000011\"} 4"),
            "{p}"
        );
        assert!(p.contains("# TYPE rocemu_qp_info gauge"), "{p}");
        assert!(
            p.contains("rocemu_qp_rate_kbps{device=\"d\\\"x\",pid=\"7\",qpn=\"0x000011\"} 5004883"),
            "{p}"
        );
        assert!(p.contains("rocemu_qp_alpha{"), "{p}");
        assert!(p.contains("state=\"RTS\""), "{p}");
        // Without --qp: no QP families.
        assert!(!prometheus(&[reply()], false).contains("rocemu_qp_"));
        assert_eq!(metric("rocemu_", "a.b-c"), "rocemu_a_b_c");
    }
}
