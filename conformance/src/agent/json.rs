//! The agent protocol on the wire: JSON Lines (`docs/agent-protocol.md`).
//!
//! One request object per line, `{"id":7,"op":"create_qp",…}`; one response per request, in
//! order, echoing the id: `{"id":7,"ok":true,"qpn":18}` or `{"id":7,"ok":false,"error":"…"}`.
//! Values are flat: integers (64-bit ones may also be written as `"0x…"` strings, for JSON
//! libraries that hold numbers in doubles), short lower-case names, and bytes as hex strings.
//! Decoding never panics: whatever a line holds, it becomes a request or an error in words.
use super::*;
use serde_json::{json, Map, Value};

type Obj = Map<String, Value>;

fn field<'a>(o: &'a Obj, k: &str) -> Result<&'a Value, String> {
    o.get(k).ok_or_else(|| format!("missing field \"{k}\""))
}

fn as_u64(v: &Value, k: &str) -> Result<u64, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("field \"{k}\": {n} is not an unsigned integer")),
        Value::String(s) => {
            let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(h) => u64::from_str_radix(h, 16),
                None => s.parse(),
            };
            r.map_err(|_| format!("field \"{k}\": \"{s}\" is not an integer"))
        }
        _ => Err(format!("field \"{k}\": expected an integer, got {v}")),
    }
}

fn u64_of(o: &Obj, k: &str) -> Result<u64, String> {
    as_u64(field(o, k)?, k)
}

fn u64_or(o: &Obj, k: &str, default: u64) -> Result<u64, String> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => as_u64(v, k),
    }
}

fn bounded(o: &Obj, k: &str, max: u64) -> Result<u64, String> {
    let v = u64_of(o, k)?;
    if v > max {
        return Err(format!("field \"{k}\": {v} is above {max}"));
    }
    Ok(v)
}

fn u32_of(o: &Obj, k: &str) -> Result<u32, String> {
    bounded(o, k, u32::MAX as u64).map(|v| v as u32)
}

fn u24_of(o: &Obj, k: &str) -> Result<u32, String> {
    bounded(o, k, (1 << 24) - 1).map(|v| v as u32)
}

fn opt<T>(
    o: &Obj,
    k: &str,
    f: impl FnOnce(&Obj, &str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => f(o, k).map(Some),
    }
}

/// An rdma_cm port: 1 … 65535 (port 0 would ask for an ephemeral one, which a listener cannot
/// announce).
fn port_of(o: &Obj, k: &str) -> Result<u16, String> {
    match bounded(o, k, 0xffff)? {
        0 => Err(format!("field \"{k}\": 0 is not a port (1 … 65535)")),
        p => Ok(p as u16),
    }
}

fn u8_of(o: &Obj, k: &str) -> Result<u8, String> {
    bounded(o, k, 255).map(|v| v as u8)
}

fn str_of<'a>(o: &'a Obj, k: &str) -> Result<&'a str, String> {
    field(o, k)?
        .as_str()
        .ok_or_else(|| format!("field \"{k}\": expected a string"))
}

fn bool_or(o: &Obj, k: &str, default: bool) -> Result<bool, String> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(format!("field \"{k}\": expected true or false, got {v}")),
    }
}

fn obj_of<'a>(o: &'a Obj, k: &str) -> Result<&'a Obj, String> {
    field(o, k)?
        .as_object()
        .ok_or_else(|| format!("field \"{k}\": expected an object"))
}

/// Bytes as lower-case hex, two digits each.
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

pub fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return Err(format!("\"{s:.40}\" is not hex (two digits per byte)"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| format!("\"{s:.40}\" is not hex"))
        })
        .collect()
}

fn ip_of(o: &Obj, k: &str) -> Result<IpAddr, String> {
    let s = str_of(o, k)?;
    let ip: IpAddr = s
        .parse()
        .map_err(|_| format!("field \"{k}\": \"{s}\" is not an IP address or GID"))?;
    // A GID written as an IPv4-mapped IPv6 address stands for the IPv4 address.
    Ok(match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    })
}

