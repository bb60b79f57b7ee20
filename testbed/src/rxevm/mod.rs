//! The rdma_rxe peer: Linux's software RoCEv2 (`rdma_rxe`) in QEMU guests on a private bridge,
//! for interop tests against RoCEmu.
//!
//! Invariants:
//! * A lab lives in one network namespace of its own ([`RxeLab::ns`]): the bridge, the VMs' taps
//!   and RoCEmu's veth. Nothing outside it is touched (no host interface, route or firewall rule).
//! * A VM's control channel is an unauthenticated shell on TCP [`LabConfig::ctl_port`]; it is
//!   only reachable from inside the lab's namespace (the VM's only NIC is a tap on the private
//!   bridge, and this module connects from a thread that joined the namespace).
//! * A lab cleans up on drop, also while a failing test unwinds: its QEMU processes are killed by
//!   PID and its namespace is deleted (with every interface in it). A lab whose owner died without
//!   unwinding (SIGKILL, abort) is reaped by the next lab started on the same work folder; a lab
//!   left running on purpose ([`RxeLab::detach`], `rocemu rxevm up`) by [`down`].
//! * The guest (Debian 12's kernel and an initramfs of busybox, rdma-core, perftest and our
//!   `imm_pingpong` and `ibv_agent`, see `testbed/rxevm/`) is built once per recipe into the work
//!   folder; the recipe is compiled into the binary, so nothing outside the work folder is needed
//!   at run time.
//!
//! A lab, with the default addresses:
//! ```text
//!   netns NS
//!   ├─ rxebr0    bridge, 10.99.0.1/24: the kernel's address (TCP for out-of-band exchanges)
//!   ├─ rxeh0     veth for RoCEmu, no kernel address: `--dev af_packet:rxeh0 --ip 10.99.0.2`
//!   │            (its peer rxeh0br is a bridge port)
//!   ├─ rxetap1   tap of vm1: eth0 10.99.0.11, rxe0 on eth0
//!   └─ rxetap2   tap of vm2: eth0 10.99.0.12, …
//! ```
//! RoCEmu may also share the bridge's address (`--dev af_packet:rxebr0 --ip 10.99.0.1`).
//! GID index 1 of rxe0 is the IPv4-mapped address (`ibv_rc_pingpong -g 1`, perftest `-x 1`).
//! The active MTU is the netdev MTU less headers: 1500 gives 1024; [`LabConfig::mtu`] 4200 or more
//! (9000 is customary) gives 4096, and is set on the bridge, the taps, the veth and the guests.
//! TCG moves a few Mbit/s: enough for function, not for speed. Needs root, `ip`, QEMU.
use crate::netns::{self, ip_in, Netns};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The guest recipe, compiled in: `build_guest` writes it into the work folder and runs it.
const BUILD_SCRIPT: &str = include_str!("../../rxevm/build-guest.sh");
const INIT: &str = include_str!("../../rxevm/init");
/// Our tool for immediate data in the guest (no packaged one sends it); the script compiles it.
const IMM_PINGPONG: &str = include_str!("../../rxevm/imm_pingpong.c");
/// The conformance suite's agent over libibverbs (`docs/agent-protocol.md`); the script compiles it.
const IBV_AGENT: &str = include_str!("../../rxevm/ibv_agent.c");

/// The bridge, in every lab's namespace.
pub const BRIDGE: &str = "rxebr0";
/// RoCEmu's interface (a veth whose peer is a bridge port), in every lab's namespace.
pub const HOST_IF: &str = "rxeh0";
const HOST_IF_PEER: &str = "rxeh0br";
/// [`BRIDGE`]'s MAC.
pub const BRIDGE_MAC: &str = "52:54:00:99:ff:01";
/// [`HOST_IF`]'s MAC (RoCEmu's by default). The VMs' are `52:54:00:99:00:NN` (NN = 1, 2, …).
pub const HOST_MAC: &str = "52:54:00:99:ff:02";
/// The namespace `rocemu rxevm` uses when not told otherwise.
pub const CLI_NS: &str = "rxevm";
/// How long a [`Vm::exec`] may take unless told otherwise.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(120);

static SEQ: AtomicU64 = AtomicU64::new(0);
static LAB_SEQ: AtomicU64 = AtomicU64::new(0);

