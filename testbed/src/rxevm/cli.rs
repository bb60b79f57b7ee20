//! `rocemu rxevm up|down|exec|status|build`: the lab as a command-line tool, one lab per
//! namespace name ([`CLI_NS`] unless `--ns`).
//!
//! Invariants: the CLI keeps no state of its own; `up` boots a lab and detaches it, and every
//! later command finds it through its state file (`labs/NS/state.json` in the work folder).
//! Parsing comes first and whole (an unknown option is an error before any command runs); then
//! one function per command.
use super::network::ns_exists;
use super::state::{read_state, teardown};
use super::vm::pid_alive;
use super::{build_guest, down, Ctl, LabConfig, RxeLab, BRIDGE, CLI_NS, EXEC_TIMEOUT};
use serde_json::json;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

const USAGE: &str = "\
usage: rocemu rxevm COMMAND [options]
  Linux rdma_rxe peers in QEMU VMs (TCG) on a private bridge in a network namespace (needs root).
commands:
  up [--vms N] [--mtu M] [--mem MIB] [--json]   build the guest if needed, boot N VMs (default 1),
                                 print the namespace and addresses, leave them running until `down`
  down                           kill the VMs (by recorded PID), delete the namespace
  exec [--timeout S] VM CMD...   run CMD with sh in VM (vm1, vm2, … or 1, 2, …); exit status is CMD's
  status                         show the lab (JSON)
  build                          build the guest (cached in the work folder) and print where it is
common options:
  --ns NAME     namespace (default rxevm)      --dir DIR   work folder (default $RXEVM_DIR or $TMPDIR/rocemu-rxevm)
MTU 1500 gives rxe an active MTU of 1024; 4200 or more (e.g. 9000) gives 4096.";

/// A parsed command line: the command, the lab it is about and the options that apply.
struct Invocation {
    cmd: String,
    cfg: LabConfig,
    /// The namespace (`--ns`, else [`CLI_NS`]) and the lab's folder in the work folder.
    ns: String,
    labdir: PathBuf,
    json_out: bool,
    timeout: Duration,
    /// The words that are not options; for `exec`, the VM and then the command.
    pos: Vec<String>,
}

/// `rocemu rxevm ARGS`: `args` are the words after `rxevm` (`["up", "--vms", "2"]`). Returns the
/// exit status, or an error to print.
pub fn cli(args: &[String]) -> Result<i32, String> {
    let inv = match parse(args)? {
        Ok(inv) => inv,
        Err(status) => return Ok(status),
    };
    match inv.cmd.as_str() {
        "up" => up(&inv),
        "down" => down_cmd(&inv),
        "exec" => exec(&inv),
        "status" => status(&inv),
        "build" => build(&inv),
        o => Err(format!("unknown command {o}\n{USAGE}")),
    }
}

fn val<'a>(it: &mut std::slice::Iter<'a, String>, o: &str) -> Result<&'a str, String> {
    it.next()
        .map(String::as_str)
        .ok_or_else(|| format!("{o} wants a value"))
}

fn num<T: std::str::FromStr>(s: &str, o: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("{o}: bad value {s:?}"))
}

/// The command line, or (`Ok(Err(status))`) the exit status when it only asked for the usage
/// (2 without a command, 0 for `-h`).
fn parse(args: &[String]) -> Result<Result<Invocation, i32>, String> {
    let mut cfg = LabConfig {
        ns: Some(CLI_NS.into()),
        ..Default::default()
    };
    let mut json_out = false;
    let mut timeout = EXEC_TIMEOUT;
    let mut pos: Vec<String> = Vec::new();
    let mut it = args.iter();
    let Some(cmd) = it.next() else {
        println!("{USAGE}");
        return Ok(Err(2));
    };
    while let Some(a) = it.next() {
        if !pos.is_empty() && cmd == "exec" {
            pos.push(a.clone()); // everything after the VM belongs to the command
            continue;
        }
        match a.as_str() {
            "--ns" => cfg.ns = Some(val(&mut it, a)?.into()),
            "--dir" => cfg.workdir = val(&mut it, a)?.into(),
            "--vms" => cfg.vms = num(val(&mut it, a)?, a)?,
            "--mtu" => cfg.mtu = num(val(&mut it, a)?, a)?,
            "--mem" => cfg.mem_mb = num(val(&mut it, a)?, a)?,
            "--timeout" => timeout = Duration::from_secs(num(val(&mut it, a)?, a)?),
            "--json" => json_out = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(Err(0));
            }
            o if o.starts_with("--") => return Err(format!("unknown option {o}\n{USAGE}")),
            _ => pos.push(a.clone()),
        }
    }
    let ns = cfg.ns.clone().unwrap_or_else(|| CLI_NS.into());
    let labdir = cfg.workdir.join("labs").join(&ns);
    Ok(Ok(Invocation {
        cmd: cmd.clone(),
        cfg,
        ns,
        labdir,
        json_out,
        timeout,
        pos,
    }))
}

