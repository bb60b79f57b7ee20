//! `rocemu stats`' endpoint: every running RoCEmu device answers on a Unix stream socket, and
//! the CLI reads them.
//!
//! Where: the directory [`run_dir`] (`$ROCEMU_RUN_DIR`, else `/run/rocemu`), one socket per
//! device named `NAME@PID.sock`, so that a listing knows every device's name and process
//! without connecting, and two processes whose devices share a name are still told apart
//! (`rocemu stats NAME@PID`). A socket whose process is gone (it was killed before it could
//! remove it) is removed by the next listing ([`client::list`]).
//!
//! The protocol, one connection per question: the client sends one JSON line, a
//! [`Request`] (`{"op":"info"}` or `{"op":"stats","qps":true}`), and reads one JSON line back:
//! the [`Identity`] (`device`, `pid`, `datapath`, `address`, `mac`, `protocol`), with `stats`
//! also `counters` (`{name: value}`: the RNIC's, the engine's and the port's, in their
//! `named()` order) and `qps` (one object per live QP, see [`qp_json`]); or `{"error": "…"}`.
//!
//! Invariants:
//! * A device pays nothing while nobody asks: its engine checks one atomic flag per turn
//!   ([`server::Server::pending`]); a question is answered by the engine's own thread between two
//!   turns (the RNIC is never shared), and the JSON is made on the server's thread.
//! * Nothing a client sends stops or slows the device for long: a request is at most
//!   [`MAX_REQUEST`] bytes, a client has [`CLIENT_TIMEOUT`] to send it and to read the answer,
//!   a malformed request gets an error reply, and an engine that does not answer within
//!   [`ENGINE_TIMEOUT`] (stopped, or between turns for long) is reported as such.
//! * The socket goes away with the device ([`server::Server`]'s `Drop`) and, for a device that
//!   lives as long as its process (the drop-in library's), when the process exits normally.
use crate::rnic::{QpInfo, QpState, QpType};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::Duration;

pub mod client;
pub mod server;

/// The protocol's version, in every reply.
pub const PROTOCOL: u64 = 1;
/// The longest request line a device reads (a request is a few dozen bytes).
pub const MAX_REQUEST: usize = 1024;
/// The longest reply line a client reads: every QP of a device (about 400 bytes each) and then
/// some; a device with more QPs than fit is cut by the client with an error, not read forever.
pub const MAX_REPLY: usize = 64 << 20;
/// How long a client has to send its request, and to read the reply.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a device's server waits for its engine to take a snapshot.
pub const ENGINE_TIMEOUT: Duration = Duration::from_secs(2);

/// The directory of the sockets: `$ROCEMU_RUN_DIR`, else `/run/rocemu`.
pub fn run_dir() -> PathBuf {
    match std::env::var_os("ROCEMU_RUN_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from("/run/rocemu"),
    }
}

/// The default name of a device: what `ROCEMU_NAME` says, else `rocemu0`.
pub fn default_name() -> String {
    std::env::var("ROCEMU_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "rocemu0".into())
}

/// Checks a device name: 1 to 63 characters (an `ibv_device` name's room), no `/`, no NUL, no
/// whitespace or control characters (it is a file name and a Prometheus label).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 63
        || name
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "device name {name:?}: 1 to 63 characters, without '/', spaces or control characters"
        ));
    }
    Ok(())
}

/// Who a device is: what a listing shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    /// The port: `af_packet:IFACE`, `dpdk:…`.
    pub datapath: String,
    /// Its address (the GID's IP address).
    pub address: String,
    pub mac: String,
}

impl Identity {
    /// The reply's first keys.
    pub fn to_json(&self, pid: u32) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("device".into(), json!(self.name));
        m.insert("pid".into(), json!(pid));
        m.insert("datapath".into(), json!(self.datapath));
        m.insert("address".into(), json!(self.address));
        m.insert("mac".into(), json!(self.mac));
        m.insert("protocol".into(), json!(PROTOCOL));
        m
    }
}

/// What a client asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// The device's [`Identity`] (answered without the engine).
    Info,
    /// Its counters, and each QP's state and counters when `qps`.
    Stats { qps: bool },
}

impl Request {
    /// The request line (without its newline).
    pub fn to_line(self) -> String {
        match self {
            Request::Info => json!({"op": "info"}).to_string(),
            Request::Stats { qps } => json!({"op": "stats", "qps": qps}).to_string(),
        }
    }