fn nonce() -> String {
    format!(
        "{}x{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// `$RXEVM_DIR`, else `$TMPDIR/rocemu-rxevm` (`/tmp/rocemu-rxevm`).
pub fn default_workdir() -> PathBuf {
    match std::env::var_os("RXEVM_DIR") {
        Some(d) if !d.is_empty() => d.into(),
        _ => std::env::temp_dir().join("rocemu-rxevm"),
    }
}

// ---- the guest ---------------------------------------------------------------------------------

/// A built guest: Debian's kernel and the initramfs.
#[derive(Debug, Clone)]
pub struct Guest {
    pub dir: PathBuf,
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
    /// `uname -r` in the guest (`6.1.0-57-amd64`).
    pub kernel: String,
}

/// Builds the guest into `workdir` unless this recipe's guest is there already (then it
/// returns at once). Downloads Debian 12 packages with `apt-get download`; needs root the first
/// time (it may install missing host tools and chroots to check libraries).
pub fn build_guest(workdir: &Path) -> Result<Guest, String> {
    let recipe = workdir.join("recipe");
    std::fs::create_dir_all(&recipe).map_err(|e| format!("{}: {e}", recipe.display()))?;
    write_atomic(&recipe.join("build-guest.sh"), BUILD_SCRIPT.as_bytes())?;
    write_atomic(&recipe.join("init"), INIT.as_bytes())?;
    write_atomic(&recipe.join("imm_pingpong.c"), IMM_PINGPONG.as_bytes())?;
    write_atomic(&recipe.join("ibv_agent.c"), IBV_AGENT.as_bytes())?;
    let t = Instant::now();
    let out = Command::new("bash")
        .arg(recipe.join("build-guest.sh"))
        .arg(workdir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("bash build-guest.sh: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "building the rxe guest failed ({}):\n{}{}",
            out.status,
            tail(&stdout, 20),
            tail(&stderr, 30)
        ));
    }
    let dir = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("GUEST="))
        .next_back()
        .ok_or_else(|| {
            format!("build-guest.sh said nothing about its output:\n{stdout}{stderr}")
        })?;
    let dir = PathBuf::from(dir);
    // Say so when it really built (it is silent when the cached guest served).
    for l in stderr
        .lines()
        .filter(|l| l.starts_with("build-guest: kernel"))
    {
        eprintln!("rxevm: {l} ({:.1} s)", t.elapsed().as_secs_f64());
    }
    let kernel = std::fs::read_to_string(dir.join("kernel-version"))
        .map_err(|e| format!("{}/kernel-version: {e}", dir.display()))?
        .trim()
        .to_string();
    Ok(Guest {
        vmlinuz: dir.join("vmlinuz"),
        initrd: dir.join("initrd.img"),
        dir,
        kernel,
    })
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<(), String> {
    if std::fs::read(path).ok().as_deref() == Some(data) {
        return Ok(());
    }
    let tmp = path.with_extension(format!("tmp{}", nonce()));
    std::fs::write(&tmp, data).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

// ---- configuration -----------------------------------------------------------------------------

/// What [`RxeLab::start`] builds. `LabConfig { vms: 2, mtu: 9000, ..Default::default() }`.
#[derive(Debug, Clone)]
pub struct LabConfig {
    /// The namespace's name; default `rxe<pid>n<k>`, unique per process and lab. A named
    /// namespace that exists already is an error (a lab is up there).
    pub ns: Option<String>,
    /// Guest build cache, debs, and one folder per lab (serial logs, state): [`default_workdir`].
    pub workdir: PathBuf,
    /// Number of VMs (`vm1`, `vm2`, …), booted in parallel.
    pub vms: usize,
    /// The bridge's (the kernel's) address in the namespace.
    pub bridge_ip: Ipv4Addr,
    /// RoCEmu's address on [`HOST_IF`] (the kernel does not have it: RoCEmu answers ARP for it).
    pub host_ip: Ipv4Addr,
    /// vm1's address; vmN's is this plus N-1.
    pub first_vm_ip: Ipv4Addr,
    pub prefix_len: u8,
    /// MTU of the bridge, taps, veth and the guests' eth0: 1500 → rxe active MTU 1024; ≥ 4200
    /// (9000) → 4096.
    pub mtu: u32,
    /// Guest memory, MiB.
    pub mem_mb: u32,
    /// The VMs' control channel port.
    pub ctl_port: u16,
    /// From QEMU's start to the guest's READY line.
    pub boot_timeout: Duration,
    pub qemu: String,
}

impl Default for LabConfig {
    fn default() -> Self {
        LabConfig {
            ns: None,
            workdir: default_workdir(),
            vms: 1,
            bridge_ip: Ipv4Addr::new(10, 99, 0, 1),
            host_ip: Ipv4Addr::new(10, 99, 0, 2),
            first_vm_ip: Ipv4Addr::new(10, 99, 0, 11),
            prefix_len: 24,
            mtu: 1500,
            mem_mb: 768,
            ctl_port: 5000,
            boot_timeout: Duration::from_secs(180),
            qemu: "qemu-system-x86_64".into(),
        }
    }
}

impl LabConfig {
    fn vm_ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.first_vm_ip) + i as u32)
    }

    fn check(&self) -> Result<(), String> {
        if self.vms == 0 || self.vms > 64 {
            return Err(format!("vms = {}: 1 to 64", self.vms));
        }
        if !(576..=65535).contains(&self.mtu) {
            return Err(format!("mtu = {}: 576 to 65535", self.mtu));
        }
        if !(8..=30).contains(&self.prefix_len) {
            return Err(format!("prefix_len = {}: 8 to 30", self.prefix_len));
        }
        let mask = u32::MAX << (32 - self.prefix_len);
        let net = u32::from(self.bridge_ip) & mask;
        let mut all = vec![self.bridge_ip, self.host_ip];
        all.extend((0..self.vms).map(|i| self.vm_ip(i)));
        for (k, a) in all.iter().enumerate() {
            let h = u32::from(*a) & !mask;
            if u32::from(*a) & mask != net || h == 0 || h == !mask {
                return Err(format!(
                    "{a} is not a host address in {}/{}",
                    Ipv4Addr::from(net),
                    self.prefix_len
                ));
            }
            if all[..k].contains(a) {
                return Err(format!("{a} is used twice"));
            }
        }
        Ok(())
    }
}

