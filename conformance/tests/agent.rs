//! The agent protocol end to end: hand-written JSON lines over a Unix socket (malformed ones
//! get an error response, never a dropped connection or a crash), and scenarios run through
//! the JSON client against RoCEmu on an engine and an in-memory port, in real time — the path
//! `rocemu conformance --target agent:…` takes against `rocemu agent`.
use rocemu_conformance::agent::server::{serve, EngineBackend, Listener, NullBackend};
use rocemu_conformance::dut::{PortLink, DUT_IP, DUT_MAC, PEER_IP, PEER_MAC};
use rocemu_conformance::runner::{AgentTarget, CaseResult};
use rocemu_conformance::scenarios::select;
use rocemu_emulator::engine::Engine;
use rocemu_emulator::port::pipe::pipe;
use rocemu_emulator::port::Port;
use rocemu_emulator::rnic::{Rnic, RnicConfig};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn socket_path(name: &str) -> String {
    let dir = std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into());
    format!(
        "{dir}/rocemu-conformance-{name}-{}.sock",
        std::process::id()
    )
}

/// Sends one line, returns the response object.
fn ask(w: &mut UnixStream, r: &mut BufReader<UnixStream>, line: &str) -> Value {
    writeln!(w, "{line}").unwrap();
    let mut s = String::new();
    r.read_line(&mut s).unwrap();
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("response {s:?} is not JSON: {e}"))
}

