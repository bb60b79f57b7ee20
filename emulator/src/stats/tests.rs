use super::client::{self, AskError, Entry};
use super::server::Server;
use super::*;
use crate::engine::Engine;
use crate::port::pipe::pipe;
use crate::rnic::{Mac, Rnic, RnicConfig};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A directory of its own for each test (tests run in parallel).
fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rocemu-stats-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn ident(name: &str) -> Identity {
    Identity {
        name: name.into(),
        datapath: "pipe".into(),
        address: "10.0.0.1".into(),
        mac: "02:00:00:00:00:01".into(),
    }
}

/// Sends `bytes` as they are and reads the one reply line.
fn raw(path: &Path, bytes: &[u8]) -> Value {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

#[test]
fn requests_parse_and_bad_ones_say_why() {
    assert_eq!(Request::parse(br#"{"op":"info"}"#), Ok(Request::Info));
    assert_eq!(
        Request::parse(br#"{"op":"stats"}"#),
        Ok(Request::Stats { qps: true })
    );
    assert_eq!(
        Request::parse(Request::Stats { qps: false }.to_line().as_bytes()),
        Ok(Request::Stats { qps: false })
    );
    for (bad, says) in [
        (&b"hello"[..], "one JSON object"),
        (b"[1,2]", "a JSON object"),
        (b"{}", "no \"op\""),
        (br#"{"op":"reboot"}"#, "unknown op"),
        (br#"{"op":"stats","qps":1}"#, "true or false"),
        (b"\xff\xfe", "one JSON object"),
    ] {
        let e = Request::parse(bad).unwrap_err();
        assert!(e.contains(says), "{bad:?}: {e}");
    }
}

#[test]
fn names_are_checked() {
    assert!(check_name("rocemu0").is_ok());
    assert!(check_name("a@b").is_ok());
    for bad in ["", "a/b", "a b", "a\nb", &"x".repeat(64)] {
        assert!(check_name(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        client::parse_file_name("a@b@12.sock"),
        Some(("a@b".into(), 12))
    );
    assert_eq!(client::parse_file_name("rocemu0@x.sock"), None);
    assert_eq!(client::parse_file_name("rocemu0@12"), None);
    assert_eq!(client::parse_file_name("@12.sock"), None);
}

#[test]
fn counter_names_do_not_collide_across_rnic_engine_and_port() {
    let r = Rnic::new(RnicConfig::new(
        Mac([2, 0, 0, 0, 0, 1]),
        "10.0.0.1".parse().unwrap(),
        1,
    ));
    let s = Snapshot::take(
        &r,
        &crate::engine::EngineStats::default(),
        &crate::port::PortStats::default(),
        false,
    );
    let mut names: Vec<&str> = s.counters.iter().map(|(n, _)| *n).collect();
    let all = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), all, "a counter name appears twice");
    // Prometheus metric names: [a-zA-Z_:][a-zA-Z0-9_:]*.
    for n in names {
        assert!(
            n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !n.starts_with(|c: char| c.is_ascii_digit()),
            "{n}"
        );
    }
}

#[test]
fn info_is_answered_without_an_engine_and_bad_requests_get_an_error_reply() {
    let d = dir("info");
    let s = Server::bind_in(&d, ident("t-info")).unwrap();
    let path = s.path().to_owned();
    assert_eq!(
        path.file_name().unwrap().to_str().unwrap(),
        format!("t-info@{}.sock", std::process::id())
    );
    let v = client::ask(&path, Request::Info).unwrap();
    assert_eq!(v["device"], "t-info");
    assert_eq!(v["pid"], std::process::id());
    assert_eq!(v["datapath"], "pipe");
    assert_eq!(v["protocol"], PROTOCOL);
    // Malformed, oversized, unknown: an error reply each, and the server goes on.
    let e = raw(&path, b"not json\n");
    assert!(e["error"].as_str().unwrap().contains("JSON"), "{e}");
    let big = vec![b'x'; MAX_REQUEST * 8];
    let e = raw(&path, &big);
    assert!(e["error"].as_str().unwrap().contains("at most"), "{e}");
    let mut long = br#"{"op":"info","pad":""#.to_vec();
    long.extend(vec![b' '; MAX_REQUEST]);
    long.extend(b"\"}\n");
    let e = raw(&path, &long);
    assert!(e["error"].as_str().unwrap().contains("at most"), "{e}");
    let e = raw(&path, b"{\"op\":\"reboot\"}\n");
    assert!(e["error"].as_str().unwrap().contains("unknown op"), "{e}");
    // A request without its newline, the client's side shut: still a request.
    let mut c = UnixStream::connect(&path).unwrap();
    c.write_all(br#"{"op":"info"}"#).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut line = String::new();
    BufReader::new(c).read_line(&mut line).unwrap();
    assert!(line.contains("t-info"), "{line}");
    // stats with no engine turning: an error within the engine timeout, not a hang.
    let t = Instant::now();
    match client::ask(&path, Request::Stats { qps: false }) {
        Err(AskError::Device(e)) => assert!(e.contains("did not answer"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(t.elapsed() < ENGINE_TIMEOUT + Duration::from_secs(2));
    assert!(client::ask(&path, Request::Info).is_ok());
    drop(s);
    assert!(!path.exists(), "the socket goes with the server");
    assert_eq!(client::ask(&path, Request::Info), Err(AskError::Refused));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_slow_client_times_out_and_the_next_is_served() {
    let d = dir("slow");
    let s = Server::bind_in(&d, ident("t-slow")).unwrap();
    let path = s.path().to_owned();
    let t = Instant::now();
    // Connects and says nothing.
    let mut idle = UnixStream::connect(&path).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut line = String::new();
    BufReader::new(&mut idle).read_line(&mut line).unwrap();
    assert!(line.contains("no request line"), "{line}");
    let took = t.elapsed();
    assert!(
        took >= CLIENT_TIMEOUT && took < CLIENT_TIMEOUT + Duration::from_secs(2),
        "{took:?}"
    );
    assert!(client::ask(&path, Request::Info).is_ok());
    drop(s);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_same_name_twice_in_one_process_is_refused() {
    let d = dir("twice");
    let a = Server::bind_in(&d, ident("t-twice")).unwrap();
    let e = Server::bind_in(&d, ident("t-twice")).unwrap_err();
    assert!(e.contains("already serves"), "{e}");
    let b = Server::bind_in(&d, ident("t-twice-2")).unwrap();
    drop((a, b));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn dead_sockets_are_skipped_and_removed() {
    let d = dir("dead");
    std::fs::create_dir_all(&d).unwrap();
    // A process that is gone (no such PID): removed by the listing.
    let gone = d.join("old@4000000000.sock");
    drop(std::os::unix::net::UnixListener::bind(&gone).unwrap());
    // A live PID (ours) whose socket nobody listens on: refused when asked, then removed.
    let stale = d.join(format!("stale@{}.sock", std::process::id()));
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    std::fs::write(d.join("not-a-device.txt"), b"x").unwrap();
    let live = Server::bind_in(&d, ident("t-live")).unwrap();
    let l = client::list(&d).unwrap();
    let ids: Vec<String> = l.iter().map(Entry::id).collect();
    let me = std::process::id();
    assert_eq!(ids, [format!("stale@{me}"), format!("t-live@{me}")]);
    assert!(!gone.exists());
    assert_eq!(client::ask(&stale, Request::Info), Err(AskError::Refused));
    assert!(!stale.exists());
    assert!(client::ask(live.path(), Request::Info).is_ok());
    // find: by name, by NAME@PID, not found, ambiguous.
    let l = client::list(&d).unwrap();
    assert_eq!(client::find(&l, "t-live", &d).unwrap().pid, me);
    assert_eq!(
        client::find(&l, &format!("t-live@{me}"), &d).unwrap().pid,
        me
    );
    let e = client::find(&l, "nope", &d).unwrap_err();
    assert!(e.contains("running: t-live@"), "{e}");
    let two = [
        Entry {
            name: "x".into(),
            pid: 1,
            path: "a".into(),
        },
        Entry {
            name: "x".into(),
            pid: 2,
            path: "b".into(),
        },
    ];
    let e = client::find(&two, "x", &d).unwrap_err();
    assert!(e.contains("ambiguous: x@1, x@2"), "{e}");
    assert_eq!(client::find(&two, "x@2", &d).unwrap().pid, 2);
    let e = client::find(&[], "x", &d).unwrap_err();
    assert!(e.contains("no RoCEmu device is running"), "{e}");
    drop(live);
    assert!(client::list(&d).unwrap().is_empty());
    assert!(client::list(&d.join("absent")).unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&d);
}

/// An engine turning on its own thread answers with its RNIC's counters and QPs.
#[test]
fn an_engine_answers_between_turns() {
    let d = dir("engine");
    let (pa, _pb) = pipe(Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]), 1500);
    let mut rnic = Rnic::new(RnicConfig::new(
        Mac([2, 0, 0, 0, 0, 1]),
        "10.0.0.1".parse().unwrap(),
        1,
    ));
    let pd = rnic.alloc_pd();
    let cq = rnic.create_cq(16).unwrap();
    let qp = rnic
        .create_qp(
            pd,
            crate::rnic::QpInitAttr::new(crate::rnic::QpType::Rc, cq),
        )
        .unwrap();
    let mut engine = Engine::new(Box::new(pa));
    engine.serve_stats(Server::bind_in(&d, ident("t-engine")).unwrap());
    let path = engine.stats_path().unwrap().to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let h = std::thread::spawn(move || {
        while !st.load(Ordering::Relaxed) {
            let w = engine.poll(&mut rnic);
            engine.idle(w);
        }
        drop(engine);
    });
    let v = client::ask(&path, Request::Stats { qps: true }).unwrap();
    assert_eq!(v["device"], "t-engine");
    let c = v["counters"].as_object().unwrap();
    assert!(c.contains_key("sent_pkts") && c.contains_key("port_rx_frames"));
    assert!(c.values().all(Value::is_u64));
    let qps = v["qps"].as_array().unwrap();
    let q = qps
        .iter()
        .find(|q| q["qpn"] == qp.value())
        .unwrap_or_else(|| panic!("QP {qp:?} in {qps:?}"));
    assert_eq!(q["type"], "RC");
    assert_eq!(q["state"], "RESET");
    assert!(q["last_error"].is_null());
    assert!(q["counters"].is_object());
    let v = client::ask(&path, Request::Stats { qps: false }).unwrap();
    assert!(v["qps"].as_array().unwrap().is_empty());
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    assert!(!path.exists(), "the socket goes with the engine");
    let _ = std::fs::remove_dir_all(&d);
}

/// A device on two threads: shard 0's engine serves the socket, shard 1's answers through its
/// tap, and the reply sums their counters and lists both shards' QPs.
#[test]
fn a_device_on_two_threads_answers_for_both_shards() {
    let d = dir("shards");
    let server = Server::bind_in(&d, ident("t-shards")).unwrap();
    let path = server.path().to_owned();
    let mut tap = Some(server.shard_tap());
    let mut server = Some(server);
    let stop = Arc::new(AtomicBool::new(false));
    let mut qpns = Vec::new();
    let mut threads = Vec::new();
    for k in 0..2u32 {
        let (pa, _pb) = pipe(Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]), 1500);
        let mut cfg = RnicConfig::new(Mac([2, 0, 0, 0, 0, 1]), "10.0.0.1".parse().unwrap(), 1);
        cfg.shard = crate::rnic::Shard { index: k, count: 2 };
        let mut rnic = Rnic::new(cfg);
        let pd = rnic.alloc_pd();
        let cq = rnic.create_cq(16).unwrap();
        let qp = rnic
            .create_qp(
                pd,
                crate::rnic::QpInitAttr::new(crate::rnic::QpType::Rc, cq),
            )
            .unwrap();
        qpns.push(qp.value());
        // Shard k drops k + 1 malformed frames.
        for _ in 0..=k {
            rnic.handle_frame(crate::time::Nanos(0), &[0u8; 10]);
        }
        let mut engine = Engine::new(Box::new(pa));
        match k {
            0 => engine.serve_stats(server.take().unwrap()),
            _ => engine.serve_stats_shard(tap.take().unwrap()),
        }
        let st = stop.clone();
        threads.push(std::thread::spawn(move || {
            let _keep = _pb;
            while !st.load(Ordering::Relaxed) {
                let w = engine.poll(&mut rnic);
                engine.idle(w);
            }
        }));
    }
    let v = client::ask(&path, Request::Stats { qps: true }).unwrap();
    assert_eq!(v["counters"]["rx_drop_malformed"], 3, "{v}");
    let listed: Vec<u64> = v["qps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["qpn"].as_u64().unwrap())
        .collect();
    for q in &qpns {
        assert!(listed.contains(&u64::from(*q)), "QP {q:#x} in {listed:x?}");
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Dropping a server ends its thread (shutdown(2) wakes the accept), rather than leaving it
/// blocked on a socket nobody can reach. Counted by thread name, in a child process of its own
/// (other tests' servers run in parallel in this one).
#[test]
fn dropping_a_server_ends_its_thread() {
    fn stats_threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "rocemu-stats")
            })
            .count()
    }
    if std::env::var_os("ROCEMU_STATS_THREAD_TEST").is_none() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "stats::tests::dropping_a_server_ends_its_thread",
                "--test-threads=1",
            ])
            .env("ROCEMU_STATS_THREAD_TEST", "1")
            .output()
            .unwrap();
        let o = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && o.contains("1 passed"), "{o}");
        return;
    }
    let d = dir("thread");
    assert_eq!(stats_threads(), 0);
    let s = Server::bind_in(&d, ident("t-thread")).unwrap();
    // (The thread names itself once it runs.)
    let t = Instant::now();
    while stats_threads() == 0 {
        assert!(t.elapsed() < Duration::from_secs(2), "no stats thread");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(stats_threads(), 1);
    drop(s);
    let t = Instant::now();
    while stats_threads() > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the thread is still there"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_dir_all(&d);
}