// ---- the control channel -----------------------------------------------------------------------

/// What a command in a VM printed, and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    /// The shell's exit status (128 + N when killed by signal N).
    pub status: i32,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status == 0
    }
}

/// The way into one VM's control channel: its namespace and address. Cheap to clone; usable
/// from any thread.
#[derive(Debug, Clone)]
pub struct Ctl {
    pub ns: String,
    pub addr: SocketAddr,
    /// The VM's name, for messages.
    pub vm: String,
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

impl Ctl {
    /// A TCP connection opened from inside the namespace (on a helper thread: joining a
    /// namespace is per thread, and the socket keeps the namespace it was made in).
    fn connect(&self, timeout: Duration) -> Result<TcpStream, String> {
        let (ns, addr) = (self.ns.clone(), self.addr);
        std::thread::spawn(move || -> Result<TcpStream, String> {
            netns::enter(&ns)?;
            TcpStream::connect_timeout(&addr, timeout)
                .map_err(|e| format!("control channel {addr} in netns {ns}: {e}"))
        })
        .join()
        .map_err(|_| "the connecting thread panicked".to_string())?
    }

    /// Hands `script` to a fresh shell in the VM; returns all it wrote before closing.
    fn session(&self, script: &str, timeout: Duration) -> Result<Vec<u8>, String> {
        let deadline = Instant::now() + timeout;
        let mut s = self.connect(timeout.min(Duration::from_secs(15)))?;
        s.write_all(script.as_bytes())
            .and_then(|_| s.shutdown(std::net::Shutdown::Write))
            .map_err(|e| format!("{}: sending to the control channel: {e}", self.vm))?;
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "{}: no end after {:.0} s; output so far:\n{}",
                    self.vm,
                    timeout.as_secs_f64(),
                    tail(&String::from_utf8_lossy(&out), 30)
                ));
            }
            let _ = s.set_read_timeout(Some(left.min(Duration::from_millis(500))));
            match s.read(&mut buf) {
                Ok(0) => return Ok(out),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(format!("{}: control channel: {e}", self.vm)),
            }
        }
    }

    /// Runs `cmd` (any shell text, several lines allowed) with `sh` in the VM, in a session of
    /// its own, stdin from /dev/null; waits for it to end. After `timeout` its process group is
    /// killed and the call fails. Background jobs it starts must redirect their output (or use
    /// [`Ctl::spawn`]), or the call lasts as long as they do.
    pub fn exec_timeout(&self, cmd: &str, timeout: Duration) -> Result<Output, String> {
        let n = nonce();
        let mark = format!("@@rxevm-{n}@@");
        let f = format!("/tmp/.rxevm-{n}");
        let script = format!(
            "cat > {f}.sh <<'RXEVM_EOF_{n}'\n{cmd}\nRXEVM_EOF_{n}\n\
             setsid sh -c 'echo $$ > {f}.pid; exec sh {f}.sh' </dev/null 2>{f}.err\n\
             s=$?\n\
             printf '\\n{mark}stderr\\n'\n\
             cat {f}.err\n\
             printf '\\n{mark}status %d\\n' \"$s\"\n\
             rm -f {f}.sh {f}.err {f}.pid\n\
             exit\n"
        );
        let out = match self.session(&script, timeout) {
            Ok(o) => o,
            Err(e) => {
                // Do not leave the command running behind a timeout: it runs in a session
                // (and process group) of its own, whose ID is its shell's PID.
                let _ = self.session(
                    &format!(
                        "p=$(cat {f}.pid) && {{ kill -TERM -$p; sleep 0.3; kill -KILL -$p; }} 2>/dev/null\n\
                         rm -f {f}.sh {f}.err {f}.pid\nexit\n"
                    ),
                    Duration::from_secs(10),
                );
                return Err(format!("`{}`: {e}", short(cmd)));
            }
        };
        let ms = format!("\n{mark}status ");
        let me = format!("\n{mark}stderr\n");
        let (Some(j), Some(i)) = (
            find_last(&out, ms.as_bytes()),
            find_last(&out, me.as_bytes()),
        ) else {
            return Err(format!(
                "{}: `{}`: the control session ended early:\n{}",
                self.vm,
                short(cmd),
                tail(&String::from_utf8_lossy(&out), 30)
            ));
        };
        let status = String::from_utf8_lossy(&out[j + ms.len()..])
            .trim()
            .parse::<i32>()
            .map_err(|e| format!("{}: bad status line: {e}", self.vm))?;
        Ok(Output {
            stdout: String::from_utf8_lossy(&out[..i]).into_owned(),
            stderr: String::from_utf8_lossy(&out[(i + me.len()).min(j)..j]).into_owned(),
            status,
        })
    }

    /// [`Ctl::exec_timeout`] with [`EXEC_TIMEOUT`].
    pub fn exec(&self, cmd: &str) -> Result<Output, String> {
        self.exec_timeout(cmd, EXEC_TIMEOUT)
    }

    /// Runs `cmd` and returns its stdout; an error unless it exits 0.
    pub fn sh(&self, cmd: &str) -> Result<String, String> {
        let o = self.exec(cmd)?;
        if o.success() {
            Ok(o.stdout)
        } else {
            Err(format!(
                "{}: `{}` exited {}:\n{}{}",
                self.vm,
                short(cmd),
                o.status,
                tail(&o.stderr, 20),
                tail(&o.stdout, 20)
            ))
        }
    }

    /// Starts `cmd` in the background in a session of its own, stdout and stderr into a file in
    /// the VM; returns at once. Like every `&` job of a non-interactive shell it ignores SIGINT
    /// and SIGQUIT: stop it with [`Bg::kill`] (SIGTERM, then SIGKILL).
    pub fn spawn(&self, cmd: &str) -> Result<Bg, String> {
        let id = nonce();
        let f = format!("/tmp/rxevm-bg/{id}");
        let script = format!(
            "mkdir -p /tmp/rxevm-bg\n\
             cat > {f}.sh <<'RXEVM_EOF_{id}'\n{cmd}\nRXEVM_EOF_{id}\n\
             cat > {f}.run <<'RXEVM_EOF_{id}'\n\
             setsid sh {f}.sh </dev/null >{f}.out 2>&1 &\n\
             p=$!; echo $p > {f}.pgid\n\
             wait $p; echo $? > {f}.rc.tmp && mv {f}.rc.tmp {f}.rc\n\
             RXEVM_EOF_{id}\n\
             sh {f}.run </dev/null >/dev/null 2>&1 &\n\
             i=0; while [ ! -s {f}.pgid ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done\n\
             cat {f}.pgid\n"
        );
        let pgid = self.sh(&script)?;
        let pgid = pgid
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("{}: background job did not start: {pgid:?}", self.vm))?;
        Ok(Bg {
            ctl: self.clone(),
            id,
            pgid,
            cmd: short(cmd),
        })
    }

    /// A file of the VM, byte for byte.
    pub fn fetch_file(&self, path: &str) -> Result<Vec<u8>, String> {
        let script = format!(
            "f={}\n\
             if [ -f \"$f\" ] && [ -r \"$f\" ]; then printf 'RXEVM-FILE %d\\n' \"$(wc -c < \"$f\")\"; cat \"$f\"; \
             else echo RXEVM-NOFILE; fi\nexit\n",
            sh_quote(path)
        );
        let out = self.session(&script, EXEC_TIMEOUT)?;
        let nl = out
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| format!("{}: fetching {path}: no answer", self.vm))?;
        let head = String::from_utf8_lossy(&out[..nl]);
        let len: usize = head
            .strip_prefix("RXEVM-FILE ")
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| format!("{}: {path}: no such readable file", self.vm))?;
        let body = out[nl + 1..].to_vec();
        if body.len() != len {
            return Err(format!(
                "{}: {path}: got {} bytes of {len}",
                self.vm,
                body.len()
            ));
        }
        Ok(body)
    }

    /// Waits until something in the VM listens on TCP `port` (a server started with
    /// [`Ctl::spawn`], before its client starts).
    pub fn wait_listening(&self, port: u16, timeout: Duration) -> Result<(), String> {
        let ticks = (timeout.as_millis() / 200).max(1);
        let o = self.exec_timeout(
            &format!(
                "i=0; until netstat -ltn | grep -q ':{port} '; do \
                 i=$((i+1)); [ $i -gt {ticks} ] && exit 1; sleep 0.2; done"
            ),
            timeout + Duration::from_secs(30),
        )?;
        if o.success() {
            Ok(())
        } else {
            Err(format!(
                "{}: nothing listens on TCP {port} after {:.0} s",
                self.vm,
                timeout.as_secs_f64()
            ))
        }
    }
}