fn ah_of(o: &Obj) -> Result<Ah, String> {
    Ok(Ah {
        dgid: ip_of(o, "dgid")?,
        sgid_index: u64_or(o, "sgid_index", 0)?.min(255) as u8,
        hop_limit: u64_or(o, "hop_limit", 64)?.min(255) as u8,
        traffic_class: u64_or(o, "traffic_class", 0)?.min(255) as u8,
    })
}

fn ah_json(a: &Ah) -> Value {
    json!({"dgid": a.dgid.to_string(), "sgid_index": a.sgid_index, "hop_limit": a.hop_limit, "traffic_class": a.traffic_class})
}

fn sg_of(o: &Obj) -> Result<Vec<Sge>, String> {
    let Some(v) = o.get("sg") else {
        return Ok(Vec::new());
    };
    let a = v.as_array().ok_or("field \"sg\": expected a list")?;
    a.iter()
        .map(|e| {
            let e = e.as_object().ok_or("field \"sg\": expected objects")?;
            Ok(Sge {
                addr: u64_of(e, "addr")?,
                length: u32_of(e, "length")?,
                lkey: u32_of(e, "lkey")?,
            })
        })
        .collect()
}

fn sg_json(sg: &[Sge]) -> Value {
    sg.iter()
        .map(|s| json!({"addr": s.addr, "length": s.length, "lkey": s.lkey}))
        .collect()
}

fn modify_of(o: &Obj) -> Result<ModifyQp, String> {
    let state = |o: &Obj, k: &str| {
        let s = str_of(o, k)?;
        qp_state_from_name(s).ok_or_else(|| format!("field \"{k}\": unknown QP state \"{s}\""))
    };
    Ok(ModifyQp {
        qp_state: opt(o, "qp_state", state)?,
        dest_qp_num: opt(o, "dest_qp_num", u24_of)?.map(Qpn::new),
        rq_psn: opt(o, "rq_psn", u24_of)?.map(Psn::new),
        sq_psn: opt(o, "sq_psn", u24_of)?.map(Psn::new),
        path_mtu: opt(o, "path_mtu", u32_of)?,
        timeout: opt(o, "timeout", u8_of)?,
        retry_cnt: opt(o, "retry_cnt", u8_of)?,
        rnr_retry: opt(o, "rnr_retry", u8_of)?,
        min_rnr_timer: opt(o, "min_rnr_timer", u8_of)?,
        max_rd_atomic: opt(o, "max_rd_atomic", u8_of)?,
        max_dest_rd_atomic: opt(o, "max_dest_rd_atomic", u8_of)?,
        qp_access_flags: opt(o, "qp_access_flags", u32_of)?.map(Access),
        qkey: opt(o, "qkey", u32_of)?.map(QKey),
        pkey_index: opt(o, "pkey_index", |o, k| bounded(o, k, 0xffff))?.map(|v| v as u16),
        port_num: opt(o, "port_num", u8_of)?,
        ah: match o.get("ah") {
            None | Some(Value::Null) => None,
            Some(_) => Some(ah_of(obj_of(o, "ah")?)?),
        },
    })
}

fn modify_json(m: &ModifyQp, out: &mut Obj) {
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            out.insert(k.into(), v);
        }
    };
    put("qp_state", m.qp_state.map(|s| qp_state_name(s).into()));
    put("dest_qp_num", m.dest_qp_num.map(|q| q.value().into()));
    put("rq_psn", m.rq_psn.map(|p| p.value().into()));
    put("sq_psn", m.sq_psn.map(|p| p.value().into()));
    put("path_mtu", m.path_mtu.map(Into::into));
    put("timeout", m.timeout.map(Into::into));
    put("retry_cnt", m.retry_cnt.map(Into::into));
    put("rnr_retry", m.rnr_retry.map(Into::into));
    put("min_rnr_timer", m.min_rnr_timer.map(Into::into));
    put("max_rd_atomic", m.max_rd_atomic.map(Into::into));
    put("max_dest_rd_atomic", m.max_dest_rd_atomic.map(Into::into));
    put("qp_access_flags", m.qp_access_flags.map(|a| a.0.into()));
    put("qkey", m.qkey.map(|q| q.0.into()));
    put("pkey_index", m.pkey_index.map(Into::into));
    put("port_num", m.port_num.map(Into::into));
    put("ah", m.ah.as_ref().map(ah_json));
}

