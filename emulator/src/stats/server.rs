//! A device's side: the socket, the thread that answers on it, and the tap its engine checks
//! once per turn.
//!
//! The server's thread accepts one client at a time and answers it within the client timeout;
//! an `info` question it answers alone, a `stats` question it hands to the engine's thread
//! through a bounded queue, raising a flag that the engine reads once per turn
//! ([`Server::pending`]) and ringing the engine's doorbell in case it sleeps. The engine takes a
//! [`Snapshot`] between two turns ([`Server::answer`]) and hands it back.
// Unsafe code: shutdown(2) on the listener we own (to end the thread blocked in accept),
// send(2) with MSG_NOSIGNAL (a client gone must not raise SIGPIPE in a program under `rocemu
// exec`, whose disposition is its own) and atexit(3) with a handler that only unlinks files.
#![allow(unsafe_code)]

use super::{
    check_name, run_dir, Identity, Request, Snapshot, CLIENT_TIMEOUT, ENGINE_TIMEOUT, MAX_REQUEST,
};
use crate::engine::{Doorbell, EngineStats};
use crate::port::PortStats;
use crate::rnic::Rnic;
use serde_json::{json, Value};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, Once};
use std::time::Instant;

/// Questions waiting for the engine: more than this means it is not turning.
const JOBS: usize = 4;

/// A question for the engine's thread, and where its answer goes.
struct Job {
    qps: bool,
    reply: mpsc::SyncSender<Snapshot>,
}

/// What the server's thread and the engine share.
struct Shared {
    /// A job is queued (set after the push: a drain after seeing it finds the job).
    pending: AtomicBool,
    stop: AtomicBool,
    doorbell: Mutex<Option<Arc<Doorbell>>>,
    /// The device's other shards (a device on several threads): each answers its part of a
    /// question through its [`ShardTap`], and the reply is their sum.
    shards: Mutex<Vec<(mpsc::SyncSender<Job>, Arc<AtomicBool>)>>,
}

/// Another shard's side of a device's stats socket (see [`Server::shard_tap`]): its engine
/// checks it once per turn, as shard 0's checks the [`Server`].
pub struct ShardTap {
    pending: Arc<AtomicBool>,
    rx: mpsc::Receiver<Job>,
}

impl std::fmt::Debug for ShardTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardTap").finish_non_exhaustive()
    }
}

impl ShardTap {
    /// A question waits for this shard: one atomic load, for every turn.
    #[inline]
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Answers the waiting questions with this shard's part (its engine's thread).
    pub fn answer(&self, rnic: &Rnic, engine: &EngineStats, port: &PortStats) {
        self.pending.store(false, Ordering::SeqCst);
        while let Ok(job) = self.rx.try_recv() {
            let _ = job
                .reply
                .try_send(Snapshot::take(rnic, engine, port, job.qps));
        }
    }
}

/// A device's stats socket: answers until dropped, then removes the socket.
pub struct Server {
    path: PathBuf,
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Job>,
    listener: Arc<UnixListener>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The sockets this process serves, removed at its exit (a device that lives as long as its
/// process, the drop-in library's, is never dropped).
static SERVED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn remove_served() {
    // try_lock: exit(3) may be called by a thread that holds it (a panic in bind); the files
    // are then left for the next listing to remove.
    if let Ok(v) = SERVED.try_lock() {
        for p in v.iter() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn register(path: &Path) {
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a handler taking no arguments that touches only our own static;
        // from a shared object glibc runs it at exit or when the object is unloaded.
        unsafe {
            libc::atexit(remove_served);
        }
    });
    SERVED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(path.to_owned());
}

fn unregister(path: &Path) {
    SERVED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|p| p != path);
}

/// Makes the directory of the sockets if it is not there: sticky and writable by all, as
/// `/tmp`, so that every user's devices can be listed (each socket is its owner's).
fn make_dir(dir: &Path) -> Result<(), String> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
    Ok(())
}

impl Server {
    /// Opens the socket of device `id` in [`run_dir`] and starts answering on it.
    pub fn bind(id: Identity) -> Result<Server, String> {
        Server::bind_in(&run_dir(), id)
    }

