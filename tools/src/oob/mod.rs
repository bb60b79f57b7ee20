//! The out-of-band TCP exchanges of rdma-core's `ibv_rc_pingpong` ([`rc_pingpong`]) and of
//! perftest's `ib_*_bw` / `ib_*_lat` ([`perftest`]), byte for byte, so that RoCEmu can be either
//! end against the real tools, and `imm_pingpong --op write`'s variant of the first
//! ([`imm_pingpong`]). The two are unrelated protocols; this module holds what they share: the errors, the deadlines and `MsgStream`, a TCP connection that carries whole
//! fixed-length messages.
//!
//! Invariants: std only, blocking [`std::net`] sockets; every read and write has a deadline
//! ([`OobConfig::io_timeout`], changeable per connection), so a dead peer gives
//! [`OobErrorKind::Timeout`] instead of a hang; every failure is an [`OobError`] with a readable
//! message, never a panic; each message goes out in one `write` (the C tools read each with a
//! single `read` that must return all of it).
//!
//! Reference versions (Debian 12): rdma-core 44.0 (`ibverbs-utils 44.0-2`) and perftest
//! `4.5+0.17-1` (upstream tag `v4.5-0.17`; its binaries call themselves version **6.06**, the
//! `VERSION` that `configure.ac`'s `AC_INIT` sets, and that string is what goes on the wire).
//! Written from a reading of `libibverbs/examples/{rc_pingpong,pingpong}.c` and of perftest's
//! `src/{perftest_communication,perftest_parameters,perftest_resources}.c` and
//! `src/{write,read,send,atomic}_{bw,lat}.c`; none of their code is used here.
pub mod imm_pingpong;
pub mod perftest;
pub mod rc_pingpong;

pub use perftest::*;
pub use rc_pingpong::*;

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Port both tools use when `-p` is not given.
pub const DEFAULT_PORT: u16 = 18515;

// --------------------------------------------------------------------------------------------
// Errors and configuration
// --------------------------------------------------------------------------------------------

/// What went wrong in an out-of-band exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OobErrorKind {
    /// A socket error (connect, accept, read, write).
    Io,
    /// A deadline passed ([`OobConfig`]).
    Timeout,
    /// The peer closed (or reset) the connection before the exchange finished.
    Closed,
    /// The peer sent something that is not the expected message.
    Malformed,
    /// The peer is a version this exchange refuses (perftest < 5.70).
    Incompatible,
    /// An argument given to this module is out of range (for example an MTU that is not a power
    /// of two between 256 and 4096).
    InvalidInput,
    /// The caller's callback (for example moving the QP to RTR/RTS) reported an error.
    Callback,
}

/// An out-of-band exchange error: a kind and a readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OobError {
    kind: OobErrorKind,
    message: String,
}

impl OobError {
    pub(crate) fn new(kind: OobErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> OobErrorKind {
        self.kind
    }

    /// The readable message (also what `Display` prints).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for OobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OobError {}

/// Result of this module's operations.
pub type OobResult<T> = Result<T, OobError>;

pub(crate) fn malformed(message: impl Into<String>) -> OobError {
    OobError::new(OobErrorKind::Malformed, message)
}

pub(crate) fn invalid(message: impl Into<String>) -> OobError {
    OobError::new(OobErrorKind::InvalidInput, message)
}

/// Timeouts of the out-of-band exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OobConfig {
    /// Deadline for each message (a whole read or a whole write); `None` waits forever.
    /// Default 60 s. A perftest server waits in a read for the whole duration of the client's
    /// run, see [`PerftestConn::set_io_timeout`].
    pub io_timeout: Option<Duration>,
    /// How long a server waits for a client to connect; `None` (the default) waits forever,
    /// like the C tools.
    pub accept_timeout: Option<Duration>,
    /// How long a client keeps trying to connect (a refused connection is retried every 50 ms
    /// until then; the C tools try once). At least one attempt is always made. Default 10 s.
    pub connect_timeout: Duration,
}

impl Default for OobConfig {
    fn default() -> Self {
        Self {
            io_timeout: Some(Duration::from_secs(60)),
            accept_timeout: None,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl OobConfig {
    /// The same deadline for every message, accept and connect.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            io_timeout: Some(timeout),
            accept_timeout: Some(timeout),
            connect_timeout: timeout,
        }
    }
}

/// Binds the TCP listener a server uses: `0.0.0.0:port` (perftest binds AF_INET only).
/// `port` 0 picks a free port.
pub fn listen(port: u16) -> OobResult<TcpListener> {
    TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
        OobError::new(
            OobErrorKind::Io,
            format!("couldn't listen on TCP port {port}: {e}"),
        )
    })
}