fn send_wr_of(o: &Obj) -> Result<SendWr, String> {
    let name = str_of(o, "opcode")?;
    let opcode = SendOpcode::from_name(name)
        .ok_or_else(|| format!("field \"opcode\": unknown send opcode \"{name}\""))?;
    let ud = match o.get("ud") {
        None | Some(Value::Null) => None,
        Some(_) => {
            let u = obj_of(o, "ud")?;
            Some(UdDest {
                ah: ah_of(obj_of(u, "ah")?)?,
                remote_qpn: Qpn::new(u24_of(u, "remote_qpn")?),
                remote_qkey: QKey(u32_of(u, "remote_qkey")?),
            })
        }
    };
    Ok(SendWr {
        wr_id: u64_or(o, "wr_id", 0)?,
        opcode,
        sg: sg_of(o)?,
        remote_addr: u64_or(o, "remote_addr", 0)?,
        rkey: RKey(u64_or(o, "rkey", 0)?.min(u32::MAX as u64) as u32),
        imm_data: u64_or(o, "imm_data", 0)?.min(u32::MAX as u64) as u32,
        compare_add: u64_or(o, "compare_add", 0)?,
        swap: u64_or(o, "swap", 0)?,
        signaled: bool_or(o, "signaled", true)?,
        fence: bool_or(o, "fence", false)?,
        ud,
        solicited: bool_or(o, "solicited", false)?,
    })
}

/// A request as its JSON object (without the id).
pub fn request_json(req: &Request) -> Value {
    let mut o = Obj::new();
    o.insert("op".into(), req.op().into());
    let mut put = |k: &str, v: Value| {
        o.insert(k.into(), v);
    };
    match req {
        Request::Hello { version } => put("version", (*version).into()),
        Request::QueryDevice | Request::AllocPd | Request::Reset | Request::CmConnections => {}
        Request::CmListen { port } | Request::CmStop { port } => put("port", (*port).into()),
        Request::CmDisconnect { qpn } => put("qpn", qpn.value().into()),
        Request::DeallocPd { pd } => put("pd", (*pd).into()),
        Request::RegMr { pd, length, access } => {
            put("pd", (*pd).into());
            put("length", (*length).into());
            put("access", access.0.into());
        }
        Request::DeregMr { lkey } => put("lkey", (*lkey).into()),
        Request::WriteMr { lkey, offset, data } => {
            put("lkey", (*lkey).into());
            put("offset", (*offset).into());
            put("data", hex(data).into());
        }
        Request::ReadMr {
            lkey,
            offset,
            length,
        } => {
            put("lkey", (*lkey).into());
            put("offset", (*offset).into());
            put("length", (*length).into());
        }
        Request::CreateCq { cqe } => put("cqe", (*cqe).into()),
        Request::DestroyCq { cq } => put("cq", (*cq).into()),
        Request::CreateQp(i) => {
            put("pd", i.pd.into());
            put("type", qp_type_name(i.qp_type).into());
            put("send_cq", i.send_cq.into());
            put("recv_cq", i.recv_cq.into());
            put("max_send_wr", i.max_send_wr.into());
            put("max_recv_wr", i.max_recv_wr.into());
            put("max_send_sge", i.max_send_sge.into());
            put("max_recv_sge", i.max_recv_sge.into());
            put("max_inline_data", i.max_inline_data.into());
            put("sq_sig_all", i.sq_sig_all.into());
        }
        Request::ModifyQp { qpn, attr } => {
            put("qpn", qpn.value().into());
            modify_json(attr, &mut o);
        }
        Request::QueryQp { qpn } | Request::DestroyQp { qpn } => put("qpn", qpn.value().into()),
        Request::PostSend { qpn, wr } => {
            put("qpn", qpn.value().into());
            put("wr_id", wr.wr_id.into());
            put("opcode", wr.opcode.name().into());
            put("sg", sg_json(&wr.sg));
            put("remote_addr", wr.remote_addr.into());
            put("rkey", wr.rkey.0.into());
            put("imm_data", wr.imm_data.into());
            put("compare_add", wr.compare_add.into());
            put("swap", wr.swap.into());
            put("signaled", wr.signaled.into());
            if wr.fence {
                put("fence", true.into());
            }
            if wr.solicited {
                put("solicited", true.into());
            }
            if let Some(u) = &wr.ud {
                put(
                    "ud",
                    json!({"ah": ah_json(&u.ah), "remote_qpn": u.remote_qpn.value(), "remote_qkey": u.remote_qkey.0}),
                );
            }
        }
        Request::PostRecv { qpn, wr } => {
            put("qpn", qpn.value().into());
            put("wr_id", wr.wr_id.into());
            put("sg", sg_json(&wr.sg));
        }
        Request::PollCq {
            cq,
            max,
            min,
            wait_ms,
        } => {
            put("cq", (*cq).into());
            put("max", (*max).into());
            put("min", (*min).into());
            put("wait_ms", (*wait_ms).into());
        }
    }
    Value::Object(o)
}

