//! The reader's side: which devices run ([`list`]), which one a name means ([`find`]), and one
//! question to one of them ([`ask`]).
use super::{Request, CLIENT_TIMEOUT, MAX_REPLY};
use serde_json::Value;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A device's socket, as its file name tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub pid: u32,
    pub path: PathBuf,
}

impl Entry {
    /// `NAME@PID`: how a device is named when its name alone is ambiguous.
    pub fn id(&self) -> String {
        format!("{}@{}", self.name, self.pid)
    }
}

/// `NAME@PID.sock` → (NAME, PID).
pub fn parse_file_name(f: &str) -> Option<(String, u32)> {
    let stem = f.strip_suffix(".sock")?;
    let (name, pid) = stem.rsplit_once('@')?;
    let pid: u32 = pid.parse().ok()?;
    (!name.is_empty() && pid > 0).then(|| (name.to_string(), pid))
}

fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// The devices whose sockets are in `dir`, by name then PID; the sockets of processes that are
/// gone are removed on the way. No directory: none.
pub fn list(dir: &Path) -> Result<Vec<Entry>, String> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let f = e.file_name();
        let Some((name, pid)) = f.to_str().and_then(parse_file_name) else {
            continue;
        };
        let path = e.path();
        if !alive(pid) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        out.push(Entry { name, pid, path });
    }
    out.sort_by(|a, b| (&a.name, a.pid).cmp(&(&b.name, b.pid)));
    Ok(out)
}

/// The device `spec` names among `entries`: `NAME@PID`, or a NAME only one device has.
pub fn find<'a>(entries: &'a [Entry], spec: &str, dir: &Path) -> Result<&'a Entry, String> {
    if let Some(e) = entries.iter().find(|e| e.id() == spec) {
        return Ok(e);
    }
    let same: Vec<&Entry> = entries.iter().filter(|e| e.name == spec).collect();
    match same.as_slice() {
        [e] => Ok(e),
        [] => {
            let running: Vec<String> = entries.iter().map(Entry::id).collect();
            Err(if running.is_empty() {
                format!(
                    "no device {spec}: no RoCEmu device is running (none has a socket in {})",
                    dir.display()
                )
            } else {
                format!(
                    "no device {spec}; running: {} (`rocemu stats` lists them)",
                    running.join(", ")
                )
            })
        }
        many => Err(format!(
            "{spec} is ambiguous: {} are running; give NAME@PID",
            many.iter().map(|e| e.id()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// Why a question got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskError {
    /// Nobody listens on the socket (its process is gone, or not a device's): removed.
    Refused,
    /// The connection failed otherwise, or the reply was not one JSON line.
    Io(String),
    /// The device answered with an error.
    Device(String),
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::Refused => {
                write!(f, "the socket refused the connection (its process is gone)")
            }
            AskError::Io(e) => write!(f, "{e}"),
            AskError::Device(e) => write!(f, "the device says: {e}"),
        }
    }
}

/// Asks the device at `path` one question and returns its reply (a JSON object).
pub fn ask(path: &Path, req: Request) -> Result<Value, AskError> {
    let mut s = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
            ) =>
        {
            let _ = std::fs::remove_file(path);
            return Err(AskError::Refused);
        }
        Err(e) => return Err(AskError::Io(format!("{}: {e}", path.display()))),
    };
    let io = |e: std::io::Error| AskError::Io(format!("{}: {e}", path.display()));
    s.set_write_timeout(Some(CLIENT_TIMEOUT)).map_err(io)?;
    let mut line = req.to_line();
    line.push('\n');
    super::server::send_all(&s, line.as_bytes()).map_err(io)?;
    // The device may take its engine's timeout to answer, then the reply's own time.
    let deadline = Instant::now() + super::ENGINE_TIMEOUT + CLIENT_TIMEOUT;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AskError::Io(format!(
                "{}: no reply within {} s",
                path.display(),
                (super::ENGINE_TIMEOUT + CLIENT_TIMEOUT).as_secs()
            )));
        }
        s.set_read_timeout(Some(left)).map_err(io)?;
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(io(e)),
        };
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.last() == Some(&b'\n') {
            break;
        }
        if buf.len() > MAX_REPLY {
            return Err(AskError::Io(format!(
                "{}: a reply longer than {} MiB",
                path.display(),
                MAX_REPLY >> 20
            )));
        }
    }
    let v: Value = serde_json::from_slice(&buf)
        .map_err(|e| AskError::Io(format!("{}: not a JSON reply: {e}", path.display())))?;
    if let Some(e) = v.get("error") {
        return Err(AskError::Device(
            e.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string()),
        ));
    }
    if !v.is_object() {
        return Err(AskError::Io(format!(
            "{}: the reply is not a JSON object",
            path.display()
        )));
    }
    Ok(v)
}
