//! The control channel into a VM: an unauthenticated shell on TCP, reached from inside the lab's
//! namespace; [`Ctl`] runs commands through it, [`Bg`] is a command left running in the VM.
//!
//! Invariants:
//! * Every connection is made from a thread that joined the lab's namespace (the socket keeps
//!   the namespace it was made in); nothing outside the namespace can reach the channel.
//! * A command runs in a session (and process group) of its own in the VM, so a timeout can
//!   kill all of it; its stdout, stderr and status come back apart, framed by a per-call marker.
//! * A background job's files live in `/tmp/rxevm-bg/<id>.*` in the VM; its exit status is
//!   written atomically (`.rc.tmp` then `mv`), so a status read is never half written.
use super::{find_last, nonce, sh_quote, short, tail, EXEC_TIMEOUT};
use crate::netns;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

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