/// Connects to `addr`, retrying refused attempts until `cfg.connect_timeout`.
pub(crate) fn connect_stream(addr: impl ToSocketAddrs, cfg: &OobConfig) -> OobResult<TcpStream> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| {
            OobError::new(
                OobErrorKind::Io,
                format!("couldn't resolve the server address: {e}"),
            )
        })?
        .collect();
    if addrs.is_empty() {
        return Err(OobError::new(
            OobErrorKind::Io,
            "the server address resolved to nothing",
        ));
    }
    let deadline = Instant::now() + cfg.connect_timeout;
    loop {
        let mut last = None;
        for a in &addrs {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(200));
            match TcpStream::connect_timeout(a, left) {
                Ok(s) => {
                    // Small messages, one write each: don't let Nagle hold any of them back.
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last = Some((*a, e)),
            }
        }
        if Instant::now() >= deadline {
            let (a, e) = last.expect("at least one address was tried");
            let kind = if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) {
                OobErrorKind::Timeout
            } else {
                OobErrorKind::Io
            };
            return Err(OobError::new(kind, format!("couldn't connect to {a}: {e}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Accepts one connection, waiting at most `cfg.accept_timeout`.
pub(crate) fn accept_stream(listener: &TcpListener, cfg: &OobConfig) -> OobResult<TcpStream> {
    let io = |e: std::io::Error| OobError::new(OobErrorKind::Io, format!("accept() failed: {e}"));
    let stream = match cfg.accept_timeout {
        None => listener.accept().map_err(io)?.0,
        Some(t) => {
            listener.set_nonblocking(true).map_err(io)?;
            let deadline = Instant::now() + t;
            let got = loop {
                match listener.accept() {
                    Ok((s, _)) => break Ok(s),
                    Err(e)
                        if e.kind() == ErrorKind::WouldBlock
                            || e.kind() == ErrorKind::Interrupted =>
                    {
                        if Instant::now() >= deadline {
                            break Err(OobError::new(
                                OobErrorKind::Timeout,
                                format!("no client connected within {:.1} s", t.as_secs_f64()),
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => break Err(io(e)),
                }
            };
            let _ = listener.set_nonblocking(false);
            got?
        }
    };
    stream.set_nonblocking(false).map_err(io)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A connected TCP socket that carries whole fixed-length messages, each read or written before
/// a deadline (what both tools' exchanges are made of).
#[derive(Debug)]
pub(crate) struct MsgStream {
    pub(crate) stream: TcpStream,
    pub(crate) timeout: Option<Duration>,
}

impl MsgStream {
    pub(crate) fn new(stream: TcpStream, timeout: Option<Duration>) -> Self {
        Self { stream, timeout }
    }

    fn timeout_text(&self) -> String {
        match self.timeout {
            Some(t) => format!("{:.1} s", t.as_secs_f64()),
            None => "ever".to_string(),
        }
    }

    /// Writes `msg` with a single `write_all` (one `write` call for these small messages).
    pub(crate) fn send(&mut self, msg: &[u8], what: &str) -> OobResult<()> {
        // A zero timeout is an error for the socket: use the smallest real one instead.
        let set = self.timeout.map(|t| t.max(Duration::from_millis(1)));
        self.stream
            .set_write_timeout(set)
            .map_err(|e| OobError::new(OobErrorKind::Io, format!("sending {what}: {e}")))?;
        let r = self
            .stream
            .write_all(msg)
            .and_then(|()| self.stream.flush());
        r.map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => OobError::new(
                OobErrorKind::Timeout,
                format!(
                    "timed out after {} sending {what} ({} bytes)",
                    self.timeout_text(),
                    msg.len()
                ),
            ),
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => {
                OobError::new(
                    OobErrorKind::Closed,
                    format!("the peer closed the connection before {what} could be sent: {e}"),
                )
            }
            _ => OobError::new(OobErrorKind::Io, format!("sending {what}: {e}")),
        })
    }

    /// Reads exactly `len` bytes before the deadline.
    pub(crate) fn recv(&mut self, len: usize, what: &str) -> OobResult<Vec<u8>> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let read_timeout = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(self.recv_timeout(what, got, len));
                    }
                    Some(d - now)
                }
                None => None,
            };
            self.stream
                .set_read_timeout(read_timeout)
                .map_err(|e| OobError::new(OobErrorKind::Io, format!("reading {what}: {e}")))?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(OobError::new(
                        OobErrorKind::Closed,
                        format!("the peer closed the connection after {got} of the {len} bytes of {what}"),
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(self.recv_timeout(what, got, len))
                }
                Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => {
                    return Err(OobError::new(
                        OobErrorKind::Closed,
                        format!("the peer reset the connection after {got} of the {len} bytes of {what}: {e}"),
                    ))
                }
                Err(e) => return Err(OobError::new(OobErrorKind::Io, format!("reading {what}: {e}"))),
            }
        }
        Ok(buf)
    }

    fn recv_timeout(&self, what: &str, got: usize, len: usize) -> OobError {
        OobError::new(
            OobErrorKind::Timeout,
            format!(
                "timed out after {} waiting for {what} ({got} of {len} bytes received)",
                self.timeout_text()
            ),
        )
    }

    /// Reads whatever the peer still sends until it closes, for at most `limit` (errors ignored):
    /// lets a closing side consume the peer's "done" so that its own close is a clean FIN.
    pub(crate) fn drain(&mut self, limit: Duration) -> Vec<u8> {
        let deadline = Instant::now() + limit;
        let mut out = Vec::new();
        let mut buf = [0u8; 64];
        while out.len() < 4096 {
            let now = Instant::now();
            if now >= deadline || self.stream.set_read_timeout(Some(deadline - now)).is_err() {
                break;
            }
            match self.stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        out
    }
}

// --------------------------------------------------------------------------------------------
// Small text helpers
// --------------------------------------------------------------------------------------------

/// Shows a received message in an error: printable ASCII as is, the rest escaped.
pub(crate) fn show(msg: &[u8]) -> String {
    let mut s = String::new();
    for &b in msg.iter().take(160) {
        match b {
            0 => s.push_str("\\0"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    if msg.len() > 160 {
        s.push('…');
    }
    s
}

/// The text of a C string message: the bytes before the first NUL, which must be ASCII.
pub(crate) fn c_text<'a>(msg: &'a [u8], what: &str) -> OobResult<&'a str> {
    let end = msg
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| malformed(format!("{what} has no terminating NUL: \"{}\"", show(msg))))?;
    let text = &msg[..end];
    if !text.iter().all(|b| b.is_ascii_graphic()) {
        return Err(malformed(format!(
            "{what} is not printable text: \"{}\"",
            show(msg)
        )));
    }
    // All bytes are ASCII graphic characters, so this cannot fail.
    std::str::from_utf8(text).map_err(|_| malformed(format!("{what} is not text")))
}

/// One hexadecimal field (1 to 16 digits, no prefix) not above `max`.
pub(crate) fn hex_field(
    field: &str,
    max: u64,
    name: &str,
    what: &str,
    msg: &[u8],
) -> OobResult<u64> {
    let bad = || {
        malformed(format!(
            "{what}: {name} \"{field}\" is not a hex number up to {max:#x} in \"{}\"",
            show(msg)
        ))
    };
    if field.is_empty() || field.len() > 16 || !field.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let v = u64::from_str_radix(field, 16).map_err(|_| bad())?;
    if v > max {
        return Err(bad());
    }
    Ok(v)
}

pub(crate) fn check_len(msg: &[u8], len: usize, what: &str) -> OobResult<()> {
    if msg.len() != len {
        return Err(malformed(format!(
            "{what} must be {len} bytes, got {}: \"{}\"",
            msg.len(),
            show(msg)
        )));
    }
    Ok(())
}

pub(crate) const MASK24: u32 = 0x00ff_ffff;

/// What the tests of both exchanges share: a local listener, GIDs, and a scripted raw peer.
#[cfg(test)]
pub(crate) mod testutil {
    use super::*;

    pub(crate) fn cfg() -> OobConfig {
        OobConfig::with_timeout(Duration::from_secs(10))
    }

    pub(crate) fn local_listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }

    pub(crate) fn v4_gid(a: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    /// A scripted raw peer: what a C tool would write and read, byte for byte.
    pub(crate) enum Step {
        Send(Vec<u8>),
        Expect(Vec<u8>),
        ExpectEof,
    }

    pub(crate) fn run_script(mut s: TcpStream, steps: Vec<Step>) -> Result<(), String> {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Step::Send(b) => s
                    .write_all(&b)
                    .map_err(|e| format!("step {i}: write: {e}"))?,
                Step::Expect(b) => {
                    let mut got = vec![0u8; b.len()];
                    s.read_exact(&mut got)
                        .map_err(|e| format!("step {i}: read {} bytes: {e}", b.len()))?;
                    if got != b {
                        return Err(format!(
                            "step {i}: expected \"{}\", got \"{}\"",
                            show(&b),
                            show(&got)
                        ));
                    }
                }
                Step::ExpectEof => {
                    let mut b = [0u8; 16];
                    match s.read(&mut b) {
                        Ok(0) => {}
                        Ok(n) => {
                            return Err(format!(
                                "step {i}: expected EOF, got \"{}\"",
                                show(&b[..n])
                            ))
                        }
                        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
                        Err(e) => return Err(format!("step {i}: expected EOF: {e}")),
                    }
                }
            }
        }
        Ok(())
    }
}
