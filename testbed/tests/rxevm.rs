//! The rdma_rxe peer VM harness itself (`rocemu_testbed::rxevm`): the guest builds, a VM boots
//! with rxe0 ACTIVE, commands run in it with their stdout, stderr and status apart, background
//! jobs end and can be killed, files come back byte for byte, ARP and ICMP cross the bridge,
//! jumbo frames give rxe a path MTU of 4096 and cross the bridge unfragmented; and every lab
//! leaves no QEMU process and no namespace behind, after a normal drop and while a failing test
//! unwinds. RoCEmu against rxe is the interop tests' business, not this file's.
//!
//! Needs root, QEMU and Debian 12's apt sources (the guest is built on first use, cached in
//! `$RXEVM_DIR` or `$TMPDIR/rocemu-rxevm`). It never skips: without them it fails.
use rocemu_testbed::rxevm::{LabConfig, RxeLab, BRIDGE, BRIDGE_MAC, HOST_IF};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// One VM at a time: a TCG guest keeps a core busy while it boots.
static ONE_LAB_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_LAB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn start(cfg: &LabConfig) -> RxeLab {
    RxeLab::start(cfg).unwrap_or_else(|e| panic!("starting the rxe lab: {e}"))
}

/// No namespace `ns`, and none of `pids` is a QEMU of that lab any more.
fn assert_gone(ns: &str, pids: &[u32]) {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        !list
            .lines()
            .any(|l| l.split_whitespace().next() == Some(ns)),
        "namespace {ns} is still there:\n{list}"
    );
    for pid in pids {
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd);
            assert!(
                !cmd.contains(&format!("/labs/{ns}/")),
                "QEMU {pid} of lab {ns} still runs: {cmd}"
            );
        }
    }
}