/// The request a JSON object stands for.
pub fn request_of(v: &Value) -> Result<Request, String> {
    let o = v.as_object().ok_or("a request is a JSON object")?;
    let op = str_of(o, "op")?;
    Ok(match op {
        "hello" => Request::Hello {
            version: u64_or(o, "version", PROTOCOL_VERSION as u64)?.min(u32::MAX as u64) as u32,
        },
        "query_device" => Request::QueryDevice,
        "alloc_pd" => Request::AllocPd,
        "dealloc_pd" => Request::DeallocPd {
            pd: u32_of(o, "pd")?,
        },
        "reg_mr" => Request::RegMr {
            pd: u32_of(o, "pd")?,
            length: u64_of(o, "length")?,
            access: Access(u32_of(o, "access")?),
        },
        "dereg_mr" => Request::DeregMr {
            lkey: u32_of(o, "lkey")?,
        },
        "write_mr" => Request::WriteMr {
            lkey: u32_of(o, "lkey")?,
            offset: u64_or(o, "offset", 0)?,
            data: unhex(str_of(o, "data")?).map_err(|e| format!("field \"data\": {e}"))?,
        },
        "read_mr" => Request::ReadMr {
            lkey: u32_of(o, "lkey")?,
            offset: u64_or(o, "offset", 0)?,
            length: u64_of(o, "length")?,
        },
        "create_cq" => Request::CreateCq {
            cqe: u32_of(o, "cqe")?,
        },
        "destroy_cq" => Request::DestroyCq {
            cq: u32_of(o, "cq")?,
        },
        "create_qp" => {
            let t = str_of(o, "type")?;
            let cq = u32_of(o, "send_cq")?;
            let get = |k: &str, d: u64| u64_or(o, k, d).map(|v| v.min(u32::MAX as u64) as u32);
            Request::CreateQp(QpInit {
                pd: u32_of(o, "pd")?,
                qp_type: qp_type_from_name(t)
                    .ok_or_else(|| format!("field \"type\": \"{t}\" is not rc, uc or ud"))?,
                send_cq: cq,
                recv_cq: get("recv_cq", cq as u64)?,
                max_send_wr: get("max_send_wr", 16)?,
                max_recv_wr: get("max_recv_wr", 16)?,
                max_send_sge: get("max_send_sge", 1)?,
                max_recv_sge: get("max_recv_sge", 1)?,
                max_inline_data: get("max_inline_data", 0)?,
                sq_sig_all: bool_or(o, "sq_sig_all", false)?,
            })
        }
        "modify_qp" => Request::ModifyQp {
            qpn: Qpn::new(u24_of(o, "qpn")?),
            attr: modify_of(o)?,
        },
        "query_qp" => Request::QueryQp {
            qpn: Qpn::new(u24_of(o, "qpn")?),
        },
        "destroy_qp" => Request::DestroyQp {
            qpn: Qpn::new(u24_of(o, "qpn")?),
        },
        "post_send" => Request::PostSend {
            qpn: Qpn::new(u24_of(o, "qpn")?),
            wr: send_wr_of(o)?,
        },
        "post_recv" => Request::PostRecv {
            qpn: Qpn::new(u24_of(o, "qpn")?),
            wr: RecvWr {
                wr_id: u64_or(o, "wr_id", 0)?,
                sg: sg_of(o)?,
            },
        },
        "poll_cq" => Request::PollCq {
            cq: u32_of(o, "cq")?,
            max: u64_or(o, "max", 16)?.clamp(1, 4096) as u32,
            min: u64_or(o, "min", 1)?.min(4096) as u32,
            wait_ms: u64_or(o, "wait_ms", 0)?.min(60_000),
        },
        "reset" => Request::Reset,
        "cm_listen" => Request::CmListen {
            port: port_of(o, "port")?,
        },
        "cm_connections" => Request::CmConnections,
        "cm_disconnect" => Request::CmDisconnect {
            qpn: Qpn::new(u24_of(o, "qpn")?),
        },
        "cm_stop" => Request::CmStop {
            port: port_of(o, "port")?,
        },
        other => return Err(format!("unknown op \"{other}\"")),
    })
}

