//! The agent server: serves the JSON-lines protocol for a RoCEmu RNIC (`rocemu agent`).
//!
//! The RNIC must keep turning while a client thinks (it answers the peer's frames, its timers
//! fire), and a DPDK port may only be polled from the thread that opened it. So the thread
//! that calls [`serve`] owns the [`Backend`] and turns it, and a second thread does the socket
//! I/O and hands each request over as a job (the shape of `rocemu_tools::remote::serve`).
//! `poll_cq` with a wait is a loop of non-waiting polls on the I/O side, so the RNIC never
//! blocks. Clients are served one at a time; when one goes away, what it created is reset.
//! Between jobs the RNIC's thread also turns the agent's rdma_cm service (`cm_listen`), so that
//! connection requests are answered while the client thinks, as a librdmacm server would.
use super::json::{parse_line, response_json};
use super::rnic::{execute, Objects};
use super::*;
use rocemu_emulator::engine::Engine;
use rocemu_emulator::rnic::Rnic;
use rocemu_emulator::Nanos;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::mpsc;
use std::time::Instant;

/// An RNIC and whatever moves its frames.
pub trait Backend {
    fn rnic(&mut self) -> &mut Rnic;
    /// One turn of the datapath (receive, timers, transmit), idling as the backend sees fit.
    fn turn(&mut self);
    /// Called before `req` runs: a backend on a real port resolves the MAC of an address
    /// handle's GID here, as ibverbs does when it creates the AH.
    fn prepare(&mut self, req: &Request) -> AgentResult<()> {
        let _ = req;
        Ok(())
    }
    /// Turns the agent's rdma_cm service ([`Objects::turn_cm`]) on this backend's clock,
    /// resolving the peers it answers as the backend can.
    fn turn_cm(&mut self, objs: &mut Objects);
}

/// An RNIC whose frames go nowhere: the protocol without a datapath (tests, trying it out).
#[derive(Debug)]
pub struct NullBackend {
    pub rnic: Rnic,
    start: Instant,
    buf: Vec<u8>,
}

impl NullBackend {
    pub fn new(rnic: Rnic) -> NullBackend {
        NullBackend {
            rnic,
            start: Instant::now(),
            buf: vec![0; 10_000],
        }
    }
}

impl Backend for NullBackend {
    fn rnic(&mut self) -> &mut Rnic {
        &mut self.rnic
    }
    fn turn(&mut self) {
        let now = Nanos(self.start.elapsed().as_nanos() as u64);
        self.rnic.handle_timeout(now);
        while self.rnic.poll_transmit(now, &mut self.buf).is_some() {}
        std::thread::sleep(Duration::from_micros(200));
    }
    fn turn_cm(&mut self, objs: &mut Objects) {
        let now = Nanos(self.start.elapsed().as_nanos() as u64);
        objs.turn_cm(&mut self.rnic, now, &mut |_, ip| {
            Err(format!("no datapath to reach {ip}"))
        });
    }
}

/// An RNIC on a port, turned by the engine (`rocemu agent --dev af_packet:…|dpdk:…`).
#[derive(Debug)]
pub struct EngineBackend {
    pub rnic: Rnic,
    pub engine: Engine,
}

impl EngineBackend {
    /// Resolves the MAC of `ip` the way ibverbs does when it creates an address handle.
    fn resolve(&mut self, ip: std::net::IpAddr) -> AgentResult<()> {
        self.engine
            .resolve(&mut self.rnic, ip, Duration::from_secs(3))
            .map(|_| ())
            .map_err(AgentError)
    }
}

impl Backend for EngineBackend {
    fn rnic(&mut self) -> &mut Rnic {
        &mut self.rnic
    }
    fn turn(&mut self) {
        let w = self.engine.poll(&mut self.rnic);
        self.engine.idle(w);
    }
    fn turn_cm(&mut self, objs: &mut Objects) {
        let now = self.engine.now();
        let engine = &mut self.engine;
        objs.turn_cm(&mut self.rnic, now, &mut |rnic, ip| {
            engine.resolve(rnic, ip, Duration::from_secs(3)).map(|_| ())
        });
    }
    fn prepare(&mut self, req: &Request) -> AgentResult<()> {
        match req {
            Request::ModifyQp { attr, .. } => match attr.ah {
                Some(ah) => self.resolve(ah.dgid),
                None => Ok(()),
            },
            Request::PostSend { wr, .. } => match wr.ud {
                Some(u) => self.resolve(u.ah.dgid),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

/// Where the server listens: `tcp:HOST:PORT` or `unix:PATH`.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    pub fn bind(spec: &str) -> Result<Listener, String> {
        if let Some(p) = spec.strip_prefix("unix:") {
            // A socket file left by an earlier run would make bind fail.
            if std::fs::metadata(p).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_socket()
            }) {
                let _ = std::fs::remove_file(p);
            }
            UnixListener::bind(p)
                .map(Listener::Unix)
                .map_err(|e| format!("--listen {spec}: {e}"))
        } else if let Some(a) = spec.strip_prefix("tcp:") {
            TcpListener::bind(a)
                .map(Listener::Tcp)
                .map_err(|e| format!("--listen {spec}: {e}"))
        } else {
            Err(format!("--listen {spec}: give tcp:HOST:PORT or unix:PATH"))
        }
    }

