//! The VMs' processes: booting QEMU (TCG) on a tap of the lab's bridge, waiting for the guest's
//! READY line and its control channel, and killing a QEMU by recorded PID.
//!
//! Invariants:
//! * QEMU runs as `ip netns exec NS qemu …`, which execs in place: the child's PID is QEMU's,
//!   the one the state file records.
//! * A VM counts as ready only when its serial console said READY and its control channel
//!   answers across the bridge; a FAILED line, a dead QEMU or the boot timeout is an error that
//!   quotes the serial console.
//! * [`kill_qemu`] kills a PID only while its command line still names the lab's serial log,
//!   so a recycled PID is never someone else's process killed.
use super::{find_last, sh_quote, tail, Bg, Ctl, LabConfig, Output, RxeLab};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One rdma_rxe VM: eth0 on a tap of the lab's bridge, `rxe0` on eth0.
#[derive(Debug)]
pub struct Vm {
    /// `vm1`, `vm2`, …
    pub name: String,
    pub ip: Ipv4Addr,
    pub mac: String,
    /// Its tap in the lab's namespace.
    pub tap: String,
    /// The guest's serial console.
    pub serial_log: PathBuf,
    /// QEMU's PID.
    pub pid: u32,
    pub ctl: Ctl,
    pub(super) child: Option<Child>,
}

impl Vm {
    /// See [`Ctl::exec`].
    pub fn exec(&self, cmd: &str) -> Result<Output, String> {
        self.ctl.exec(cmd)
    }
    /// See [`Ctl::exec_timeout`].
    pub fn exec_timeout(&self, cmd: &str, timeout: Duration) -> Result<Output, String> {
        self.ctl.exec_timeout(cmd, timeout)
    }
    /// See [`Ctl::sh`].
    pub fn sh(&self, cmd: &str) -> Result<String, String> {
        self.ctl.sh(cmd)
    }
    /// See [`Ctl::spawn`].
    pub fn spawn(&self, cmd: &str) -> Result<Bg, String> {
        self.ctl.spawn(cmd)
    }
    /// See [`Ctl::fetch_file`].
    pub fn fetch_file(&self, path: &str) -> Result<Vec<u8>, String> {
        self.ctl.fetch_file(path)
    }
    /// See [`Ctl::wait_listening`].
    pub fn wait_listening(&self, port: u16, timeout: Duration) -> Result<(), String> {
        self.ctl.wait_listening(port, timeout)
    }
    /// Pins `ip`'s MAC in the guest's neighbour table, so rxe needs no ARP answer for it (rxe
    /// resolves its peer while moving a QP to RTR, often before a userspace peer runs).
    pub fn pin_neighbor(&self, ip: Ipv4Addr, mac: &str) -> Result<(), String> {
        self.sh(&format!(
            "ip neigh replace {ip} lladdr {} dev eth0 nud permanent",
            sh_quote(mac)
        ))
        .map(|_| ())
    }
    /// The serial console so far.
    pub fn serial(&self) -> String {
        std::fs::read(&self.serial_log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
    /// Whether QEMU still runs.
    pub fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => pid_alive(self.pid),
        }
    }
}