    /// [`bind`](Self::bind) in `dir`.
    pub fn bind_in(dir: &Path, id: Identity) -> Result<Server, String> {
        check_name(&id.name)?;
        make_dir(dir)?;
        let pid = std::process::id();
        let path = dir.join(format!("{}@{pid}.sock", id.name));
        if SERVED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&path)
        {
            return Err(format!(
                "this process already serves a device named {}: give each its own name",
                id.name
            ));
        }
        // A socket with our PID is a dead process's (PIDs are reused): ours are in SERVED.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .map(Arc::new)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        register(&path);
        let shared = Arc::new(Shared {
            pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            doorbell: Mutex::new(None),
            shards: Mutex::new(Vec::new()),
        });
        let (tx, rx) = mpsc::sync_channel(JOBS);
        let (l, sh) = (listener.clone(), shared.clone());
        let ident = id.to_json(pid);
        let thread = std::thread::Builder::new()
            .name("rocemu-stats".into())
            .spawn(move || accept_loop(&l, &sh, &tx, &Value::Object(ident)));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                unregister(&path);
                let _ = std::fs::remove_file(&path);
                return Err(format!("cannot start the stats thread: {e}"));
            }
        };
        Ok(Server {
            path,
            shared,
            rx,
            listener,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The doorbell that wakes the engine when a question comes while it sleeps.
    pub fn set_doorbell(&self, d: Arc<Doorbell>) {
        *self
            .shared
            .doorbell
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(d);
    }

    /// A tap for another shard of the device: from now on every `stats` reply sums that
    /// shard's counters (and lists its QPs) with this one's and the other taps'.
    pub fn shard_tap(&self) -> ShardTap {
        let (tx, rx) = mpsc::sync_channel(JOBS);
        let pending = Arc::new(AtomicBool::new(false));
        self.shared
            .shards
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((tx, pending.clone()));
        ShardTap { pending, rx }
    }

    /// A question waits for the engine: one atomic load, for every turn.
    #[inline]
    pub fn pending(&self) -> bool {
        self.shared.pending.load(Ordering::Relaxed)
    }

    /// Answers the waiting questions (the engine's thread, between turns).
    pub fn answer(&self, rnic: &Rnic, engine: &EngineStats, port: &PortStats) {
        self.shared.pending.store(false, Ordering::SeqCst);
        while let Ok(job) = self.rx.try_recv() {
            let _ = job
                .reply
                .try_send(Snapshot::take(rnic, engine, port, job.qps));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_file(&self.path);
        unregister(&self.path);
        // SAFETY: shutdown(2) on the listener's descriptor, which `self.listener` keeps open;
        // on Linux it ends an accept(2) blocked on it (with EINVAL).
        unsafe {
            libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR);
        }
        // Not joined: the thread ends by itself, after at most the client it is answering
        // (bounded by the timeouts; its engine question fails at once, the queue being gone).
        drop(self.thread.take());
    }
}

fn accept_loop(l: &UnixListener, sh: &Shared, tx: &mpsc::SyncSender<Job>, ident: &Value) {
    while !sh.stop.load(Ordering::SeqCst) {
        match l.accept() {
            Ok((s, _)) => {
                if sh.stop.load(Ordering::SeqCst) {
                    return;
                }
                answer_client(s, sh, tx, ident);
            }
            Err(_) if sh.stop.load(Ordering::SeqCst) => return,
            // EMFILE and the like: do not spin on it.
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

/// Reads one request line within the client timeout. `Err`: what to reply.
fn read_request(s: &mut UnixStream) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let mut buf = Vec::with_capacity(128);
    let mut chunk = [0u8; 256];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "no request line within {} s",
                CLIENT_TIMEOUT.as_secs()
            ));
        }
        let _ = s.set_read_timeout(Some(left));
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
            Err(e) => return Err(format!("reading the request: {e}")),
        };
        if n == 0 {
            // The client closed its side: what it sent is the request.
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            buf.truncate(i);
            if buf.len() > MAX_REQUEST {
                break;
            }
            return Ok(buf);
        }
        if buf.len() > MAX_REQUEST {
            break;
        }
    }
    Err(format!("a request is at most {MAX_REQUEST} bytes"))
}

/// The reply to one request line.
fn reply_to(line: &[u8], sh: &Shared, tx: &mpsc::SyncSender<Job>, ident: &Value) -> Value {
    let qps = match Request::parse(line) {
        Ok(Request::Info) => return ident.clone(),
        Ok(Request::Stats { qps }) => qps,
        Err(e) => return json!({ "error": e }),
    };
    let (rtx, rrx) = mpsc::sync_channel(1);
    if tx.try_send(Job { qps, reply: rtx }).is_err() {
        return json!({"error": "the device's engine has earlier questions unanswered: it is not turning"});
    }
    sh.pending.store(true, Ordering::SeqCst);
    if let Some(d) = &*sh.doorbell.lock().unwrap_or_else(|p| p.into_inner()) {
        d.ring();
    }
    // The other shards' parts, asked at once.
    let mut parts = vec![rrx];
    for (stx, pending) in sh.shards.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let (rtx, rrx) = mpsc::sync_channel(1);
        if stx.try_send(Job { qps, reply: rtx }).is_err() {
            return json!({"error": "a shard's engine has earlier questions unanswered: it is not turning"});
        }
        pending.store(true, Ordering::SeqCst);
        parts.push(rrx);
    }
    let deadline = Instant::now() + ENGINE_TIMEOUT;
    let mut snap: Option<Snapshot> = None;
    for (k, rrx) in parts.iter().enumerate() {
        match rrx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(part) => match &mut snap {
                None => snap = Some(part),
                Some(s) => s.add(part),
            },
            Err(_) => {
                return json!({"error": format!(
                    "the device's engine{} did not answer within {} s (stopped, or busy outside its loop)",
                    if k == 0 { String::new() } else { format!(" for shard {k}") },
                    ENGINE_TIMEOUT.as_secs()
                )})
            }
        }
    }
    let mut m = ident.as_object().cloned().unwrap_or_default();
    snap.expect("shard 0's part").to_json(&mut m);
    Value::Object(m)
}

fn answer_client(mut s: UnixStream, sh: &Shared, tx: &mpsc::SyncSender<Job>, ident: &Value) {
    let _ = s.set_write_timeout(Some(CLIENT_TIMEOUT));
    let reply = match read_request(&mut s) {
        Ok(line) => reply_to(&line, sh, tx, ident),
        Err(e) => json!({ "error": e }),
    };
    let mut out = reply.to_string();
    out.push('\n');
    let _ = send_all(&s, out.as_bytes());
}

/// Writes all of `buf` to a connected socket with send(2) and MSG_NOSIGNAL: a peer gone is an
/// error (EPIPE), never SIGPIPE. The socket's write timeout bounds each send.
pub(crate) fn send_all(s: &UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: sends from a live slice of `buf.len()` bytes on a descriptor `s` keeps open.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}