    /// The address it is bound to, in the form `bind` takes.
    pub fn local(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| format!("tcp:{a}"))
                .unwrap_or_else(|_| "tcp:?".into()),
            Listener::Unix(l) => l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
                .unwrap_or_else(|| "unix:?".into()),
        }
    }

    fn accept(&self) -> std::io::Result<(Box<dyn Read + Send>, Box<dyn Write + Send>)> {
        Ok(match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                let _ = s.set_nodelay(true);
                (Box::new(s.try_clone()?), Box::new(s))
            }
            Listener::Unix(l) => {
                let (s, _) = l.accept()?;
                (Box::new(s.try_clone()?), Box::new(s))
            }
        })
    }
}

/// A request line longer than this is refused (and the connection closed): no client needs it,
/// and a runaway one must not exhaust memory.
const MAX_LINE: u64 = 1 << 20;

type Job = (Request, mpsc::Sender<AgentResult<Reply>>);

/// Serves `clients` connections one after the other (forever when `None`), running every
/// request on `backend` on this thread. Returns when the last client has gone.
pub fn serve(listener: &Listener, backend: &mut dyn Backend, clients: Option<usize>) {
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut served = 0;
            while clients.is_none_or(|n| served < n) {
                match listener.accept() {
                    Ok((r, w)) => {
                        serve_client(r, w, &tx);
                        let (rtx, _rrx) = mpsc::channel();
                        let _ = tx.send((Request::Reset, rtx));
                    }
                    Err(e) => {
                        eprintln!("rocemu agent: accept: {e}");
                        // Do not spin on a listener that keeps failing.
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
                served += 1;
            }
        });
        let mut objs = Objects::default();
        loop {
            match rx.try_recv() {
                Ok((req, reply)) => {
                    let r = backend
                        .prepare(&req)
                        .and_then(|()| execute(backend.rnic(), &mut objs, req));
                    let _ = reply.send(r);
                }
                Err(mpsc::TryRecvError::Empty) => {
                    backend.turn();
                    backend.turn_cm(&mut objs);
                }
                Err(mpsc::TryRecvError::Disconnected) => break,
            }
        }
    });
}

/// Runs `req` on the backend's thread; `poll_cq` polls until it has `min` completions or its
/// wait is over.
fn run(tx: &mpsc::Sender<Job>, req: Request) -> AgentResult<Reply> {
    let once = |req: Request| -> AgentResult<Reply> {
        let (rtx, rrx) = mpsc::channel();
        tx.send((req, rtx))
            .map_err(|_| AgentError::from("the RNIC's thread has stopped"))?;
        rrx.recv()
            .map_err(|_| AgentError::from("the RNIC's thread has stopped"))?
    };
    let Request::PollCq {
        cq,
        max,
        min,
        wait_ms,
    } = req
    else {
        return once(req);
    };
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut got = Vec::new();
    loop {
        let left = max.saturating_sub(got.len() as u32);
        if let Reply::Wcs(w) = once(Request::PollCq {
            cq,
            max: left,
            min: 0,
            wait_ms: 0,
        })? {
            got.extend(w);
        }
        if got.len() as u32 >= min.min(max) || Instant::now() >= deadline {
            return Ok(Reply::Wcs(got));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn serve_client(r: Box<dyn Read + Send>, mut w: Box<dyn Write + Send>, tx: &mpsc::Sender<Job>) {
    let mut reader = BufReader::new(r);
    loop {
        let mut buf = Vec::new();
        match reader
            .by_ref()
            .take(MAX_LINE + 1)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                eprintln!("rocemu agent: read: {e}");
                return;
            }
        }
        let too_long = buf.len() as u64 > MAX_LINE;
        let line = String::from_utf8_lossy(&buf);
        if line.trim().is_empty() {
            continue;
        }
        let resp = if too_long {
            response_json(
                serde_json::Value::Null,
                &Err(AgentError(format!(
                    "request line longer than {MAX_LINE} bytes"
                ))),
            )
        } else {
            let (id, req) = parse_line(&line);
            let r = req.map_err(AgentError).and_then(|req| run(tx, req));
            response_json(id, &r)
        };
        if writeln!(w, "{resp}").and_then(|_| w.flush()).is_err() || too_long {
            return;
        }
    }
}