impl RxeLab {
    pub(super) fn boot(&self, cfg: &LabConfig, i: usize) -> Result<Vm, String> {
        let name = format!("vm{}", i + 1);
        let ip = cfg.vm_ip(i);
        let tap = format!("rxetap{}", i + 1);
        let mac = format!("52:54:00:99:{:02x}:{:02x}", (i + 1) >> 8, (i + 1) & 0xff);
        let serial_log = self.dir.join(format!("{name}.log"));
        let qlog = self.dir.join(format!("{name}.qemu.log"));
        let qout = std::fs::File::create(&qlog).map_err(|e| format!("{}: {e}", qlog.display()))?;
        let qerr = qout.try_clone().map_err(|e| e.to_string())?;
        let mut append = format!(
            "console=ttyS0 quiet panic=-1 rxe_ip={ip}/{} rxe_host={name} rxe_mtu={} rxe_ctl={}",
            cfg.prefix_len, cfg.mtu, cfg.ctl_port
        );
        // `RXEVM_APPEND`: more kernel arguments, to look into a guest (`loglevel=7` puts the
        // kernel's warnings, which `quiet` hides, into the serial log).
        if let Ok(extra) = std::env::var("RXEVM_APPEND") {
            append.push(' ');
            append.push_str(&extra);
        }
        let mem = cfg.mem_mb.to_string();
        let netdev = format!("tap,id=n0,ifname={tap},script=no,downscript=no");
        // romfile=: no iPXE option ROM (not needed with -kernel, and not always installed).
        let device = format!("virtio-net-pci,netdev=n0,mac={mac},romfile=");
        let chardev = format!("file,id=c0,path={}", serial_log.display());
        // `ip netns exec` execs QEMU in place: the child's PID is QEMU's.
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, &cfg.qemu])
            .args([
                "-name", &name, "-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", &mem,
            ])
            .args(["-nodefaults", "-no-user-config", "-display", "none"])
            .args(["-monitor", "none", "-no-reboot"])
            .arg("-kernel")
            .arg(&self.guest.vmlinuz)
            .arg("-initrd")
            .arg(&self.guest.initrd)
            .args(["-append", &append, "-netdev", &netdev, "-device", &device])
            .args(["-chardev", &chardev, "-serial", "chardev:c0"])
            .stdin(Stdio::null())
            .stdout(qout)
            .stderr(qerr)
            .spawn()
            .map_err(|e| format!("ip netns exec {} {}: {e}", self.ns, cfg.qemu))?;
        Ok(Vm {
            pid: child.id(),
            ctl: Ctl {
                ns: self.ns.clone(),
                addr: SocketAddr::from((ip, cfg.ctl_port)),
                vm: name.clone(),
            },
            name,
            ip,
            mac,
            tap,
            serial_log,
            child: Some(child),
        })
    }

    pub(super) fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let t0 = Instant::now();
        let mut ready = vec![false; self.vms.len()];
        while ready.iter().any(|r| !r) {
            for (k, vm) in self.vms.iter_mut().enumerate() {
                if ready[k] {
                    continue;
                }
                let log = vm.serial();
                if let Some(l) = log.lines().find(|l| l.contains("rxevm: READY")) {
                    eprintln!(
                        "rxevm: {} READY after {:.1} s: {}",
                        vm.name,
                        t0.elapsed().as_secs_f64(),
                        l.trim()
                    );
                    ready[k] = true;
                    continue;
                }
                let why = if let Some(l) = log.lines().find(|l| l.contains("rxevm: FAILED")) {
                    Some(l.trim().to_string())
                } else if !vm.alive() {
                    let q = std::fs::read_to_string(self.dir.join(format!("{}.qemu.log", vm.name)))
                        .unwrap_or_default();
                    let panic = log
                        .lines()
                        .find(|l| l.contains("Kernel panic"))
                        .map(|l| format!("the guest's {}\n", l.trim()))
                        .unwrap_or_default();
                    Some(format!("QEMU exited. {panic}QEMU said:\n{}", tail(&q, 20)))
                } else if t0.elapsed() > timeout {
                    Some(format!("not READY after {:.0} s", timeout.as_secs_f64()))
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(format!(
                        "{} ({}): {why}\nserial console ({}):\n{}",
                        vm.name,
                        self.ns,
                        vm.serial_log.display(),
                        tail(&log, 40)
                    ));
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // The control channel answers (the guest checks it listens before READY; this checks
        // the path through the bridge).
        for vm in &self.vms {
            let mut tries = 0;
            loop {
                match vm.exec_timeout("echo rxevm-ok", Duration::from_secs(30)) {
                    Ok(o) if o.stdout.trim() == "rxevm-ok" && o.success() => break,
                    r if tries >= 20 => {
                        return Err(format!(
                            "{}: the control channel does not answer: {r:?}",
                            vm.name
                        ))
                    }
                    _ => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(250));
                    }
                }
            }
        }
        Ok(())
    }
}

pub(super) fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next());
            state != Some("Z") && state != Some("X")
        }
        Err(_) => false,
    }
}

/// Kills `pid` if it still is the QEMU whose command line mentions `marker`; waits for it to go.
pub(super) fn kill_qemu(pid: u32, marker: &str) {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return;
    };
    if find_last(&cmdline, marker.as_bytes()).is_none() {
        return; // the PID belongs to someone else now
    }
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
    let t = Instant::now();
    while pid_alive(pid) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
}