fn short(cmd: &str) -> String {
    let one = cmd.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() > 100 {
        format!("{}…", one.chars().take(100).collect::<String>())
    } else {
        one
    }
}

fn tail(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    let mut t = v[v.len().saturating_sub(n)..].join("\n");
    if !t.is_empty() {
        t.push('\n');
    }
    t
}

/// A background command in a VM ([`Ctl::spawn`]).
#[derive(Debug, Clone)]
pub struct Bg {
    pub ctl: Ctl,
    /// Its files in the VM are `/tmp/rxevm-bg/<id>.{sh,out,rc}`.
    pub id: String,
    /// Its process group (and session) in the VM.
    pub pgid: u32,
    cmd: String,
}

impl Bg {
    fn file(&self, ext: &str) -> String {
        format!("/tmp/rxevm-bg/{}.{ext}", self.id)
    }

    /// Its exit status if it has ended.
    pub fn status(&self) -> Result<Option<i32>, String> {
        let s = self
            .ctl
            .sh(&format!("cat {} 2>/dev/null || true", self.file("rc")))?;
        Ok(s.trim().parse().ok())
    }

    /// What it printed so far (stdout and stderr, interleaved).
    pub fn output(&self) -> Result<String, String> {
        self.ctl.sh(&format!("cat {}", self.file("out")))
    }