/// `up`: refuses while a VM of the lab still runs, clears a dead one's leftovers, boots the
/// lab, prints it and leaves it running.
fn up(inv: &Invocation) -> Result<i32, String> {
    let ns = &inv.ns;
    if let Some(st) = read_state(&inv.labdir) {
        if st["vms"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["pid"].as_u64().is_some_and(|p| pid_alive(p as u32)))
        {
            return Err(format!(
                "lab {ns} is up already (rocemu rxevm down --ns {ns})"
            ));
        }
        teardown(&inv.labdir, &st);
    }
    let lab = RxeLab::start(&inv.cfg)?;
    if inv.json_out {
        let mut v = lab.info();
        v["detached"] = json!(true);
        println!("{v:#}");
    } else {
        print_lab(&lab, ns);
    }
    lab.detach()?;
    Ok(0)
}

/// `up`'s summary for a reader: the namespace, the addresses, RoCEmu's options, the VMs.
fn print_lab(lab: &RxeLab, ns: &str) {
    println!(
        "lab {ns}: {} rdma_rxe VM(s), MTU {}",
        lab.vms.len(),
        lab.mtu
    );
    println!("  namespace  {ns}   (ip netns exec {ns} …)");
    println!(
        "  bridge     {BRIDGE} {}/{}   (the kernel's address)",
        lab.bridge_ip, lab.prefix_len
    );
    println!(
        "  rocemu     --dev {} --ip {}   (or --dev af_packet:{BRIDGE} --ip {})",
        lab.rocemu_dev(),
        lab.host.ip,
        lab.bridge_ip
    );
    for vm in &lab.vms {
        println!(
            "  {:<10} {}   rxe0 on eth0, GID 1 = ::ffff:{}   console {}",
            vm.name,
            vm.ip,
            vm.ip,
            vm.serial_log.display()
        );
    }
    println!("  run        rocemu rxevm exec vm1 'ibv_devinfo'");
    println!("  stop       rocemu rxevm down");
}

fn down_cmd(inv: &Invocation) -> Result<i32, String> {
    let ns = &inv.ns;
    if down(&inv.cfg.workdir, ns) {
        println!("lab {ns}: down");
    } else {
        println!("lab {ns}: not up");
    }
    Ok(0)
}

/// `exec VM CMD…`: finds the VM (`vm1` or `1`) in the state file and runs CMD through its
/// control channel; CMD's stdout and stderr go to ours, its status is the exit status.
fn exec(inv: &Invocation) -> Result<i32, String> {
    let (ns, pos) = (&inv.ns, &inv.pos);
    if pos.len() < 2 {
        return Err(format!("exec wants a VM and a command\n{USAGE}"));
    }
    let st = read_state(&inv.labdir)
        .ok_or_else(|| format!("lab {ns} is not up (rocemu rxevm up --ns {ns})"))?;
    let want = if pos[0].starts_with("vm") {
        pos[0].clone()
    } else {
        format!("vm{}", pos[0])
    };
    let vm = st["vms"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"].as_str() == Some(want.as_str()))
        .ok_or_else(|| format!("lab {ns} has no {want}"))?;
    let ip: Ipv4Addr = num(vm["ip"].as_str().unwrap_or(""), "state ip")?;
    let port = vm["ctl_port"].as_u64().unwrap_or(5000) as u16;
    let ctl = Ctl {
        ns: ns.clone(),
        addr: SocketAddr::from((ip, port)),
        vm: want,
    };
    let o = ctl.exec_timeout(&pos[1..].join(" "), inv.timeout)?;
    print!("{}", o.stdout);
    eprint!("{}", o.stderr);
    let _ = std::io::stdout().flush();
    Ok(o.status)
}

/// `status`: the state file, with whether each QEMU and the namespace still exist.
fn status(inv: &Invocation) -> Result<i32, String> {
    let ns = &inv.ns;
    let st = read_state(&inv.labdir).ok_or_else(|| format!("lab {ns} is not up"))?;
    let mut st = st;
    for v in st["vms"].as_array_mut().into_iter().flatten() {
        let alive = v["pid"].as_u64().is_some_and(|p| pid_alive(p as u32));
        v["alive"] = json!(alive);
    }
    st["ns_exists"] = json!(ns_exists(ns));
    println!("{st:#}");
    Ok(0)
}

fn build(inv: &Invocation) -> Result<i32, String> {
    let g = build_guest(&inv.cfg.workdir)?;
    println!(
        "guest {} (kernel {}): {}, {}",
        g.dir.display(),
        g.kernel,
        g.vmlinuz.display(),
        g.initrd.display()
    );
    Ok(0)
}
