//! The JSON-lines client: an [`Agent`] that sends each request to an agent process (`rocemu
//! agent`, or the libibverbs agent in the rdma_rxe VM) and waits for its answer.
use super::json::{reply_of, request_json};
use super::*;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;

/// A stream the protocol can run over.
trait Stream: std::io::Read + Write + Send {
    fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
}

impl Stream for TcpStream {
    fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(t)
    }
}

impl Stream for UnixStream {
    fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(t)
    }
}

/// An agent at the other end of a socket.
pub struct JsonClient {
    reader: BufReader<Box<dyn Stream>>,
    addr: String,
    next_id: u64,
    /// The protocol version agreed in `hello`.
    version: u32,
}

impl std::fmt::Debug for JsonClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonClient")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// How long an agent may take over a request on top of the wait it was asked for.
const SLACK: Duration = Duration::from_secs(10);

impl JsonClient {
    /// Connects to `unix:PATH`, `tcp:HOST:PORT` or `HOST:PORT`, and agrees on the protocol
    /// version with `hello`: this client's, or, with an agent that refuses it, the oldest one
    /// (version 1, without the rdma_cm operations: requests for them then fail here, saying
    /// so).
    pub fn connect(addr: &str) -> AgentResult<JsonClient> {
        let stream: Box<dyn Stream> = if let Some(p) = addr.strip_prefix("unix:") {
            Box::new(
                UnixStream::connect(p).map_err(|e| AgentError(format!("agent at {addr}: {e}")))?,
            )
        } else {
            let a = addr.strip_prefix("tcp:").unwrap_or(addr);
            let s =
                TcpStream::connect(a).map_err(|e| AgentError(format!("agent at {addr}: {e}")))?;
            let _ = s.set_nodelay(true);
            Box::new(s)
        };
        let mut c = JsonClient {
            reader: BufReader::new(stream),
            addr: addr.to_string(),
            next_id: 1,
            version: MIN_PROTOCOL_VERSION,
        };
        let mut asked = PROTOCOL_VERSION;
        let mut refusals = Vec::new();
        let h = loop {
            match c.call(Request::Hello { version: asked }) {
                Ok(Reply::Hello(h)) => break h,
                Ok(r) => return unexpected(r),
                Err(e) => {
                    refusals.push(format!("version {asked}: {e}"));
                    if asked == MIN_PROTOCOL_VERSION {
                        return Err(AgentError(refusals.join("; ")));
                    }
                    asked -= 1;
                }
            }
        };
        if h.version != asked {
            return Err(AgentError(format!(
                "agent at {addr} answered hello for protocol version {asked} with version {}",
                h.version
            )));
        }
        c.version = asked;
        Ok(c)
    }

    /// The protocol version agreed with the agent.
    pub fn version(&self) -> u32 {
        self.version
    }
}

impl Agent for JsonClient {
    fn call(&mut self, req: Request) -> AgentResult<Reply> {
        if req.since_version() > self.version {
            return Err(AgentError(format!(
                "{}: the agent at {} speaks protocol version {}, {} needs version {}",
                req.op(),
                self.addr,
                self.version,
                req.op(),
                req.since_version()
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        let wait = match &req {
            Request::PollCq { wait_ms, .. } => Duration::from_millis(*wait_ms),
            _ => Duration::ZERO,
        };
        let mut v = request_json(&req);
        if let Some(o) = v.as_object_mut() {
            o.insert("id".into(), id.into());
        }
        let lost = |e: std::io::Error| AgentError(format!("agent at {}: {e}", self.addr));
        let s = self.reader.get_mut();
        s.set_timeout(Some(wait + SLACK)).map_err(lost)?;
        writeln!(s, "{v}").map_err(lost)?;
        s.flush().map_err(lost)?;
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).map_err(lost)?;
        if n == 0 {
            return Err(AgentError(format!(
                "agent at {} closed the connection",
                self.addr
            )));
        }
        let v: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| AgentError(format!("agent at {}: bad response line: {e}", self.addr)))?;
        if v.get("id").and_then(|i| i.as_u64()) != Some(id) {
            return Err(AgentError(format!(
                "agent at {}: response to request {id} carries id {}",
                self.addr,
                v.get("id").cloned().unwrap_or_default()
            )));
        }
        reply_of(req.op(), &v)
    }
}