    /// Waits for it to end; its output comes in `stdout` (stderr interleaved, `stderr` empty).
    pub fn wait(&self, timeout: Duration) -> Result<Output, String> {
        let ticks = (timeout.as_millis() / 200).max(1);
        let rc = self.ctl.sh(&format!(
            "i=0; while [ ! -f {rc} ] && [ $i -lt {ticks} ]; do sleep 0.2; i=$((i+1)); done; \
             cat {rc} 2>/dev/null || echo running",
            rc = self.file("rc")
        ))?;
        let stdout = self.output()?;
        match rc.trim().parse::<i32>() {
            Ok(status) => Ok(Output {
                stdout,
                stderr: String::new(),
                status,
            }),
            Err(_) => Err(format!(
                "{}: `{}` still running after {:.0} s; output so far:\n{}",
                self.ctl.vm,
                self.cmd,
                timeout.as_secs_f64(),
                tail(&stdout, 30)
            )),
        }
    }

    /// Kills its process group (TERM, then KILL).
    pub fn kill(&self) -> Result<(), String> {
        self.ctl
            .sh(&format!(
                "kill -TERM -{p} 2>/dev/null; sleep 0.3; kill -KILL -{p} 2>/dev/null; true",
                p = self.pgid
            ))
            .map(|_| ())
    }
}

// ---- VMs and the lab ---------------------------------------------------------------------------

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
    child: Option<Child>,
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

/// Where RoCEmu sits in a lab.
#[derive(Debug, Clone)]
pub struct HostSide {
    /// [`HOST_IF`]: `--dev af_packet:rxeh0`.
    pub ifname: String,
    /// RoCEmu's address (`--ip`); the kernel does not have it.
    pub ip: Ipv4Addr,
    /// The interface's MAC, which RoCEmu uses by default.
    pub mac: String,
}

/// A private namespace with a bridge, RoCEmu's veth and N rdma_rxe VMs. Dropping it kills the
/// VMs and deletes the namespace.
#[derive(Debug)]
pub struct RxeLab {
    /// The network namespace everything lives in (`ip netns exec NS …`).
    pub ns: String,
    /// This lab's folder: serial logs (`vmN.log`), QEMU's own output (`vmN.qemu.log`), state.
    pub dir: PathBuf,
    pub mtu: u32,
    pub prefix_len: u8,
    /// [`BRIDGE`]'s address: the kernel's in the namespace.
    pub bridge_ip: Ipv4Addr,
    pub host: HostSide,
    pub guest: Guest,
    vms: Vec<Vm>,
    netns: Option<Netns>,
    detached: bool,
}