fn wc_json(w: &WorkCompletion) -> Value {
    let mut v = json!({
        "wr_id": w.wr_id, "status": w.status, "opcode": w.opcode, "byte_len": w.byte_len,
        "qp_num": w.qp_num.value(), "src_qp": w.src_qp.value(), "wc_flags": w.wc_flags,
    });
    if let (Some(i), Some(o)) = (w.imm_data, v.as_object_mut()) {
        o.insert("imm_data".into(), i.into());
    }
    v
}

fn cm_conn_json(c: &CmConn) -> Value {
    json!({
        "port": c.port, "qpn": c.qpn.value(), "psn": c.psn.value(), "sq_psn": c.sq_psn.value(),
        "remote_qpn": c.remote_qpn.value(), "peer": c.peer.to_string(), "state": c.state.name(),
    })
}

fn cm_conn_of(v: &Value) -> Result<CmConn, String> {
    let o = v.as_object().ok_or("a connection is an object")?;
    let state = str_of(o, "state")?;
    Ok(CmConn {
        port: port_of(o, "port")?,
        qpn: Qpn::new(u24_of(o, "qpn")?),
        psn: Psn::new(u24_of(o, "psn")?),
        sq_psn: Psn::new(u24_of(o, "sq_psn")?),
        remote_qpn: Qpn::new(u24_of(o, "remote_qpn")?),
        peer: ip_of(o, "peer")?,
        state: CmConnState::from_name(state)
            .ok_or_else(|| format!("field \"state\": unknown connection state \"{state}\""))?,
    })
}

fn wc_of(v: &Value) -> Result<WorkCompletion, String> {
    let o = v.as_object().ok_or("a work completion is an object")?;
    Ok(WorkCompletion {
        wr_id: u64_of(o, "wr_id")?,
        status: str_of(o, "status")?.to_string(),
        opcode: str_of(o, "opcode")?.to_string(),
        byte_len: u32_of(o, "byte_len")?,
        imm_data: opt(o, "imm_data", u32_of)?,
        qp_num: Qpn::new(u24_of(o, "qp_num")?),
        src_qp: Qpn::new(u24_of(o, "src_qp")?),
        wc_flags: u64_or(o, "wc_flags", 0)? as u32,
    })
}

/// The fields of a successful reply (without `id` and `ok`).
pub fn reply_fields(r: &Reply) -> Obj {
    let v = match r {
        Reply::Hello(h) => json!({"version": h.version, "agent": h.agent}),
        Reply::Device(d) => json!({
            "mac": d.mac.to_string(),
            "gids": d.gids.iter().map(|g| g.to_string()).collect::<Vec<_>>(),
            "active_mtu": d.active_mtu,
            "name": d.name,
            "caps": d.caps,
        }),
        Reply::Pd(p) => json!({ "pd": p }),
        Reply::Mr(m) => {
            json!({"addr": m.addr, "length": m.length, "lkey": m.lkey, "rkey": m.rkey.0})
        }
        Reply::Data(d) => json!({ "data": hex(d) }),
        Reply::Cq(c) => json!({ "cq": c }),
        Reply::Qp(q) => json!({ "qpn": q.value() }),
        Reply::QpAttr(a) => json!({
            "qp_state": qp_state_name(a.qp_state),
            "dest_qp_num": a.dest_qp_num.value(),
            "rq_psn": a.rq_psn.value(),
            "sq_psn": a.sq_psn.value(),
            "path_mtu": a.path_mtu,
            "qkey": a.qkey.0,
            "qp_access_flags": a.qp_access_flags.0,
            "min_rnr_timer": a.min_rnr_timer,
            "timeout": a.timeout,
            "retry_cnt": a.retry_cnt,
            "rnr_retry": a.rnr_retry,
            "max_rd_atomic": a.max_rd_atomic,
            "max_dest_rd_atomic": a.max_dest_rd_atomic,
        }),
        Reply::Wcs(w) => json!({ "wcs": w.iter().map(wc_json).collect::<Vec<_>>() }),
        Reply::CmConns(c) => {
            json!({ "connections": c.iter().map(cm_conn_json).collect::<Vec<_>>() })
        }
        Reply::Done => json!({}),
    };
    match v {
        Value::Object(o) => o,
        _ => Obj::new(),
    }
}