#[test]
fn hand_written_lines_get_one_response_each() {
    let path = socket_path("lines");
    let listener = Listener::bind(&format!("unix:{path}")).unwrap();
    let server = std::thread::spawn(move || {
        let rnic = Rnic::new(RnicConfig::new(DUT_MAC, DUT_IP, 7));
        serve(&listener, &mut NullBackend::new(rnic), Some(1));
    });
    let mut w = UnixStream::connect(&path).unwrap();
    let mut r = BufReader::new(w.try_clone().unwrap());

    let v = ask(&mut w, &mut r, "this is not json");
    assert_eq!(v["ok"], false);
    assert!(v["id"].is_null());
    let v = ask(&mut w, &mut r, r#"{"id":1,"op":"frobnicate"}"#);
    assert_eq!(
        (v["id"].as_u64(), v["ok"].as_bool()),
        (Some(1), Some(false))
    );
    assert!(v["error"].as_str().unwrap().contains("unknown op"), "{v}");
    let v = ask(&mut w, &mut r, r#"{"id":2,"op":"reg_mr","pd":"x"}"#);
    assert_eq!(v["ok"], false, "{v}");

    let v = ask(&mut w, &mut r, r#"{"id":3,"op":"hello","version":1}"#);
    assert_eq!(
        (v["ok"].as_bool(), v["version"].as_u64()),
        (Some(true), Some(1)),
        "{v}"
    );
    let v = ask(&mut w, &mut r, r#"{"id":4,"op":"hello","version":99}"#);
    assert_eq!(v["ok"], false, "{v}");
    let v = ask(&mut w, &mut r, r#"{"id":4,"op":"hello","version":2}"#);
    assert_eq!(v["version"], 2, "{v}");
    let v = ask(&mut w, &mut r, r#"{"id":5,"op":"query_device"}"#);
    assert_eq!(v["gids"][0], "10.77.0.1", "{v}");
    assert_eq!(v["active_mtu"], 4096, "{v}");

    let pd = ask(&mut w, &mut r, r#"{"id":6,"op":"alloc_pd"}"#)["pd"]
        .as_u64()
        .unwrap();
    let mr = ask(
        &mut w,
        &mut r,
        &json!({"id":7,"op":"reg_mr","pd":pd,"length":64,"access":15}).to_string(),
    );
    assert_eq!(mr["ok"], true, "{mr}");
    let lkey = mr["lkey"].as_u64().unwrap();
    let v = ask(
        &mut w,
        &mut r,
        &json!({"id":8,"op":"write_mr","lkey":lkey,"offset":4,"data":"c0ffee"}).to_string(),
    );
    assert_eq!(v["ok"], true, "{v}");
    let v = ask(
        &mut w,
        &mut r,
        &json!({"id":9,"op":"read_mr","lkey":lkey,"offset":3,"length":5}).to_string(),
    );
    assert_eq!(v["data"], "00c0ffee00", "{v}");
    let v = ask(
        &mut w,
        &mut r,
        &json!({"id":10,"op":"read_mr","lkey":lkey,"offset":60,"length":8}).to_string(),
    );
    assert_eq!(v["ok"], false, "reading past the MR: {v}");
    let v = ask(
        &mut w,
        &mut r,
        &json!({"id":11,"op":"write_mr","lkey":lkey,"data":"xyz"}).to_string(),
    );
    assert_eq!(v["ok"], false, "bad hex: {v}");

    let cq = ask(&mut w, &mut r, r#"{"id":12,"op":"create_cq","cqe":16}"#)["cq"]
        .as_u64()
        .unwrap();
    let qp = ask(&mut w, &mut r, &json!({"id":13,"op":"create_qp","pd":pd,"type":"rc","send_cq":cq,"recv_cq":cq,"max_send_wr":4}).to_string());
    let qpn = qp["qpn"].as_u64().unwrap_or_else(|| panic!("{qp}"));
    let v = ask(&mut w, &mut r, &json!({"id":14,"op":"modify_qp","qpn":qpn,"qp_state":"init","pkey_index":0,"port_num":1,"qp_access_flags":15}).to_string());
    assert_eq!(v["ok"], true, "{v}");
    let v = ask(
        &mut w,
        &mut r,
        &json!({"id":15,"op":"query_qp","qpn":qpn}).to_string(),
    );
    assert_eq!(v["qp_state"], "init", "{v}");
    // Posting a send in INIT is an immediate error (IBTA 11.4.1.1, unverified).
    let v = ask(&mut w, &mut r, &json!({"id":16,"op":"post_send","qpn":qpn,"opcode":"send","sg":[{"addr":mr["addr"],"length":8,"lkey":lkey}]}).to_string());
    assert_eq!(v["ok"], false, "{v}");
    let v = ask(&mut w, &mut r, &json!({"id":17,"op":"post_recv","qpn":qpn,"wr_id":5,"sg":[{"addr":mr["addr"],"length":8,"lkey":lkey}]}).to_string());
    assert_eq!(v["ok"], true, "{v}");
    let v = ask(
        &mut w,
        &mut r,
        &json!({"id":18,"op":"modify_qp","qpn":qpn,"qp_state":"err"}).to_string(),
    );
    assert_eq!(v["ok"], true, "{v}");
    let v = ask(
        &mut w,
        &mut r,
        &json!({"id":19,"op":"poll_cq","cq":cq,"max":4,"wait_ms":500}).to_string(),
    );
    assert_eq!(v["wcs"][0]["status"], "IBV_WC_WR_FLUSH_ERR", "{v}");
    assert_eq!(v["wcs"][0]["wr_id"], 5, "{v}");
    let v = ask(
        &mut w,
        &mut r,
        &json!({"id":20,"op":"poll_cq","cq":cq,"wait_ms":20}).to_string(),
    );
    assert_eq!(v["wcs"], json!([]), "{v}");
    // rdma_cm (version 2): nothing to stop or disconnect before a listen; bad ports refused.
    let v = ask(&mut w, &mut r, r#"{"id":30,"op":"cm_connections"}"#);
    assert_eq!(v["connections"], json!([]), "{v}");
    let v = ask(&mut w, &mut r, r#"{"id":31,"op":"cm_stop","port":7471}"#);
    assert_eq!(v["ok"], false, "{v}");
    let v = ask(&mut w, &mut r, r#"{"id":32,"op":"cm_disconnect","qpn":5}"#);
    assert_eq!(v["ok"], false, "{v}");
    let v = ask(&mut w, &mut r, r#"{"id":33,"op":"cm_listen","port":0}"#);
    assert_eq!(v["ok"], false, "{v}");
    let v = ask(&mut w, &mut r, r#"{"id":34,"op":"cm_listen","port":7471}"#);
    assert_eq!(v["ok"], true, "{v}");
    let v = ask(&mut w, &mut r, r#"{"id":35,"op":"cm_listen","port":7471}"#);
    assert!(v["error"].as_str().unwrap_or("").contains("already"), "{v}");
    let v = ask(&mut w, &mut r, r#"{"id":36,"op":"cm_disconnect","qpn":5}"#);
    assert_eq!(v["ok"], false, "no such connection: {v}");
    let v = ask(&mut w, &mut r, r#"{"id":37,"op":"cm_stop","port":7471}"#);
    assert_eq!(v["ok"], true, "{v}");
    let v = ask(&mut w, &mut r, r#"{"id":38,"op":"cm_listen","port":7471}"#);
    assert_eq!(v["ok"], true, "listening again after a stop: {v}");
    let v = ask(&mut w, &mut r, r#"{"id":"last","op":"reset"}"#);
    assert_eq!(
        (v["id"].as_str(), v["ok"].as_bool()),
        (Some("last"), Some(true)),
        "{v}"
    );
    let v = ask(
        &mut w,
        &mut r,
        &json!({"id":21,"op":"query_qp","qpn":qpn}).to_string(),
    );
    assert_eq!(v["ok"], false, "the QP is gone after reset: {v}");
    drop((w, r));
    server.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// A client asks for protocol version 2 and, refused by an agent that only speaks 1, settles
/// on 1: the verbs work, the rdma_cm operations fail on the client's side, saying why.
#[test]
fn the_client_falls_back_to_version_1() {
    use rocemu_conformance::agent::client::JsonClient;
    use rocemu_conformance::agent::Agent;
    let path = socket_path("v1");
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let old_agent = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut w = s.try_clone().unwrap();
        for line in BufReader::new(s).lines() {
            let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
            let id = v["id"].clone();
            let answer = match (v["op"].as_str(), v["version"].as_u64()) {
                (Some("hello"), Some(1)) => json!({"id":id,"ok":true,"version":1,"agent":"old"}),
                (Some("hello"), _) => {
                    json!({"id":id,"ok":false,"error":"protocol version 2 not served"})
                }
                (Some("alloc_pd"), _) => json!({"id":id,"ok":true,"pd":1}),
                _ => json!({"id":id,"ok":false,"error":"unknown op"}),
            };
            writeln!(w, "{answer}").unwrap();
        }
    });
    let mut c = JsonClient::connect(&format!("unix:{path}")).unwrap();
    assert_eq!(c.version(), 1);
    assert_eq!(c.alloc_pd(), Ok(1));
    let e = c.cm_listen(7471).unwrap_err().0;
    assert!(e.contains("needs version 2"), "{e}");
    drop(c);
    old_agent.join().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// Serves a RoCEmu RNIC on `dut_port` through `rocemu agent`'s server on a Unix socket, runs the
/// scenarios `picks` selects through the JSON client with the peer on `peer_port`, and returns
/// the failures (empty when all passed) and how many scenarios ran.
fn run_through_agent(
    name: &str,
    dut_port: Box<dyn Port + Send>,
    peer_port: Box<dyn Port + Send>,
    seed: u64,
    picks: &str,
) -> (Vec<String>, usize) {
    let (failed, results) = run_with_counters(name, dut_port, peer_port, seed, picks, None);
    (failed, results.len())
}

/// As [`run_through_agent`], with `--counters-cmd`: the failures and every scenario's result.
fn run_with_counters(
    name: &str,
    dut_port: Box<dyn Port + Send>,
    peer_port: Box<dyn Port + Send>,
    seed: u64,
    picks: &str,
    counters_cmd: Option<String>,
) -> (Vec<String>, Vec<CaseResult>) {
    let (dut_mac, peer_mac) = (dut_port.mac(), peer_port.mac());
    let path = socket_path(name);
    let listener = Listener::bind(&format!("unix:{path}")).unwrap();
    let server = std::thread::spawn(move || {
        let mut cfg = RnicConfig::new(dut_mac, DUT_IP, seed);
        cfg.eth_mtu = dut_port.mtu();
        let mut b = EngineBackend {
            rnic: Rnic::new(cfg),
            engine: Engine::new(dut_port),
        };
        serve(&listener, &mut b, Some(1));
    });
    let link = PortLink::new(peer_port, peer_mac, PEER_IP);
    let mut t = AgentTarget::connect(
        &format!("unix:{path}"),
        Box::new(link),
        peer_mac,
        PEER_IP,
        0,
    )
    .unwrap();
    t.settle = Duration::from_millis(40);
    t.counters_cmd = counters_cmd;
    let picked = select(picks);
    let mut failed = Vec::new();
    let mut results = Vec::new();
    for sc in &picked {
        let r = t.run(sc).result;
        if !r.passed {
            failed.push(format!(
                "{}: {}",
                r.id,
                r.reason.clone().unwrap_or_default()
            ));
        }
        results.push(r);
    }
    drop(t);
    server.join().unwrap();
    let _ = std::fs::remove_file(&path);
    (failed, results)
}

#[test]
fn counters_cmd_is_read_before_and_after_each_scenario() {
    // The command's n-th call prints rdma_sends n*n: a scenario read before and after gets
    // (2k+1)^2 - (2k)^2 = 4k + 1 for the k-th scenario, so a pairing off by one shows.
    let dir = std::env::temp_dir().join(format!("rcf-counters-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("n");
    let cmd = format!(
        "n=$(cat '{0}' 2>/dev/null || echo 0); echo $((n+1)) > '{0}'; \
         echo link rxe0/1 sent_pkts 7 rdma_sends $((n*n))",
        f.display()
    );
    let (dut_port, peer_port) = pipe(DUT_MAC, PEER_MAC, 1500);
    let (failed, results) = run_with_counters(
        "counters",
        Box::new(dut_port),
        Box::new(peer_port),
        17,
        "hdr.icrc,hdr.tver,verbs.post-send",
        Some(cmd),
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(results.len(), 3);
    for (k, r) in results.iter().enumerate() {
        let c = r.counters.as_ref().expect("counters read");
        let want: BTreeMap<String, i64> = [
            ("rdma_sends".to_string(), 4 * k as i64 + 1),
            ("sent_pkts".to_string(), 0),
        ]
        .into();
        assert_eq!(c, &want, "{}", r.id);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_counter_read_leaves_the_counters_out_and_fails_nothing() {
    let (dut_port, peer_port) = pipe(DUT_MAC, PEER_MAC, 1500);
    let (failed, results) = run_with_counters(
        "nocounters",
        Box::new(dut_port),
        Box::new(peer_port),
        19,
        "hdr.icrc,verbs.post-send",
        Some("echo link rxe0/1 rdma_sends oops; exit 1".into()),
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|r| r.passed && r.counters.is_none()));
}

#[test]
fn scenarios_run_through_the_json_client_against_an_engine() {
    let (dut_port, peer_port) = pipe(DUT_MAC, PEER_MAC, 1500);
    let (failed, n) = run_through_agent(
        "engine",
        Box::new(dut_port),
        Box::new(peer_port),
        11,
        "hdr.icrc,psn.seq-error,psn.dup.read,rdma.write.bad-rkey,rdma.requester,rnr.responder,ud.qkey,verbs.post-send,sec.rkey,sec.psn",
    );
    assert!(n >= 10);
    assert!(
        failed.is_empty(),
        "through the agent:\n{}",
        failed.join("\n")
    );
}

#[test]
fn scenarios_run_over_af_packet_on_a_veth_pair() {
    use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort};
    use rocemu_testbed::netns::{self, End, VethPair};
    // Two namespaces of its own joined by a veth pair (root, as scripts/test runs; without it
    // the test fails saying so rather than passing untried).
    let pair = VethPair::new(
        &format!("rcf{}", std::process::id() % 100_000),
        1500,
        None,
        None,
    )
    .expect("a veth pair between two network namespaces (needs root and iproute2)");
    // A packet socket belongs to the namespace of the thread that opens it.
    let open_in = |end: &End| {
        let (ns, ifname) = (end.ns.clone(), end.ifname.clone());
        std::thread::spawn(move || {
            netns::enter(&ns)?;
            AfPacketPort::open(&ifname, &AfPacketOptions::default()).map_err(|e| e.0)
        })
        .join()
        .unwrap()
    };
    let dut_port = open_in(&pair.a).expect("AF_PACKET on the device's end");
    let peer_port = open_in(&pair.b).expect("AF_PACKET on the peer's end");
    let (failed, n) = run_through_agent(
        "veth",
        Box::new(dut_port),
        Box::new(peer_port),
        13,
        "hdr.tver,hdr.pad.stripped,psn.dup.atomic,seq.send.multi,rdma.read.multi,rdma.requester.ack,rnr.requester.waits,sec.inject.foreign,sec.psn",
    );
    assert!(
        n >= 9 && failed.is_empty(),
        "over AF_PACKET:\n{}",
        failed.join("\n")
    );
}