    /// Parses a request line; the error is what the reply says.
    pub fn parse(line: &[u8]) -> Result<Request, String> {
        let v: Value = serde_json::from_slice(line)
            .map_err(|e| format!("a request is one JSON object on one line: {e}"))?;
        let o = v
            .as_object()
            .ok_or("a request is a JSON object: {\"op\": \"info\" | \"stats\"}")?;
        match o.get("op").and_then(Value::as_str) {
            Some("info") => Ok(Request::Info),
            Some("stats") => {
                let qps = match o.get("qps") {
                    None => true,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => return Err("\"qps\" is true or false".into()),
                };
                Ok(Request::Stats { qps })
            }
            Some(op) => Err(format!("unknown op {op:?}: \"info\" or \"stats\"")),
            None => Err("no \"op\": give \"info\" or \"stats\"".into()),
        }
    }
}

/// What the engine's thread hands over: the counters by name, each QP if asked.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub counters: Vec<(&'static str, u64)>,
    pub qps: Vec<QpInfo>,
}

impl Snapshot {
    /// The RNIC's, the engine's and the port's counters, in that order.
    pub fn take(
        rnic: &crate::Rnic,
        engine: &crate::engine::EngineStats,
        port: &crate::port::PortStats,
        qps: bool,
    ) -> Snapshot {
        let mut counters = rnic.counters().named();
        counters.extend(engine.named());
        counters.extend(port.named());
        Snapshot {
            counters,
            qps: if qps { rnic.qp_infos() } else { Vec::new() },
        }
    }

    /// Another shard's part of the same device: counters of the same name summed, its QPs
    /// listed after these.
    pub fn add(&mut self, other: Snapshot) {
        for (n, v) in other.counters {
            match self.counters.iter_mut().find(|(m, _)| *m == n) {
                Some((_, w)) => *w += v,
                None => self.counters.push((n, v)),
            }
        }
        self.qps.extend(other.qps);
    }

    /// The `counters` and `qps` keys of a reply.
    pub fn to_json(&self, into: &mut Map<String, Value>) {
        let mut c = Map::new();
        for (n, v) in &self.counters {
            c.insert((*n).into(), json!(v));
        }
        into.insert("counters".into(), Value::Object(c));
        into.insert(
            "qps".into(),
            Value::Array(self.qps.iter().map(qp_json).collect()),
        );
    }
}

/// A QP type as `ibv_devinfo` and `rdma resource show qp` print it.
pub fn qp_type_name(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "RC",
        QpType::Uc => "UC",
        QpType::Ud => "UD",
    }
}

/// A QP state as `rdma resource show qp` prints it.
pub fn qp_state_name(s: QpState) -> &'static str {
    match s {
        QpState::Reset => "RESET",
        QpState::Init => "INIT",
        QpState::Rtr => "RTR",
        QpState::Rts => "RTS",
        QpState::Sqd => "SQD",
        QpState::Sqe => "SQE",
        QpState::Err => "ERR",
    }
}

/// One QP in a reply: `qpn`, `type`, `state`, `dest_qpn`, `sq_psn`, `acked_psn`, `epsn`,
/// `send_outstanding`, `recv_posted`, `retry_left`, `rnr_retry_left`, `last_error` (the status
/// of its last completion in error, as `WcStatus` names it, or null), `rate_kbps` and `alpha`
/// (its reaction point's current rate and DCQCN's alpha of 1024, or null) and `counters`
/// (`{name: value}`, in `QpCounters::named` order). QPNs and PSNs are numbers.
pub fn qp_json(q: &QpInfo) -> Value {
    let mut c = Map::new();
    for (n, v) in q.counters.named() {
        c.insert(n.into(), json!(v));
    }
    json!({
        "qpn": q.qpn.value(),
        "type": qp_type_name(q.qp_type),
        "state": qp_state_name(q.state),
        "dest_qpn": q.dest_qpn.value(),
        "sq_psn": q.sq_psn.value(),
        "acked_psn": q.acked_psn.value(),
        "epsn": q.epsn.value(),
        "send_outstanding": q.send_outstanding,
        "recv_posted": q.recv_posted,
        "retry_left": q.retry_left,
        "rnr_retry_left": q.rnr_retry_left,
        "last_error": q.last_error.map(|s| format!("{s:?}")),
        "rate_kbps": q.rate_kbps,
        "alpha": q.alpha,
        "counters": c,
    })
}

#[cfg(test)]
mod tests;