/// The reply a response object stands for, given the operation it answers.
pub fn reply_of(op: &str, v: &Value) -> AgentResult<Reply> {
    let o = v.as_object().ok_or("a response is a JSON object")?;
    match o.get("ok") {
        Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            let e = o
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("(no error message)");
            return Err(AgentError(format!("{op}: {e}")));
        }
        _ => return Err(AgentError(format!("{op}: response without \"ok\": {v}"))),
    }
    let r = (|| -> Result<Reply, String> {
        Ok(match op {
            "hello" => Reply::Hello(Hello {
                version: u32_of(o, "version")?,
                agent: str_of(o, "agent").unwrap_or("?").to_string(),
            }),
            "query_device" => {
                let mac = str_of(o, "mac")?;
                let gids = field(o, "gids")?
                    .as_array()
                    .ok_or("field \"gids\": expected a list")?
                    .iter()
                    .map(|g| {
                        let mut m = Obj::new();
                        m.insert("gid".into(), g.clone());
                        ip_of(&m, "gid")
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Reply::Device(DeviceInfo {
                    mac: mac
                        .parse()
                        .map_err(|_| format!("field \"mac\": \"{mac}\" is not a MAC"))?,
                    gids,
                    active_mtu: u32_of(o, "active_mtu")?,
                    name: str_of(o, "name").unwrap_or("").to_string(),
                    // Optional (an older agent says nothing: no optional feature).
                    caps: o
                        .get("caps")
                        .and_then(|c| c.as_array())
                        .map(|a| {
                            a.iter()
                                .filter_map(|c| c.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default(),
                })
            }
            "alloc_pd" => Reply::Pd(u32_of(o, "pd")?),
            "reg_mr" => Reply::Mr(MrInfo {
                addr: u64_of(o, "addr")?,
                length: u64_of(o, "length")?,
                lkey: u32_of(o, "lkey")?,
                rkey: RKey(u32_of(o, "rkey")?),
            }),
            "read_mr" => Reply::Data(unhex(str_of(o, "data")?)?),
            "create_cq" => Reply::Cq(u32_of(o, "cq")?),
            "create_qp" => Reply::Qp(Qpn::new(u24_of(o, "qpn")?)),
            "query_qp" => {
                let s = str_of(o, "qp_state")?;
                Reply::QpAttr(QpInfo {
                    qp_state: qp_state_from_name(s)
                        .ok_or_else(|| format!("unknown QP state \"{s}\""))?,
                    dest_qp_num: Qpn::new(u24_of(o, "dest_qp_num")?),
                    rq_psn: Psn::new(u24_of(o, "rq_psn")?),
                    sq_psn: Psn::new(u24_of(o, "sq_psn")?),
                    path_mtu: u32_of(o, "path_mtu")?,
                    qkey: QKey(u32_of(o, "qkey")?),
                    qp_access_flags: Access(u32_of(o, "qp_access_flags")?),
                    min_rnr_timer: u8_of(o, "min_rnr_timer")?,
                    timeout: u8_of(o, "timeout")?,
                    retry_cnt: u8_of(o, "retry_cnt")?,
                    rnr_retry: u8_of(o, "rnr_retry")?,
                    max_rd_atomic: u8_of(o, "max_rd_atomic")?,
                    max_dest_rd_atomic: u8_of(o, "max_dest_rd_atomic")?,
                })
            }
            "poll_cq" => Reply::Wcs(
                field(o, "wcs")?
                    .as_array()
                    .ok_or("field \"wcs\": expected a list")?
                    .iter()
                    .map(wc_of)
                    .collect::<Result<_, _>>()?,
            ),
            "cm_connections" => Reply::CmConns(
                field(o, "connections")?
                    .as_array()
                    .ok_or("field \"connections\": expected a list")?
                    .iter()
                    .map(cm_conn_of)
                    .collect::<Result<_, _>>()?,
            ),
            _ => Reply::Done,
        })
    })();
    r.map_err(|e| AgentError(format!("{op}: bad response: {e}")))
}

/// A whole response line's object: `{"id":…,"ok":true,…}` or `{"id":…,"ok":false,"error":…}`.
pub fn response_json(id: Value, r: &AgentResult<Reply>) -> Value {
    let mut o = Obj::new();
    o.insert("id".into(), id);
    match r {
        Ok(reply) => {
            o.insert("ok".into(), true.into());
            o.extend(reply_fields(reply));
        }
        Err(e) => {
            o.insert("ok".into(), false.into());
            o.insert("error".into(), e.0.clone().into());
        }
    }
    Value::Object(o)
}

/// Parses one request line into its id (null when absent or unreadable) and the request.
pub fn parse_line(line: &str) -> (Value, Result<Request, String>) {
    match serde_json::from_str::<Value>(line) {
        Ok(v) => {
            let id = v.get("id").cloned().unwrap_or(Value::Null);
            (id, request_of(&v))
        }
        Err(e) => (Value::Null, Err(format!("not a JSON object: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemu_emulator::rnic::{QpState, QpType};

    fn every_request() -> Vec<Request> {
        let sg = vec![Sge {
            addr: 0x7f00_0000_1000,
            length: 64,
            lkey: 0xdead_beef,
        }];
        let ah = Ah {
            dgid: "fd00::2".parse().unwrap_or(IpAddr::from([10, 0, 0, 2])),
            sgid_index: 1,
            hop_limit: 32,
            traffic_class: 4,
        };
        let mut wr = SendWr::new(u64::MAX, SendOpcode::AtomicCmpSwp, sg.clone());
        wr.remote_addr = u64::MAX - 7;
        wr.rkey = RKey(0xffff_ffff);
        wr.compare_add = 1 << 63;
        wr.swap = 5;
        wr.signaled = false;
        wr.fence = true;
        wr.ud = Some(UdDest {
            ah,
            remote_qpn: Qpn::new(0xff_ffff),
            remote_qkey: QKey(0x8001_0000),
        });
        vec![
            Request::Hello { version: 1 },
            Request::QueryDevice,
            Request::AllocPd,
            Request::DeallocPd { pd: 3 },
            Request::RegMr {
                pd: 1,
                length: 1 << 20,
                access: Access(15),
            },
            Request::DeregMr { lkey: 9 },
            Request::WriteMr {
                lkey: 9,
                offset: 4,
                data: vec![0, 1, 0xfe, 0xff],
            },
            Request::ReadMr {
                lkey: 9,
                offset: 4,
                length: 4,
            },
            Request::CreateCq { cqe: 64 },
            Request::DestroyCq { cq: 2 },
            Request::CreateQp(QpInit::new(1, QpType::Ud, 2)),
            Request::ModifyQp {
                qpn: Qpn::new(0x12_3456),
                attr: ModifyQp {
                    qp_state: Some(QpState::Rtr),
                    dest_qp_num: Some(Qpn::new(7)),
                    rq_psn: Some(Psn::new(0xff_ffff)),
                    path_mtu: Some(4096),
                    min_rnr_timer: Some(31),
                    qp_access_flags: Some(Access(6)),
                    ah: Some(ah),
                    ..Default::default()
                },
            },
            Request::QueryQp { qpn: Qpn::new(5) },
            Request::DestroyQp { qpn: Qpn::new(5) },
            Request::PostSend {
                qpn: Qpn::new(5),
                wr: wr.clone(),
            },
            Request::PostSend {
                qpn: Qpn::new(6),
                wr: SendWr {
                    solicited: true,
                    ..wr
                },
            },
            Request::PostRecv {
                qpn: Qpn::new(5),
                wr: RecvWr { wr_id: 8, sg },
            },
            Request::PollCq {
                cq: 2,
                max: 16,
                min: 3,
                wait_ms: 250,
            },
            Request::Reset,
            Request::CmListen { port: 65535 },
            Request::CmConnections,
            Request::CmDisconnect {
                qpn: Qpn::new(0xab_cdef),
            },
            Request::CmStop { port: 1 },
        ]
    }

    #[test]
    fn every_request_survives_the_wire() {
        for r in every_request() {
            let line = request_json(&r).to_string();
            let (_, back) = parse_line(&line);
            assert_eq!(back.as_ref(), Ok(&r), "{line}");
        }
    }

    #[test]
    fn replies_survive_the_wire() {
        let wc = WorkCompletion {
            wr_id: 1,
            status: "IBV_WC_REM_ACCESS_ERR".into(),
            opcode: "IBV_WC_RDMA_WRITE".into(),
            byte_len: 0,
            imm_data: Some(0xcafe),
            qp_num: Qpn::new(9),
            src_qp: Qpn::new(10),
            wc_flags: 2,
        };
        for (op, r) in [
            ("poll_cq", Reply::Wcs(vec![wc])),
            (
                "reg_mr",
                Reply::Mr(MrInfo {
                    addr: u64::MAX,
                    length: 4096,
                    lkey: 1,
                    rkey: RKey(2),
                }),
            ),
            ("read_mr", Reply::Data(vec![1, 2, 3])),
            ("create_qp", Reply::Qp(Qpn::new(0xab_cdef))),
            ("modify_qp", Reply::Done),
            (
                "cm_connections",
                Reply::CmConns(vec![CmConn {
                    port: 7471,
                    qpn: Qpn::new(0x12_3456),
                    psn: Psn::new(0xff_ffff),
                    sq_psn: Psn::new(0),
                    remote_qpn: Qpn::new(0x11),
                    peer: "fd00::2".parse().unwrap_or(IpAddr::from([10, 0, 0, 2])),
                    state: CmConnState::Disconnected,
                }]),
            ),
            ("cm_listen", Reply::Done),
        ] {
            let v = response_json(Value::from(4), &Ok(r.clone()));
            assert_eq!(reply_of(op, &v), Ok(r));
        }
        let e = response_json(Value::from(5), &Err(AgentError("no".into())));
        assert_eq!(
            reply_of("alloc_pd", &e),
            Err(AgentError("alloc_pd: no".into()))
        );
    }

    #[test]
    fn bad_values_are_errors_not_panics() {
        for line in [
            "",
            "[]",
            "{}",
            r#"{"op":7}"#,
            r#"{"op":"create_qp","pd":1,"type":"xrc","send_cq":1}"#,
            r#"{"op":"modify_qp","qpn":16777216}"#,
            r#"{"op":"modify_qp","qpn":1,"qp_state":"flying"}"#,
            r#"{"op":"reg_mr","pd":-1,"length":1,"access":1}"#,
            r#"{"op":"reg_mr","pd":1,"length":"0xzz","access":1}"#,
            r#"{"op":"write_mr","lkey":1,"data":"abc"}"#,
            r#"{"op":"write_mr","lkey":1,"data":"é1"}"#,
            r#"{"op":"post_send","qpn":1,"opcode":"fly"}"#,
            r#"{"op":"post_send","qpn":1,"opcode":"send","sg":[{"addr":1}]}"#,
            r#"{"op":"modify_qp","qpn":1,"ah":{"dgid":"nowhere"}}"#,
            r#"{"op":"cm_listen"}"#,
            r#"{"op":"cm_listen","port":0}"#,
            r#"{"op":"cm_listen","port":65536}"#,
            r#"{"op":"cm_listen","port":"seven"}"#,
            r#"{"op":"cm_stop","port":-1}"#,
            r#"{"op":"cm_disconnect","qpn":16777216}"#,
        ] {
            assert!(parse_line(line).1.is_err(), "{line} was taken");
        }
        // 64-bit values may come as hex strings.
        let (_, r) = parse_line(r#"{"op":"read_mr","lkey":"0xff","offset":"16","length":4}"#);
        assert_eq!(
            r,
            Ok(Request::ReadMr {
                lkey: 255,
                offset: 16,
                length: 4
            })
        );
    }
}