impl RxeLab {
    /// Builds the guest if needed, sets up the namespace and boots the VMs; returns when every
    /// VM is READY and answers on its control channel.
    pub fn start(cfg: &LabConfig) -> Result<RxeLab, String> {
        cfg.check()?;
        if !is_root() {
            return Err(
                "the rxe lab needs root (network namespaces, taps): run as root, \
                        as scripts/test does"
                    .into(),
            );
        }
        let t0 = Instant::now();
        std::fs::create_dir_all(&cfg.workdir)
            .map_err(|e| format!("{}: {e}", cfg.workdir.display()))?;
        reap_stale(&cfg.workdir);
        let guest = build_guest(&cfg.workdir)?;
        let ns = match &cfg.ns {
            Some(n) => {
                if ns_exists(n) {
                    return Err(format!(
                        "network namespace {n} exists: a lab is up there (rocemu rxevm down --ns {n})"
                    ));
                }
                n.clone()
            }
            None => format!(
                "rxe{}n{}",
                std::process::id(),
                LAB_SEQ.fetch_add(1, Ordering::Relaxed)
            ),
        };
        if ns.is_empty() || ns.len() > 64 || ns.contains(['/', ' ', '\n']) {
            return Err(format!("bad namespace name {ns:?}"));
        }
        let dir = cfg.workdir.join("labs").join(&ns);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let dir = dir.canonicalize().map_err(|e| e.to_string())?;
        let netns = Netns::new(&ns)?;
        let mut lab = RxeLab {
            ns: ns.clone(),
            dir,
            mtu: cfg.mtu,
            prefix_len: cfg.prefix_len,
            bridge_ip: cfg.bridge_ip,
            host: HostSide {
                ifname: HOST_IF.into(),
                ip: cfg.host_ip,
                mac: String::new(),
            },
            guest,
            vms: Vec::new(),
            netns: Some(netns),
            detached: false,
        };
        // From here on, an error drops `lab`, which cleans up what exists.
        lab.write_state()?;
        lab.network(cfg)?;
        for i in 0..cfg.vms {
            let vm = lab.boot(cfg, i)?;
            lab.vms.push(vm);
            lab.write_state()?;
        }
        let t1 = Instant::now();
        lab.wait_ready(cfg.boot_timeout)?;
        eprintln!(
            "rxevm: lab {ns}: {} VM(s) ready in {:.1} s (setup {:.1} s), mtu {}, dir {}",
            cfg.vms,
            t1.elapsed().as_secs_f64(),
            (t1 - t0).as_secs_f64(),
            cfg.mtu,
            lab.dir.display()
        );
        Ok(lab)
    }

    fn network(&mut self, cfg: &LabConfig) -> Result<(), String> {
        let ns = self.ns.as_str();
        let m = cfg.mtu.to_string();
        let ip = |args: &[&str]| ip_in(ns, args);
        // Fixed MACs: a bridge otherwise takes the lowest of its ports' and changes it when
        // ports come and go, which stale ARP caches in the guests would not follow.
        ip(&[
            "link",
            "add",
            "name",
            BRIDGE,
            "address",
            BRIDGE_MAC,
            "mtu",
            &m,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ])?;
        let cidr = format!("{}/{}", cfg.bridge_ip, cfg.prefix_len);
        ip(&["addr", "add", &cidr, "dev", BRIDGE])?;
        ip(&[
            "link",
            "add",
            HOST_IF,
            "address",
            HOST_MAC,
            "mtu",
            &m,
            "type",
            "veth",
            "peer",
            "name",
            HOST_IF_PEER,
            "mtu",
            &m,
        ])?;
        ip(&["link", "set", HOST_IF_PEER, "master", BRIDGE, "up"])?;
        ip(&["link", "set", HOST_IF, "up"])?;
        for i in 0..cfg.vms {
            let tap = format!("rxetap{}", i + 1);
            ip(&["tuntap", "add", "dev", &tap, "mode", "tap"])?;
            ip(&["link", "set", &tap, "mtu", &m, "master", BRIDGE, "up"])?;
        }
        ip(&["link", "set", BRIDGE, "mtu", &m, "up"])?;
        self.host.mac = self
            .read_in_ns(&format!("/sys/class/net/{HOST_IF}/address"))?
            .trim()
            .to_string();
        Ok(())
    }