fn ip_in(lab: &RxeLab, args: &[&str]) -> String {
    let out = lab.command("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {args:?}: {:?}", out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The IPv4 counters of /proc/net/snmp, by name.
fn ip_counter(snmp: &str, name: &str) -> u64 {
    let rows: Vec<Vec<&str>> = snmp
        .lines()
        .filter(|l| l.starts_with("Ip:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{snmp}");
    let k = rows[0].iter().position(|h| *h == name).unwrap();
    rows[1][k].parse().unwrap()
}

const DELIBERATE: &str = "deliberate panic: the lab must clean up while this test unwinds";

#[test]
fn one_vm_boots_runs_commands_and_cleans_up_on_panic() {
    let _one = one_at_a_time();
    let mut seen: Option<(String, PathBuf, Vec<u32>)> = None;
    let r = catch_unwind(AssertUnwindSafe(|| {
        let lab = start(&LabConfig::default());
        seen = Some((
            lab.ns.clone(),
            lab.dir.clone(),
            lab.vms().iter().map(|v| v.pid).collect(),
        ));
        let vm = lab.vm(0);
        assert_eq!(vm.name, "vm1");
        assert_eq!(vm.ip.to_string(), "10.99.0.11");
        assert!(vm.serial().contains("rxevm: READY"));

        // rxe0 on eth0, port active, path MTU 1024 at MTU 1500, GID 1 the IPv4-mapped address.
        let link = vm.sh("rdma link").unwrap();
        assert!(
            link.contains("link rxe0/1 state ACTIVE") && link.contains("netdev eth0"),
            "{link}"
        );
        let info = vm.sh("ibv_devinfo -d rxe0").unwrap();
        assert!(info.contains("PORT_ACTIVE"), "{info}");
        assert!(
            info.lines()
                .any(|l| l.contains("active_mtu") && l.contains("1024 (3)")),
            "{info}"
        );
        let gid = vm
            .sh("cat /sys/class/infiniband/rxe0/ports/1/gids/1")
            .unwrap();
        assert_eq!(gid.trim(), "0000:0000:0000:0000:0000:ffff:0a63:000b");

        // stdout, stderr and status apart; shell text passes through untouched.
        let o = vm.exec("echo out; echo err >&2; exit 7").unwrap();
        assert_eq!(
            (o.stdout.as_str(), o.stderr.as_str(), o.status),
            ("out\n", "err\n", 7)
        );
        let o = vm
            .sh("x='a  b'\necho \"$x\" 'it'\\''s' \"$((6*7))\"; printf 'no newline'")
            .unwrap();
        assert_eq!(o, "a  b it's 42\nno newline");
        assert!(vm.sh("false").is_err());

        // ARP and ICMP across the bridge: the VM reaches the kernel's address and learns its MAC.
        vm.sh(&format!("ping -c 2 -W 5 {}", lab.bridge_ip)).unwrap();
        let neigh = vm.sh("ip neigh show dev eth0").unwrap();
        assert!(
            neigh.contains(&lab.bridge_ip.to_string()) && neigh.contains(BRIDGE_MAC),
            "{neigh}"
        );

        // Background jobs: output and status once ended; killable while running.
        let bg = vm
            .spawn("echo started; sleep 1; echo done >&2; exit 5")
            .unwrap();
        let o = bg.wait(Duration::from_secs(60)).unwrap();
        assert_eq!((o.stdout.as_str(), o.status), ("started\ndone\n", 5));
        let bg = vm.spawn("echo up; sleep 1000; echo never").unwrap();
        assert_eq!(bg.status().unwrap(), None);
        bg.kill().unwrap();
        let o = bg.wait(Duration::from_secs(30)).unwrap();
        assert_eq!((o.stdout.as_str(), o.status), ("up\n", 128 + 15));
        assert!(bg.wait(Duration::from_millis(10)).is_ok());

        // A server started in the background, waited for, and reached from the namespace.
        let bg = vm.spawn("nc -l -p 7777 > /tmp/got").unwrap();
        vm.wait_listening(7777, Duration::from_secs(30)).unwrap();
        let sent = lab
            .command("bash")
            .args(["-c", "echo hello-from-the-host > /dev/tcp/10.99.0.11/7777"])
            .status()
            .unwrap();
        assert!(sent.success());
        bg.wait(Duration::from_secs(30)).unwrap();
        assert_eq!(vm.sh("cat /tmp/got").unwrap(), "hello-from-the-host\n");

        // Files, byte for byte.
        vm.sh("printf 'a\\000b\\377\\n' > /tmp/bin").unwrap();
        assert_eq!(vm.fetch_file("/tmp/bin").unwrap(), b"a\0b\xff\n");
        assert!(vm.fetch_file("/no/such/file").is_err());

        // RoCEmu's side: a veth in the bridge, up, without a kernel address.
        let host = ip_in(&lab, &["-br", "addr", "show", "dev", HOST_IF]);
        assert!(host.contains("UP") && !host.contains("10.99.0."), "{host}");
        let br = ip_in(&lab, &["-br", "link", "show", "master", BRIDGE]);
        assert!(br.contains("rxeh0br") && br.contains("rxetap1"), "{br}");

        panic!("{DELIBERATE}");
    }));
    let e = r.expect_err("the checks end in a panic");
    let msg = e
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    if msg != DELIBERATE {
        resume_unwind(e); // a real failure
    }
    let (ns, dir, pids) = seen.expect("the lab started");
    assert_gone(&ns, &pids);
    // A lab dropped while panicking keeps its logs for inspection.
    assert!(dir.join("vm1.log").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn jumbo_frames_give_path_mtu_4096() {
    let _one = one_at_a_time();
    let lab = start(&LabConfig {
        mtu: 9000,
        ..Default::default()
    });
    let (ns, dir, pids) = (lab.ns.clone(), lab.dir.clone(), vec![lab.vm(0).pid]);
    for ifname in [BRIDGE, "rxetap1", HOST_IF, "rxeh0br"] {
        let l = ip_in(&lab, &["link", "show", "dev", ifname]);
        assert!(l.contains("mtu 9000"), "{l}");
    }
    let vm = lab.vm(0);
    assert_eq!(vm.sh("cat /sys/class/net/eth0/mtu").unwrap().trim(), "9000");
    let info = vm.sh("ibv_devinfo -d rxe0").unwrap();
    assert!(
        info.lines()
            .any(|l| l.contains("active_mtu") && l.contains("4096 (5)")),
        "{info}"
    );
    // 8 KB echoes cross the bridge both ways whole: the guest reassembles nothing.
    vm.sh(&format!("ping -c 2 -W 5 -s 8000 {}", lab.bridge_ip))
        .unwrap();
    let snmp = vm.sh("cat /proc/net/snmp").unwrap();
    assert!(ip_counter(&snmp, "InDelivers") > 0);
    assert_eq!(ip_counter(&snmp, "ReasmReqds"), 0, "{snmp}");

    // RC traffic at path MTU 4096 through rxe (loopback: server and client both on rxe0).
    let srv = vm
        .spawn("ibv_rc_pingpong -d rxe0 -g 1 -m 4096 -s 16384 -n 20 -c")
        .unwrap();
    vm.wait_listening(18515, Duration::from_secs(60)).unwrap();
    let cli = vm
        .exec(&format!(
            "ibv_rc_pingpong -d rxe0 -g 1 -m 4096 -s 16384 -n 20 -c {}",
            vm.ip
        ))
        .unwrap();
    assert!(cli.success(), "client: {cli:?}");
    assert!(cli.stdout.contains("20 iters"), "{cli:?}");
    let s = srv.wait(Duration::from_secs(60)).unwrap();
    assert!(
        s.success() && s.stdout.contains("20 iters"),
        "server: {s:?}"
    );

    drop(lab);
    assert_gone(&ns, &pids);
    assert!(!dir.exists(), "{} is still there", dir.display());
}