    fn read_in_ns(&self, path: &str) -> Result<String, String> {
        let out = self
            .command("cat")
            .arg(path)
            .output()
            .map_err(|e| format!("ip netns exec cat: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{path} in netns {}: {}",
                self.ns,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn boot(&self, cfg: &LabConfig, i: usize) -> Result<Vm, String> {
        let name = format!("vm{}", i + 1);
        let ip = cfg.vm_ip(i);
        let tap = format!("rxetap{}", i + 1);
        let mac = format!("52:54:00:99:{:02x}:{:02x}", (i + 1) >> 8, (i + 1) & 0xff);
        let serial_log = self.dir.join(format!("{name}.log"));
        let qlog = self.dir.join(format!("{name}.qemu.log"));
        let qout = std::fs::File::create(&qlog).map_err(|e| format!("{}: {e}", qlog.display()))?;
        let qerr = qout.try_clone().map_err(|e| e.to_string())?;
        let append = format!(
            "console=ttyS0 quiet panic=-1 rxe_ip={ip}/{} rxe_host={name} rxe_mtu={} rxe_ctl={}",
            cfg.prefix_len, cfg.mtu, cfg.ctl_port
        );
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

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
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

    /// The VMs, `vm1` first.
    pub fn vms(&self) -> &[Vm] {
        &self.vms
    }

    /// VM `i`, counting from 0 (`vm(0)` is `vm1`). Panics when there is no such VM.
    pub fn vm(&self, i: usize) -> &Vm {
        &self.vms[i]
    }

    /// `vm(i).exec(cmd)`.
    pub fn exec(&self, i: usize, cmd: &str) -> Result<Output, String> {
        self.vm(i).exec(cmd)
    }

    /// A command to run `program` inside the lab's namespace (`ip netns exec NS program`):
    /// RoCEmu, tcpdump on [`BRIDGE`], …
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }

    /// `--dev` for RoCEmu on its veth: `af_packet:rxeh0` (its address is [`HostSide::ip`]).
    pub fn rocemu_dev(&self) -> String {
        format!("af_packet:{}", self.host.ifname)
    }

    /// The lab as JSON (what `rocemu rxevm up --json` prints and the state file holds).
    pub fn info(&self) -> Value {
        json!({
            "ns": self.ns,
            "dir": self.dir,
            "owner_pid": std::process::id(),
            "owner_start": proc_start_time(std::process::id()),
            "detached": self.detached,
            "mtu": self.mtu,
            "prefix_len": self.prefix_len,
            "bridge": { "ifname": BRIDGE, "ip": self.bridge_ip.to_string() },
            "host": { "ifname": self.host.ifname, "ip": self.host.ip.to_string(), "mac": self.host.mac },
            "kernel": self.guest.kernel,
            "vms": self.vms.iter().map(|v| json!({
                "name": v.name, "ip": v.ip.to_string(), "mac": v.mac, "tap": v.tap,
                "pid": v.pid, "ctl_port": v.ctl.addr.port(), "serial_log": v.serial_log,
            })).collect::<Vec<_>>(),
        })
    }

    fn write_state(&self) -> Result<(), String> {
        let s = serde_json::to_string_pretty(&self.info()).map_err(|e| e.to_string())?;
        write_atomic(&self.dir.join("state.json"), s.as_bytes())
    }

    /// Leaves the lab running after this value is gone (`rocemu rxevm up`); [`down`] stops it.
    pub fn detach(mut self) -> Result<(), String> {
        self.detached = true;
        self.write_state()?;
        for vm in &mut self.vms {
            vm.child = None;
        }
        if let Some(n) = self.netns.take() {
            std::mem::forget(n);
        }
        Ok(())
    }
}

impl Drop for RxeLab {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        let panicking = std::thread::panicking();
        for vm in &mut self.vms {
            if panicking {
                eprintln!(
                    "rxevm: {} ({}) serial console, last lines:\n{}",
                    vm.name,
                    self.ns,
                    tail(&vm.serial(), 25)
                );
            }
            if let Some(mut c) = vm.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        drop(self.netns.take()); // deletes the namespace, its bridge, taps and veth
        if panicking {
            eprintln!(
                "rxevm: lab {} cleaned up; its logs stay in {} until the next lab starts",
                self.ns,
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---- processes, stale labs, `down` -------------------------------------------------------------

/// Effective UID 0, from /proc (no libc call, no unsafe).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

fn ns_exists(name: &str) -> bool {
    Path::new("/var/run/netns").join(name).exists() || Path::new("/run/netns").join(name).exists()
}

/// Field 22 of /proc/PID/stat (start time in clock ticks): tells a process from a later one
/// with the same PID.
fn proc_start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn pid_alive(pid: u32) -> bool {
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
fn kill_qemu(pid: u32, marker: &str) {
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

fn read_state(dir: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).ok()?).ok()
}

/// Kills a lab's VMs (by recorded PID), deletes its namespace and folder.
fn teardown(dir: &Path, st: &Value) {
    for vm in st["vms"].as_array().into_iter().flatten() {
        if let (Some(pid), Some(log)) = (vm["pid"].as_u64(), vm["serial_log"].as_str()) {
            kill_qemu(pid as u32, log);
        }
    }
    if let Some(ns) = st["ns"].as_str() {
        if ns_exists(ns) {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Tears down the labs in `workdir` whose owner is gone without cleaning up (killed, aborted),
/// and removes the folders that failed tests left for inspection.
pub fn reap_stale(workdir: &Path) {
    let Ok(rd) = std::fs::read_dir(workdir.join("labs")) else {
        return;
    };
    for e in rd.flatten() {
        let dir = e.path();
        let Some(st) = read_state(&dir) else { continue };
        if st["detached"].as_bool() == Some(true) {
            continue;
        }
        let owner = st["owner_pid"].as_u64().unwrap_or(0) as u32;
        let alive = pid_alive(owner) && proc_start_time(owner) == st["owner_start"].as_u64();
        if !alive {
            if st["ns"].as_str().is_some_and(ns_exists) {
                eprintln!(
                    "rxevm: reaping lab {} (its owner, PID {owner}, is gone)",
                    st["ns"].as_str().unwrap_or("?")
                );
            }
            teardown(&dir, &st);
        }
    }
}

/// Stops lab `ns` of `workdir`, detached or not: kills its VMs by recorded PID, deletes the
/// namespace and the lab's folder. Returns whether there was anything to stop.
pub fn down(workdir: &Path, ns: &str) -> bool {
    let dir = workdir.join("labs").join(ns);
    let st = read_state(&dir);
    let found = st.is_some() || ns_exists(ns);
    let st = st.unwrap_or_else(|| json!({ "ns": ns }));
    teardown(&dir, &st);
    found
}

// ---- the CLI -------------------------------------------------------------------------------------

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

/// `rocemu rxevm ARGS`: `args` are the words after `rxevm` (`["up", "--vms", "2"]`). Returns the
/// exit status, or an error to print.
pub fn cli(args: &[String]) -> Result<i32, String> {
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
        return Ok(2);
    };
    fn val<'a>(it: &mut std::slice::Iter<'a, String>, o: &str) -> Result<&'a str, String> {
        it.next()
            .map(String::as_str)
            .ok_or_else(|| format!("{o} wants a value"))
    }
    fn num<T: std::str::FromStr>(s: &str, o: &str) -> Result<T, String> {
        s.parse().map_err(|_| format!("{o}: bad value {s:?}"))
    }
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
                return Ok(0);
            }
            o if o.starts_with("--") => return Err(format!("unknown option {o}\n{USAGE}")),
            _ => pos.push(a.clone()),
        }
    }
    let ns = cfg.ns.clone().unwrap_or_else(|| CLI_NS.into());
    let labdir = cfg.workdir.join("labs").join(&ns);
    match cmd.as_str() {
        "up" => {
            if let Some(st) = read_state(&labdir) {
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
                teardown(&labdir, &st);
            }
            let lab = RxeLab::start(&cfg)?;
            if json_out {
                let mut v = lab.info();
                v["detached"] = json!(true);
                println!("{v:#}");
            } else {
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
            lab.detach()?;
            Ok(0)
        }
        "down" => {
            if down(&cfg.workdir, &ns) {
                println!("lab {ns}: down");
            } else {
                println!("lab {ns}: not up");
            }
            Ok(0)
        }
        "exec" => {
            if pos.len() < 2 {
                return Err(format!("exec wants a VM and a command\n{USAGE}"));
            }
            let st = read_state(&labdir)
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
            let o = ctl.exec_timeout(&pos[1..].join(" "), timeout)?;
            print!("{}", o.stdout);
            eprint!("{}", o.stderr);
            let _ = std::io::stdout().flush();
            Ok(o.status)
        }
        "status" => {
            let st = read_state(&labdir).ok_or_else(|| format!("lab {ns} is not up"))?;
            let mut st = st;
            for v in st["vms"].as_array_mut().into_iter().flatten() {
                let alive = v["pid"].as_u64().is_some_and(|p| pid_alive(p as u32));
                v["alive"] = json!(alive);
            }
            st["ns_exists"] = json!(ns_exists(&ns));
            println!("{st:#}");
            Ok(0)
        }
        "build" => {
            let g = build_guest(&cfg.workdir)?;
            println!(
                "guest {} (kernel {}): {}, {}",
                g.dir.display(),
                g.kernel,
                g.vmlinuz.display(),
                g.initrd.display()
            );
            Ok(0)
        }
        o => Err(format!("unknown command {o}\n{USAGE}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_checks_addresses_and_limits() {
        let ok = LabConfig::default();
        assert!(ok.check().is_ok());
        assert_eq!(ok.vm_ip(1), Ipv4Addr::new(10, 99, 0, 12));
        for bad in [
            LabConfig {
                vms: 0,
                ..ok.clone()
            },
            LabConfig {
                mtu: 100,
                ..ok.clone()
            },
            LabConfig {
                host_ip: Ipv4Addr::new(10, 98, 0, 2),
                ..ok.clone()
            },
            LabConfig {
                host_ip: Ipv4Addr::new(10, 99, 0, 11),
                ..ok.clone()
            },
            LabConfig {
                first_vm_ip: Ipv4Addr::new(10, 99, 0, 254),
                vms: 2,
                ..ok.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn quoting_and_tails() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(find_last(b"xaxbxa", b"xa"), Some(4));
        assert_eq!(tail("1\n2\n3\n", 2), "2\n3\n");
        assert_eq!(tail("", 2), "");
        assert_eq!(short("a\n  b"), "a b");
    }
}
