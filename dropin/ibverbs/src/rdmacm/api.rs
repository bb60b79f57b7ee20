//! librdmacm's entry points (RDMACM_1.0 … 1.3): event channels, ids, address and route
//! resolution, listen / connect / accept / reject / disconnect, the QP moved through its states
//! as librdmacm moves it, the synchronous (`rdma_create_ep`) family, options, `rdma_getaddrinfo`.
//!
//! Return values as librdmacm's: 0, or -1 with `errno` set; pointers NULL with `errno`.
//! What a call is given is checked before it is used: NULL, an id or channel that is not ours
//! (not in the service's tables) and a call in the wrong state are EINVAL.
#![allow(clippy::missing_safety_doc, clippy::not_unsafe_ptr_arg_deref)]
use super::abi::*;
use super::service::*;
use crate::abi::*;
use crate::ffi::{guard, set_errno};
use crate::nic::{self, Inner, Nic};
use crate::verbs::{self, fail_ptr};
use libc::{c_char, c_int, c_void, size_t, sockaddr, EINVAL};
use rocemu_emulator::cm::ConnParams;
use rocemu_wire::cm::{CmaHdr, CommId, RejReason, SidrStatus};
use rocemu_wire::QKey;
use std::mem::zeroed;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::ptr::{null_mut, NonNull};
use std::sync::OnceLock;

/// `-1` with `errno = e`.
fn err(e: c_int) -> c_int {
    set_errno(e);
    -1
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return err(e),
        }
    };
}

/// The NIC, locked, with its CM service made if it was not yet.
fn locked() -> Result<(&'static Nic, crate::nic::Locked<'static>), c_int> {
    let n = nic::nic()?;
    let mut g = n.lock();
    if g.cm.is_none() {
        let ips = n.ips.clone();
        let s = Service::new(&mut g.rnic, ips).map_err(|e| {
            eprintln!("rocemu: rdma_cm: cannot make QP1: {e}");
            libc::ENOMEM
        })?;
        g.cm = Some(Box::new(s));
        // SAFETY: registers a function of ours that takes no arguments (once: the service
        // is made once).
        unsafe { libc::atexit(flush_mads_at_exit) };
    }
    Ok((n, g))
}

/// At `exit`, the MADs the CM has made but not yet sent go out before the process ends (up
/// to [`FLUSH_AT_EXIT`]): the DREP that answers the peer's DREQ, the DREQ of a last
/// `rdma_disconnect`. The kernel's CM sends them whatever becomes of the process; without
/// this a program that exits straight after its last event (ucmatose's client, rdma_server)
/// leaves a kernel peer retrying its DREQ for a minute, or blocked in `rdma_disconnect`.
extern "C" fn flush_mads_at_exit() {
    let Some(n) = nic::started() else { return };
    let start = match n.lock().cm.as_ref() {
        Some(s) => s.turns,
        None => return,
    };
    let deadline = std::time::Instant::now() + FLUSH_AT_EXIT;
    while std::time::Instant::now() < deadline {
        // Taking the lock wakes the engine when it sleeps.
        if n.lock().cm.as_ref().is_none_or(|s| s.quiet_since(start)) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// How long [`flush_mads_at_exit`] waits at most.
const FLUSH_AT_EXIT: std::time::Duration = std::time::Duration::from_millis(200);

fn svc(g: &mut Inner) -> &mut Service {
    g.cm.as_mut().expect("made by locked()")
}

/// The program's context for our device, opened once (every id's `verbs`).
fn default_ctx() -> Result<*mut ibv_context, c_int> {
    static CTX: OnceLock<usize> = OnceLock::new();
    if let Some(&c) = CTX.get() {
        return Ok(c as *mut ibv_context);
    }
    let dev = nic::device().ok_or(libc::ENODEV)?;
    let c = verbs::ibv_open_device(dev);
    if c.is_null() {
        return Err(libc::ENODEV);
    }
    match CTX.set(c as usize) {
        Ok(()) => Ok(c),
        Err(_) => {
            verbs::ibv_close_device(c);
            Ok(*CTX.get().expect("set") as *mut ibv_context)
        }
    }
}

/// The PD an id's QP gets when the program gives none (librdmacm's per-device PD).
fn default_pd() -> Result<*mut ibv_pd, c_int> {
    static PD: OnceLock<usize> = OnceLock::new();
    if let Some(&p) = PD.get() {
        return Ok(p as *mut ibv_pd);
    }
    let pd = verbs::ibv_alloc_pd(default_ctx()?);
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    match PD.set(pd as usize) {
        Ok(()) => Ok(pd),
        Err(_) => {
            verbs::ibv_dealloc_pd(pd);
            Ok(*PD.get().expect("set") as *mut ibv_pd)
        }
    }
}

fn new_eventfd() -> Result<c_int, c_int> {
    // SAFETY: eventfd takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE))
    } else {
        Ok(fd)
    }
}

fn make_channel(s: &mut Service) -> Result<*mut rdma_event_channel, c_int> {
    let fd = new_eventfd()?;
    let ch = Box::into_raw(Box::new(rdma_event_channel { fd }));
    s.queues.insert(ch as usize, Default::default());
    s.gone_channels.retain(|&c| c != ch as usize);
    super::live::add(super::live::CHANNELS, 1);
    Ok(ch)
}

/// Frees a channel of ours (its unread events with it).
fn free_channel(s: &mut Service, ch: *mut rdma_event_channel) {
    if s.queues.remove(&(ch as usize)).is_some() {
        // SAFETY: a channel that was in `queues`: a live Box of ours, given back once.
        let b = unsafe { Box::from_raw(ch) };
        // SAFETY: its own eventfd.
        unsafe { libc::close(b.fd) };
        super::live::add(super::live::CHANNELS, -1);
        if s.gone_channels.len() == GONE_CHANNELS {
            s.gone_channels.pop_front();
        }
        s.gone_channels.push_back(ch as usize);
    }
}

/// How many destroyed channels [`rdma_get_cm_event`] still recognises.
pub(super) const GONE_CHANNELS: usize = 64;

/// `rdma_get_cm_event` on a channel the program has destroyed: wait for good, as a thread that
/// was already waiting does. Debian's rping (rdma-core before f3ae6534a, "rping: terminate CM
/// event thread before exiting") destroys the channel while its CM thread may be between two
/// calls; with the kernel's rdma_cm that call reads freed memory and fails, rarely, and rping
/// exits 255 after a good run. The process is ending; a thread parked here ends with it.
fn wait_on_gone_channel() -> ! {
    loop {
        std::thread::park();
    }
}

// ---- event channels --------------------------------------------------------------------------

pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(null_mut(), || {
        let (_, mut g) = match locked() {
            Ok(v) => v,
            Err(e) => return fail_ptr(e),
        };
        match make_channel(svc(&mut g)) {
            Ok(c) => c,
            Err(e) => fail_ptr(e),
        }
    })
}

pub extern "C" fn rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    guard((), || {
        if ch.is_null() {
            return;
        }
        let Ok((_, mut g)) = locked() else { return };
        let s = svc(&mut g);
        // librdmacm leaves a channel with ids on it alone (the program's mistake); so do we.
        if s.ids.values().any(|i| i.chan == ch as usize) {
            return;
        }
        free_channel(s, ch);
    })
}

pub extern "C" fn rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(err(libc::EIO), || {
        if ch.is_null() || event.is_null() {
            return err(EINVAL);
        }
        // Our own reference to the channel's eventfd: a program may destroy the channel while
        // another of its threads waits here (rping does, at its end). Then, as with the
        // kernel's rdma_cm, the waiting thread stays blocked (nobody writes the old
        // descriptor again) rather than read a descriptor number reused for something else.
        let fd = {
            let (_, mut g) = tri!(locked());
            let s = svc(&mut g);
            if !s.queues.contains_key(&(ch as usize)) {
                let gone = s.gone_channels.contains(&(ch as usize));
                drop(g);
                if gone {
                    wait_on_gone_channel();
                }
                return err(EINVAL);
            }
            // SAFETY: a live channel of ours (checked under the lock); dup takes no pointers.
            let fd = unsafe { libc::fcntl((*ch).fd, libc::F_DUPFD_CLOEXEC, 0) };
            if fd < 0 {
                return err(errno());
            }
            fd
        };
        struct Close(c_int);
        impl Drop for Close {
            fn drop(&mut self) {
                // SAFETY: the duplicate made above, closed once.
                unsafe { libc::close(self.0) };
            }
        }
        let _close = Close(fd);
        loop {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a local.
            let r = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
            if r != 8 {
                let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                if e == libc::EINTR {
                    continue;
                }
                return err(e);
            }
            let ev = {
                let (_, mut g) = tri!(locked());
                let s = svc(&mut g);
                let ev = match s.queues.get_mut(&(ch as usize)) {
                    Some(q) => q.pop_front(),
                    // Destroyed while we waited: wait on (for good, as the kernel's would).
                    None => continue,
                };
                if let Some(i) = ev.as_ref().and_then(|e| s.ids.get_mut(&(e.ev.id as usize))) {
                    i.unacked += 1;
                }
                ev
            };
            let Some(mut ev) = ev else {
                continue; // an event taken back (its id was destroyed)
            };
            if ev.post == Post::ConnectResponse {
                connect_response(&mut ev);
            }
            let p = Box::into_raw(ev);
            // SAFETY: the caller's out pointer.
            unsafe { *event = &mut (*p).ev };
            return 0;
        }
    })
}

/// Active side, REP received: with a QP on the id, RTR, RTS and the RTU, and the program sees
/// ESTABLISHED (CONNECT_ERROR if the QP would not move, the connection then refused); without,
/// the program sees CONNECT_RESPONSE and calls `rdma_establish`.
fn connect_response(ev: &mut Ev) {
    let id = ev.ev.id;
    // SAFETY: the event's id is a live id of ours (events of destroyed ids are taken back).
    let qp = unsafe { (*id).qp };
    if qp.is_null() {
        return;
    }
    let r = move_qp(id, IBV_QPS_RTR).and_then(|_| move_qp(id, IBV_QPS_RTS));
    let Ok((_, mut g)) = locked() else { return };
    let s = svc(&mut g);
    let comm = s.ids.get(&(id as usize)).and_then(|i| i.comm);
    match (r, comm) {
        (Ok(()), Some(c)) => {
            let now = s.now();
            if s.agent.establish(now, c).is_ok() {
                if let Some(i) = s.ids.get_mut(&(id as usize)) {
                    i.st = St::Connected;
                }
                ev.ev.event = RDMA_CM_EVENT_ESTABLISHED;
                return;
            }
            ev.ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
            ev.ev.status = -libc::ECONNABORTED;
        }
        (Err(e), Some(c)) => {
            s.agent.reject(c, RejReason::CONSUMER_DEFINED);
            ev.ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
            ev.ev.status = -e;
        }
        _ => {
            ev.ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
            ev.ev.status = -libc::ECONNABORTED;
        }
    }
}

pub extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(err(libc::EIO), || {
        if event.is_null() {
            return err(EINVAL);
        }
        // SAFETY: an event rdma_get_cm_event handed out: the `ev` field (offset 0) of a Box<Ev>,
        // given back once.
        let ev = unsafe { Box::from_raw(event as *mut Ev) };
        if let Ok((_, mut g)) = locked() {
            if let Some(i) = svc(&mut g).ids.get_mut(&(ev.ev.id as usize)) {
                i.unacked = i.unacked.saturating_sub(1);
            }
        }
        0
    })
}

// ---- ids --------------------------------------------------------------------------------------

fn qp_type_of_ps(ps: c_int) -> Option<c_int> {
    match ps {
        RDMA_PS_TCP | RDMA_PS_IB => Some(IBV_QPT_RC),
        RDMA_PS_UDP | RDMA_PS_IPOIB => Some(IBV_QPT_UD),
        _ => None,
    }
}

fn create_id(
    ch: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
    qp_type: c_int,
) -> Result<*mut rdma_cm_id, c_int> {
    let ctx = default_ctx()?;
    let (_, mut g) = locked()?;
    let s = svc(&mut g);
    let (chan, sync) = if ch.is_null() {
        (make_channel(s)?, true)
    } else if s.queues.contains_key(&(ch as usize)) {
        (ch, false)
    } else {
        return Err(EINVAL);
    };
    // SAFETY: rdma_cm_id is plain data: zeroes are valid.
    let mut b: Box<rdma_cm_id> = Box::new(unsafe { zeroed() });
    b.verbs = ctx;
    b.channel = chan;
    b.context = context;
    b.ps = ps;
    b.qp_type = qp_type;
    let id = Box::into_raw(b);
    s.ids
        .insert(id as usize, IdState::new(chan as usize, sync, ps, qp_type));
    super::live::add(super::live::IDS, 1);
    Ok(id)
}

pub extern "C" fn rdma_create_id(
    ch: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        let Some(qt) = qp_type_of_ps(ps) else {
            return err(libc::EPROTONOSUPPORT);
        };
        let p = tri!(create_id(ch, context, ps, qt));
        // SAFETY: the caller's out pointer.
        unsafe { *id = p };
        0
    })
}

/// Takes an id out of the tables and frees it (and its synchronous channel, its path record,
/// the unread events that name it).
fn free_id(s: &mut Service, id: *mut rdma_cm_id) {
    let Some(st) = s.ids.remove(&(id as usize)) else {
        return;
    };
    if let Some(c) = st.comm {
        s.agent.close(c);
        s.by_comm.remove(&c.0);
    }
    // A listener's service goes from the CM agent too: a REQ for it then waits a moment for
    // the next listener (perftest -R listens again on the same port) instead of reaching a
    // listener that is gone and being refused at once.
    let gone: Vec<u64> = s
        .listeners
        .iter()
        .filter(|(_, l)| **l == id as usize)
        .map(|(&sid, _)| sid)
        .collect();
    for sid in gone {
        s.listeners.remove(&sid);
        s.agent.unlisten(rocemu_wire::cm::ServiceId(sid));
    }
    s.drop_events_of(id as usize);
    // Requests on a listener that the program never took: their ids go with it.
    if st.st == St::Listen {
        let orphans: Vec<usize> = s
            .ids
            .iter()
            .filter(|(_, i)| i.listener == id as usize && i.st == St::ReqRcvd)
            .map(|(&k, _)| k)
            .collect();
        for o in orphans {
            free_id(s, o as *mut rdma_cm_id);
        }
    }
    if st.sync {
        free_channel(s, st.chan as *mut rdma_event_channel);
    }
    // SAFETY: a live id of ours (it was in `ids`), given back once.
    let b = unsafe { Box::from_raw(id) };
    if !b.route.path_rec.is_null() {
        // SAFETY: the path record we made with Box::into_raw.
        drop(unsafe { Box::from_raw(b.route.path_rec) });
    }
    if !b.event.is_null() {
        // SAFETY: the event a synchronous call kept in `id->event`: a Box<Ev> of ours.
        drop(unsafe { Box::from_raw(b.event as *mut Ev) });
    }
    super::live::add(super::live::IDS, -1);
}

pub extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        {
            let (_, mut g) = tri!(locked());
            if !svc(&mut g).ids.contains_key(&(id as usize)) {
                return err(EINVAL);
            }
        }
        // As librdmacm: the event a synchronous call kept is acked, then every event of the id
        // the program holds must be acked before the id goes (another thread may still be
        // handling one: rping's CM thread its DISCONNECTED while the main thread tears down).
        // SAFETY: a live id of ours (checked above).
        let kept = unsafe { std::mem::replace(&mut (*id).event, null_mut()) };
        if !kept.is_null() {
            rdma_ack_cm_event(kept);
        }
        loop {
            {
                let (_, mut g) = tri!(locked());
                let s = svc(&mut g);
                match s.ids.get(&(id as usize)) {
                    None => return err(EINVAL),
                    Some(i) if i.unacked == 0 => {
                        free_id(s, id);
                        return 0;
                    }
                    Some(_) => {}
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    })
}

/// A socket address the program passes.
unsafe fn sockaddr_of(a: *const sockaddr) -> Result<SocketAddr, c_int> {
    if a.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: the caller's sockaddr; its family says how much to read.
    unsafe {
        match (*a).sa_family as c_int {
            libc::AF_INET => {
                let s = &*(a as *const libc::sockaddr_in);
                Ok(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = &*(a as *const libc::sockaddr_in6);
                Ok(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            libc::AF_IB => Err(libc::EAFNOSUPPORT),
            _ => Err(libc::EAFNOSUPPORT),
        }
    }
}

/// Binds id to `a` (our address or the unspecified one; port 0 picks one).
fn bind(s: &mut Service, id: *mut rdma_cm_id, mut a: SocketAddr) -> Result<(), c_int> {
    let st = s.ids.get(&(id as usize)).ok_or(EINVAL)?;
    let ps = st.ps;
    if !matches!(st.st, St::Idle) {
        return Err(EINVAL);
    }
    if !a.ip().is_unspecified() && !s.ips.contains(&a.ip()) {
        return Err(libc::EADDRNOTAVAIL);
    }
    if a.port() == 0 {
        a.set_port(s.ephemeral_port(ps));
    }
    let st = s.ids.get_mut(&(id as usize)).expect("checked");
    st.src = Some(a);
    st.st = St::Bound;
    // SAFETY: a live id of ours.
    unsafe { (*id).port_num = 1 };
    let st = s.ids.get(&(id as usize)).expect("checked");
    set_route(id as usize, st);
    Ok(())
}

pub extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        // SAFETY: the caller's address.
        let a = tri!(unsafe { sockaddr_of(addr) });
        let (_, mut g) = tri!(locked());
        tri!(bind(svc(&mut g), id, a));
        0
    })
}

/// Waits, for an id without a channel of the program's, for the event its call caused, as
/// librdmacm's `ucma_complete`: kept in `id->event`; an error status is the call's error.
fn complete(id: *mut rdma_cm_id) -> c_int {
    let (sync, chan) = {
        let Ok((_, mut g)) = locked() else {
            return err(libc::ENODEV);
        };
        match svc(&mut g).ids.get(&(id as usize)) {
            Some(s) => (s.sync, s.chan),
            None => return err(EINVAL),
        }
    };
    if !sync {
        return 0;
    }
    // SAFETY: a live id of ours.
    let old = unsafe { std::mem::replace(&mut (*id).event, null_mut()) };
    if !old.is_null() {
        rdma_ack_cm_event(old);
    }
    let mut ev: *mut rdma_cm_event = null_mut();
    if rdma_get_cm_event(chan as *mut rdma_event_channel, &mut ev) != 0 {
        return -1;
    }
    // SAFETY: as above; the event just taken.
    unsafe {
        (*id).event = ev;
        let st = (*ev).status;
        if st != 0 {
            return if (*ev).event == RDMA_CM_EVENT_REJECTED {
                err(libc::ECONNREFUSED)
            } else if st < 0 {
                err(-st)
            } else {
                err(st)
            };
        }
    }
    0
}

pub extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        // SAFETY: the caller's addresses.
        let d = tri!(unsafe { sockaddr_of(dst) });
        let src = if src.is_null() {
            None
        } else {
            // SAFETY: as above.
            Some(tri!(unsafe { sockaddr_of(src) }))
        };
        {
            let (_, mut g) = tri!(locked());
            let s = svc(&mut g);
            let Some(st) = s.ids.get(&(id as usize)) else {
                return err(EINVAL);
            };
            if st.st == St::Idle {
                let a = match src {
                    Some(a) if !a.ip().is_unspecified() => a,
                    other => {
                        let port = other.map(|a| a.port()).unwrap_or(0);
                        let Some(ip) = s.local_ip_for(d.ip()) else {
                            return err(libc::EADDRNOTAVAIL);
                        };
                        SocketAddr::new(ip, port)
                    }
                };
                tri!(bind(s, id, a));
            } else if st.st != St::Bound {
                return err(EINVAL);
            }
            let st = s.ids.get_mut(&(id as usize)).expect("checked");
            if st.src.is_some_and(|a| a.ip().is_unspecified()) {
                let port = st.src.map(|a| a.port()).unwrap_or(0);
                let ip = s.local_ip_for(d.ip());
                let st = s.ids.get_mut(&(id as usize)).expect("checked");
                match ip {
                    Some(ip) => st.src = Some(SocketAddr::new(ip, port)),
                    None => return err(libc::EADDRNOTAVAIL),
                }
            }
            let st = s.ids.get_mut(&(id as usize)).expect("checked");
            if st.src.is_some_and(|a| a.is_ipv4() != d.is_ipv4()) {
                return err(EINVAL);
            }
            st.dst = Some(d);
            let now = std::time::Instant::now();
            let ms = if timeout_ms > 0 {
                timeout_ms as u64
            } else {
                2000
            };
            if s.ips.contains(&d.ip()) {
                // Our own address: the datapath does not loop frames back to itself.
                st.st = St::Bound;
                st.dst = None;
                return err(libc::EADDRNOTAVAIL);
            }
            st.st = St::AddrQuery;
            st.resolving = Some((now + std::time::Duration::from_millis(ms), now));
            s.resolving.push(id as usize);
            let st = s.ids.get(&(id as usize)).expect("checked");
            set_route(id as usize, st);
        }
        complete(id)
    })
}

pub extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        {
            let (_, mut g) = tri!(locked());
            let mtu = mtu_enum(g.rnic.active_mtu().bytes());
            let s = svc(&mut g);
            let Some(st) = s.ids.get_mut(&(id as usize)) else {
                return err(EINVAL);
            };
            if st.st != St::AddrResolved {
                return err(EINVAL);
            }
            st.st = St::RouteResolved;
            let (src, dst, tos) = (st.src.expect("bound"), st.dst.expect("resolved"), st.tos);
            // As the kernel builds a RoCE path record from the addresses (no SA): the GIDs,
            // the port's MTU, a hop limit of 64, the rdma_cm flow label.
            // SAFETY: ibv_sa_path_rec is plain data.
            let mut p: ibv_sa_path_rec = unsafe { zeroed() };
            p.dgid = ibv_gid {
                raw: rocemu_emulator::rnic::Gid::from_ip(dst.ip()).0,
            };
            p.sgid = ibv_gid {
                raw: rocemu_emulator::rnic::Gid::from_ip(src.ip()).0,
            };
            p.pkey = 0xffff_u16.to_be();
            p.hop_limit = 64;
            p.traffic_class = tos;
            p.reversible = 1;
            p.numb_path = 1;
            p.mtu_selector = 2;
            p.mtu = mtu;
            p.rate_selector = 2;
            p.rate = 7;
            p.packet_life_time_selector = 2;
            p.packet_life_time = 16;
            p.flow_label = rocemu_wire::cm::rdma_cm_flow_label(src.port(), dst.port()).to_be();
            // SAFETY: a live id of ours; the old record (if any) is ours.
            unsafe {
                if !(*id).route.path_rec.is_null() {
                    drop(Box::from_raw((*id).route.path_rec));
                }
                (*id).route.path_rec = Box::into_raw(Box::new(p));
                (*id).route.num_paths = 1;
            }
            s.event(
                id as usize,
                Ev::new(id as usize, RDMA_CM_EVENT_ROUTE_RESOLVED, 0),
            );
        }
        complete(id)
    })
}

/// `enum ibv_mtu` of a byte count.
fn mtu_enum(b: usize) -> u8 {
    match b {
        0..=256 => 1,
        257..=512 => 2,
        513..=1024 => 3,
        1025..=2048 => 4,
        _ => 5,
    }
}

pub extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        let (_, mut g) = tri!(locked());
        let s = svc(&mut g);
        let Some(st) = s.ids.get(&(id as usize)) else {
            return err(EINVAL);
        };
        if st.st == St::Idle {
            let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
            tri!(bind(s, id, any));
        }
        let st = s.ids.get(&(id as usize)).expect("checked");
        if st.st != St::Bound {
            return err(EINVAL);
        }
        let port = st.src.map(|a| a.port()).unwrap_or(0);
        let sid = service_id(st.ps, port);
        if s.listeners.contains_key(&sid.value()) {
            return err(libc::EADDRINUSE);
        }
        s.listeners.insert(sid.value(), id as usize);
        s.agent.listen(sid);
        let st = s.ids.get_mut(&(id as usize)).expect("checked");
        st.st = St::Listen;
        st.backlog = backlog;
        0
    })
}

/// The bytes `data` points at, `len` of them (none for NULL).
///
/// # Safety
///
/// `data` is NULL or points at `len` readable bytes that outlive the call using them.
unsafe fn bytes<'a>(data: *const c_void, len: usize) -> &'a [u8] {
    if data.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: per the caller's contract.
        unsafe { std::slice::from_raw_parts(data.cast(), len) }
    }
}

/// A program's connection parameters (None for NULL: the defaults) and their private data.
///
/// # Safety
///
/// `param` is NULL or a valid `rdma_conn_param` whose private data is readable for its length.
unsafe fn conn_param<'a>(param: *const rdma_conn_param) -> (Option<rdma_conn_param>, &'a [u8]) {
    // SAFETY: per the caller's contract.
    let p = unsafe { param.as_ref().copied() };
    // SAFETY: as above.
    let user = p.map_or(&[][..], |p| unsafe {
        bytes(p.private_data, p.private_data_len as usize)
    });
    (p, user)
}

/// The QP number a connection announces: its id's QP's, or the one the program names in its
/// parameters when it owns the QP (`qp_num`).
fn qp_num(id: *mut rdma_cm_id, p: Option<rdma_conn_param>) -> rocemu_wire::Qpn {
    // SAFETY: a live id of ours; its QP is one of ours or NULL.
    let qp = unsafe { (*id).qp };
    qpn(if qp.is_null() {
        p.map_or(0, |p| p.qp_num)
    } else {
        // SAFETY: as above.
        unsafe { (*qp).qp_num }
    })
}

/// The responder resources / initiator depth a program asks for, within the device's.
fn rd(v: u8) -> u8 {
    v.min(16)
}

pub extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        // SAFETY: the caller's parameters, or NULL (the verbs contract).
        let (p, user) = unsafe { conn_param(param) };
        {
            let (_, mut g) = tri!(locked());
            let mtu = mtu_enum(g.rnic.active_mtu().bytes());
            let s = svc(&mut g);
            let Some(st) = s.ids.get(&(id as usize)) else {
                return err(EINVAL);
            };
            if st.st != St::RouteResolved {
                return err(EINVAL);
            }
            let (src, dst, ps) = (st.src.expect("bound"), st.dst.expect("resolved"), st.ps);
            let qpn = qp_num(id, p);
            let mut pdata = [0u8; 92];
            let hdr_len = if ps == RDMA_PS_IB { 0 } else { 36 };
            if ps != RDMA_PS_IB {
                let Ok(h) = CmaHdr::new(src, dst.ip()) else {
                    return err(EINVAL);
                };
                if h.emit(&mut pdata).is_err() {
                    return err(EINVAL);
                }
            }
            let service = service_id(ps, dst.port());
            if st.qp_type == IBV_QPT_UD {
                let mut sd = [0u8; 216];
                if user.len() > sd.len() - hdr_len {
                    return err(EINVAL);
                }
                sd[..hdr_len].copy_from_slice(&pdata[..hdr_len]);
                sd[hdr_len..hdr_len + user.len()].copy_from_slice(user);
                let now = s.now();
                let c = s.agent.sidr_request(now, dst.ip(), service, &sd);
                s.by_comm.insert(c.0, id as usize);
                let st = s.ids.get_mut(&(id as usize)).expect("checked");
                st.comm = Some(c);
                st.st = St::Connecting;
            } else {
                if user.len() > pdata.len() - hdr_len {
                    return err(EINVAL);
                }
                pdata[hdr_len..hdr_len + user.len()].copy_from_slice(user);
                let my_psn = s.psn();
                let flow_label = rocemu_wire::cm::rdma_cm_flow_label(src.port(), dst.port());
                // No parameters: librdmacm's rdma_connect offers the device's maximum
                // responder resources and initiator depth (RDMA_MAX_*), not 0, which would
                // leave the QP refusing every READ and atomic (max_dest_rd_atomic 0).
                let p = p.unwrap_or(rdma_conn_param {
                    private_data: std::ptr::null(),
                    private_data_len: 0,
                    responder_resources: RDMA_MAX_RESP_RES,
                    initiator_depth: RDMA_MAX_INIT_DEPTH,
                    flow_control: 1,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    srq: 0,
                    qp_num: 0,
                });
                let conn = Conn {
                    remote_qpn: 0,
                    remote_psn: 0,
                    my_psn,
                    path_mtu: mtu,
                    resp_res: rd(p.responder_resources),
                    init_depth: rd(p.initiator_depth),
                    retry_count: p.retry_count.min(7),
                    rnr_retry_count: p.rnr_retry_count.min(7),
                    flow_label,
                    remote_qkey: 0,
                };
                let cp = ConnParams {
                    qpn,
                    psn: psn(my_psn),
                    path_mtu: mtu,
                    responder_resources: conn.resp_res,
                    initiator_depth: conn.init_depth,
                    retry_count: conn.retry_count,
                    rnr_retry_count: conn.rnr_retry_count,
                    private_data: pdata,
                    flow_label,
                    defer_rtu: true,
                    ..ConnParams::default()
                };
                let now = s.now();
                let c = s.agent.connect(now, dst.ip(), service, &cp);
                s.by_comm.insert(c.0, id as usize);
                let st = s.ids.get_mut(&(id as usize)).expect("checked");
                st.comm = Some(c);
                st.conn = conn;
                st.st = St::Connecting;
            }
        }
        complete(id)
    })
}

pub extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        // SAFETY: the caller's parameters, or NULL (the verbs contract).
        let (p, user) = unsafe { conn_param(param) };
        let (state, qp_type) = {
            let (_, mut g) = tri!(locked());
            let s = svc(&mut g);
            match s.ids.get(&(id as usize)) {
                Some(st) => (st.st, st.qp_type),
                None => return err(EINVAL),
            }
        };
        // The active side of a connection whose program owns the QP: the RTU
        // (rdma_establish's older spelling).
        if state == St::RepRcvd {
            return rdma_establish(id);
        }
        if state != St::ReqRcvd {
            return err(EINVAL);
        }
        // SAFETY: a live id of ours.
        let qp = unsafe { (*id).qp };
        if qp_type == IBV_QPT_UD {
            let qpn = qp_num(id, p);
            let (_, mut g) = tri!(locked());
            let s = svc(&mut g);
            let Some(st) = s.ids.get_mut(&(id as usize)) else {
                return err(EINVAL);
            };
            let Some(c) = st.comm.take() else {
                return err(EINVAL);
            };
            st.st = St::Connected;
            s.by_comm.remove(&c.0);
            if user.len() > 136 {
                return err(EINVAL);
            }
            return match s
                .agent
                .sidr_reply(c, SidrStatus::SUCCESS, qpn, QKey(RDMA_UDP_QKEY), user)
            {
                Ok(()) => 0,
                Err(_) => err(EINVAL),
            };
        }
        if user.len() > 196 {
            return err(EINVAL);
        }
        // What this end settles: reads in flight no deeper than the active side accepts,
        // responder resources for as many as it keeps in flight.
        {
            let (_, mut g) = tri!(locked());
            let mtu = mtu_enum(g.rnic.active_mtu().bytes());
            let s = svc(&mut g);
            let my_psn = s.psn();
            let st = s.ids.get_mut(&(id as usize)).expect("checked");
            let (offer_init, offer_resp) = st.offered;
            let (want_resp, want_init) = match p {
                Some(p) => (rd(p.responder_resources), rd(p.initiator_depth)),
                None => (rd(offer_init), rd(offer_resp)),
            };
            st.conn.resp_res = want_resp.min(offer_init);
            st.conn.init_depth = want_init.min(offer_resp);
            st.conn.my_psn = my_psn;
            if !(1..=5).contains(&st.conn.path_mtu) || st.conn.path_mtu > mtu {
                st.conn.path_mtu = mtu;
            }
        }
        if !qp.is_null() {
            if let Err(e) = move_qp(id, IBV_QPS_RTR).and_then(|_| move_qp(id, IBV_QPS_RTS)) {
                return err(e);
            }
        }
        {
            let (_, mut g) = tri!(locked());
            let s = svc(&mut g);
            let st = s.ids.get_mut(&(id as usize)).expect("checked");
            let Some(c) = st.comm else {
                return err(EINVAL);
            };
            let qpn = qp_num(id, p);
            let mut rep = [0u8; 196];
            rep[..user.len()].copy_from_slice(user);
            let cp = ConnParams {
                qpn,
                psn: psn(st.conn.my_psn),
                path_mtu: st.conn.path_mtu,
                responder_resources: st.conn.resp_res,
                initiator_depth: st.conn.init_depth,
                // The REP's RNR retry count is what this end asks the other to use (our QP uses
                // the REQ's, as Linux's ib_cm does).
                rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count.min(7)),
                rep_private_data: rep,
                ..ConnParams::default()
            };
            st.st = St::Accepting;
            let now = s.now();
            if s.agent.accept(now, c, &cp).is_err() {
                // The request expired (or its sender gave up) before the program answered.
                let st = s.ids.get_mut(&(id as usize)).expect("checked");
                st.st = St::Disconnected;
                return err(libc::ECONNABORTED);
            }
        }
        complete(id)
    })
}

pub extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        let (_, mut g) = tri!(locked());
        let s = svc(&mut g);
        let Some(st) = s.ids.get(&(id as usize)) else {
            return err(EINVAL);
        };
        let (Some(c), St::RepRcvd) = (st.comm, st.st) else {
            return err(EINVAL);
        };
        let now = s.now();
        if s.agent.establish(now, c).is_err() {
            return err(libc::ECONNABORTED);
        }
        s.ids.get_mut(&(id as usize)).expect("checked").st = St::Connected;
        0
    })
}

fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    if id.is_null() {
        return err(EINVAL);
    }
    // SAFETY: the caller's private data of the length it says.
    let user = unsafe { bytes(data, len as usize) };
    let (_, mut g) = tri!(locked());
    let s = svc(&mut g);
    let Some(st) = s.ids.get_mut(&(id as usize)) else {
        return err(EINVAL);
    };
    if !matches!(st.st, St::ReqRcvd | St::RepRcvd) {
        return err(EINVAL);
    }
    let Some(c) = st.comm.take() else {
        return err(EINVAL);
    };
    let ud = st.qp_type == IBV_QPT_UD;
    st.st = St::Disconnected;
    s.by_comm.remove(&c.0);
    if ud {
        let _ = s
            .agent
            .sidr_reply(c, SidrStatus::REJECT, qpn(0), QKey(0), user);
    } else {
        if user.len() > 148 {
            return err(EINVAL);
        }
        s.agent.reject_with(c, RejReason::CONSUMER_DEFINED, user);
    }
    0
}

pub extern "C" fn rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    guard(err(libc::EIO), || reject(id, data, len))
}

pub extern "C" fn rdma_reject_ece(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    guard(err(libc::EIO), || reject(id, data, len))
}

pub extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        {
            let (_, mut g) = tri!(locked());
            let s = svc(&mut g);
            let Some(st) = s.ids.get(&(id as usize)) else {
                return err(EINVAL);
            };
            if st.comm.is_none() && st.qp_type != IBV_QPT_UD {
                return err(EINVAL);
            }
        }
        // As librdmacm: the QP to the error state first (its work completes flushed).
        // SAFETY: a live id of ours.
        let qp = unsafe { (*id).qp };
        if !qp.is_null() {
            // SAFETY: plain data.
            let mut a: ibv_qp_attr = unsafe { zeroed() };
            a.qp_state = IBV_QPS_ERR;
            verbs::ibv_modify_qp(qp, &mut a, IBV_QP_STATE);
        }
        let (_, mut g) = tri!(locked());
        let s = svc(&mut g);
        let Some(st) = s.ids.get_mut(&(id as usize)) else {
            return err(EINVAL);
        };
        let was = st.st;
        let (sync, chan) = (st.sync, st.chan);
        st.st = St::Disconnected;
        let mut ending = false;
        if let (Some(c), St::Connected | St::Accepting | St::RepRcvd) = (st.comm, was) {
            let now = s.now();
            ending = true;
            if s.agent.disconnect(now, c).is_err() {
                // Not established on the agent's side (our RTU or theirs not through yet):
                // end it as the kernel's destroy would.
                s.agent.close(c);
                s.by_comm.remove(&c.0);
                if let Some(st) = s.ids.get_mut(&(id as usize)) {
                    st.comm = None;
                }
                s.event(
                    id as usize,
                    Ev::new(id as usize, RDMA_CM_EVENT_DISCONNECTED, 0),
                );
            }
        }
        // A synchronous id waits for its DISCONNECTED, as librdmacm's rdma_disconnect ends in
        // ucma_complete: the one our DREQ brings (its DREP, or its retries run out), or the
        // one the peer's DREQ left unread. Nothing to wait for otherwise (a second call).
        let queued = s
            .queues
            .get(&chan)
            .is_some_and(|q| q.iter().any(|e| e.ev.id == id));
        drop(g);
        if sync && (ending || queued) {
            return complete(id);
        }
        0
    })
}

pub extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    guard(
        err(libc::EIO),
        || if id.is_null() { err(EINVAL) } else { 0 },
    )
}

pub extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, ch: *mut rdma_event_channel) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() {
            return err(EINVAL);
        }
        let (_, mut g) = tri!(locked());
        let s = svc(&mut g);
        let Some(old) = s.ids.get(&(id as usize)).map(|i| (i.chan, i.sync)) else {
            return err(EINVAL);
        };
        let (chan, sync) = if ch.is_null() {
            (tri!(make_channel(s)), true)
        } else if s.queues.contains_key(&(ch as usize)) {
            (ch, false)
        } else {
            return err(EINVAL);
        };
        // Its unread events move with it.
        let mut moved = Vec::new();
        if let Some(q) = s.queues.get_mut(&old.0) {
            let mut keep = std::collections::VecDeque::new();
            while let Some(e) = q.pop_front() {
                if e.ev.id == id {
                    moved.push(e);
                } else {
                    keep.push_back(e);
                }
            }
            *q = keep;
        }
        let st = s.ids.get_mut(&(id as usize)).expect("checked");
        st.chan = chan as usize;
        st.sync = sync;
        // SAFETY: a live id of ours.
        unsafe { (*id).channel = chan };
        for e in moved {
            s.push(chan as usize, e);
        }
        if old.1 {
            free_channel(s, old.0 as *mut rdma_event_channel);
        }
        0
    })
}

// ---- QPs --------------------------------------------------------------------------------------

pub const IBV_QPS_INIT: c_int = 1;
pub const IBV_QPS_RTR: c_int = 2;
pub const IBV_QPS_RTS: c_int = 3;
pub const IBV_QPS_ERR: c_int = 6;
const IBV_QP_STATE: c_int = 1;
const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
const IBV_QP_PORT: c_int = 1 << 5;
const IBV_QP_QKEY: c_int = 1 << 6;
const IBV_QP_AV: c_int = 1 << 7;
const IBV_QP_PATH_MTU: c_int = 1 << 8;
const IBV_QP_TIMEOUT: c_int = 1 << 9;
const IBV_QP_RETRY_CNT: c_int = 1 << 10;
const IBV_QP_RNR_RETRY: c_int = 1 << 11;
const IBV_QP_RQ_PSN: c_int = 1 << 12;
const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
const IBV_QP_SQ_PSN: c_int = 1 << 16;
const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const IBV_QP_DEST_QPN: c_int = 1 << 20;
const ACCESS_REMOTE_WRITE: u32 = 2;
const ACCESS_REMOTE_READ: u32 = 4;
const ACCESS_REMOTE_ATOMIC: u32 = 8;
/// The local ACK timeout of a connection's QP when the program sets none: Linux's ib_cm takes
/// the path's packet lifetime plus one, and rdma_cm gives RoCE paths a lifetime of 16
/// (CMA_IBOE_PACKET_LIFETIME; unverified).
const DEFAULT_ACK_TIMEOUT: u8 = 17;

/// The attributes librdmacm gets from the kernel (`rdma_init_qp_attr`) to move id's QP to
/// `state`, from what the connection settled: as Linux's cm.c `cm_init_qp_*_attr` and cma.c
/// `cma_ib_init_qp_attr`.
fn qp_attr(id: *mut rdma_cm_id, state: c_int) -> Result<(ibv_qp_attr, c_int), c_int> {
    let (_, mut g) = locked()?;
    let s = svc(&mut g);
    let st = s.ids.get(&(id as usize)).ok_or(EINVAL)?;
    // SAFETY: plain data.
    let mut a: ibv_qp_attr = unsafe { zeroed() };
    a.qp_state = state;
    let c = st.conn;
    let connected = st.comm.is_some() || st.st == St::Connected;
    let mask = match (state, st.qp_type) {
        (IBV_QPS_INIT, IBV_QPT_UD) => {
            a.port_num = 1;
            a.qkey = RDMA_UDP_QKEY;
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
        }
        (IBV_QPS_INIT, _) => {
            a.port_num = 1;
            a.qp_access_flags = if connected {
                ACCESS_REMOTE_WRITE
                    | if c.resp_res > 0 {
                        ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC
                    } else {
                        0
                    }
            } else {
                0
            };
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
        }
        (IBV_QPS_RTR, IBV_QPT_UD) => IBV_QP_STATE,
        (IBV_QPS_RTR, t) => {
            if !connected {
                return Err(EINVAL);
            }
            let dst = st.dst.ok_or(EINVAL)?;
            let src = st.src.ok_or(EINVAL)?;
            a.path_mtu = c.path_mtu as c_int;
            a.dest_qp_num = c.remote_qpn;
            a.rq_psn = c.my_psn;
            a.ah_attr = ah_to(dst.ip(), s.gid_index(src.ip()), st.tos, c.flow_label);
            let mut m =
                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
            if t == IBV_QPT_RC {
                a.max_dest_rd_atomic = c.resp_res;
                a.min_rnr_timer = 0;
                m |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
            }
            m
        }
        (IBV_QPS_RTS, IBV_QPT_UD) => {
            a.sq_psn = 0;
            IBV_QP_STATE | IBV_QP_SQ_PSN
        }
        (IBV_QPS_RTS, t) => {
            if !connected {
                return Err(EINVAL);
            }
            a.sq_psn = c.remote_psn;
            let mut m = IBV_QP_STATE | IBV_QP_SQ_PSN;
            if t == IBV_QPT_RC {
                a.timeout = st.ack_timeout.unwrap_or(DEFAULT_ACK_TIMEOUT);
                a.retry_cnt = c.retry_count;
                a.rnr_retry = c.rnr_retry_count;
                a.max_rd_atomic = c.init_depth;
                m |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
            }
            m
        }
        _ => return Err(EINVAL),
    };
    Ok((a, mask))
}

/// Moves id's QP to `state` with the connection's attributes (RTR from INIT goes through INIT
/// again first, for the access flags the connection settled, as librdmacm does).
fn move_qp(id: *mut rdma_cm_id, state: c_int) -> Result<(), c_int> {
    // SAFETY: a live id of ours.
    let qp = unsafe { (*id).qp };
    if qp.is_null() {
        return Err(EINVAL);
    }
    if state == IBV_QPS_RTR {
        // SAFETY: a QP of ours.
        let cur = unsafe { (*qp).state };
        if cur == IBV_QPS_INIT {
            let (mut a, m) = qp_attr(id, IBV_QPS_INIT)?;
            let r = verbs::ibv_modify_qp(qp, &mut a, m);
            if r != 0 {
                return Err(r);
            }
        }
    }
    let (mut a, m) = qp_attr(id, state)?;
    match verbs::ibv_modify_qp(qp, &mut a, m) {
        0 => Ok(()),
        e => Err(e),
    }
}

pub extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() || attr.is_null() || mask.is_null() {
            return err(EINVAL);
        }
        // SAFETY: the caller's attributes: it names the state it asks about.
        let state = unsafe { (*attr).qp_state };
        let (a, m) = tri!(qp_attr(id, state));
        // SAFETY: the caller's out pointers.
        unsafe {
            *attr = a;
            *mask = m;
        }
        0
    })
}

/// CQs (each with its completion channel) for an id whose program gave none, as librdmacm's
/// `ucma_create_cqs`.
fn make_cqs(id: *mut rdma_cm_id, send: u32, recv: u32) -> Result<(), c_int> {
    // SAFETY: a live id of ours.
    let i = unsafe { &mut *id };
    let made_recv = recv > 0 && i.recv_cq.is_null();
    if made_recv {
        (i.recv_cq_channel, i.recv_cq) = cq_with_channel(i.verbs, recv, id)?;
    }
    if send > 0 && i.send_cq.is_null() {
        match cq_with_channel(i.verbs, send, id) {
            Ok(pair) => (i.send_cq_channel, i.send_cq) = pair,
            Err(e) => {
                // Nothing half made stays behind: the receive CQ made just now goes too.
                if made_recv {
                    verbs::ibv_destroy_cq(i.recv_cq);
                    verbs::ibv_destroy_comp_channel(i.recv_cq_channel);
                    (i.recv_cq, i.recv_cq_channel) = (null_mut(), null_mut());
                }
                return Err(e);
            }
        }
    }
    Ok(())
}

/// A completion channel and a CQ of `cqe` entries on it, whose context is the id.
fn cq_with_channel(
    ctx: *mut ibv_context,
    cqe: u32,
    id: *mut rdma_cm_id,
) -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
    let ch = verbs::ibv_create_comp_channel(ctx);
    if ch.is_null() {
        return Err(libc::ENOMEM);
    }
    let cq = verbs::ibv_create_cq(ctx, cqe.max(1) as c_int, id.cast(), ch, 0);
    if cq.is_null() {
        verbs::ibv_destroy_comp_channel(ch);
        return Err(libc::ENOMEM);
    }
    Ok((ch, cq))
}

fn free_cqs(id: *mut rdma_cm_id) {
    // SAFETY: a live id of ours.
    let i = unsafe { &mut *id };
    if !i.recv_cq.is_null() {
        verbs::ibv_destroy_cq(i.recv_cq);
        i.recv_cq = null_mut();
    }
    if !i.recv_cq_channel.is_null() {
        verbs::ibv_destroy_comp_channel(i.recv_cq_channel);
        i.recv_cq_channel = null_mut();
    }
    if !i.send_cq.is_null() {
        verbs::ibv_destroy_cq(i.send_cq);
        i.send_cq = null_mut();
    }
    if !i.send_cq_channel.is_null() {
        verbs::ibv_destroy_comp_channel(i.send_cq_channel);
        i.send_cq_channel = null_mut();
    }
}

/// Creates the QP and moves it as librdmacm does: an RC/UC QP to INIT, a UD QP to RTS.
fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    init: &mut ibv_qp_init_attr,
) -> Result<*mut ibv_qp, c_int> {
    {
        let (_, mut g) = locked()?;
        if !svc(&mut g).ids.contains_key(&(id as usize)) {
            return Err(EINVAL);
        }
    }
    // SAFETY: a live id of ours.
    let i = unsafe { &mut *id };
    if !i.qp.is_null() {
        return Err(libc::EEXIST);
    }
    let pd = if !pd.is_null() {
        pd
    } else if !i.pd.is_null() {
        i.pd
    } else {
        default_pd()?
    };
    let mut made = false;
    if init.send_cq.is_null() || init.recv_cq.is_null() {
        make_cqs(
            id,
            if init.send_cq.is_null() {
                init.cap.max_send_wr
            } else {
                0
            },
            if init.recv_cq.is_null() {
                init.cap.max_recv_wr
            } else {
                0
            },
        )?;
        made = true;
        if init.send_cq.is_null() {
            init.send_cq = i.send_cq;
        }
        if init.recv_cq.is_null() {
            init.recv_cq = i.recv_cq;
        }
    }
    if init.srq.is_null() && !i.srq.is_null() {
        init.srq = i.srq;
    }
    // rdma_create_ep's callers leave the type to the address info (the id's).
    if init.qp_type == 0 {
        init.qp_type = i.qp_type;
    }
    let qp = verbs::ibv_create_qp(pd, init);
    if qp.is_null() {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOMEM);
        if made {
            free_cqs(id);
        }
        return Err(e);
    }
    i.qp = qp;
    // As librdmacm: the id remembers its QP's PD (rdma_reg_msgs registers with `id->pd`).
    i.pd = pd;
    let steps: &[c_int] = if init.qp_type == IBV_QPT_UD {
        &[IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS]
    } else {
        &[IBV_QPS_INIT]
    };
    for &s in steps {
        if let Err(e) =
            qp_attr(id, s).and_then(|(mut a, m)| match verbs::ibv_modify_qp(qp, &mut a, m) {
                0 => Ok(()),
                e => Err(e),
            })
        {
            verbs::ibv_destroy_qp(qp);
            i.qp = null_mut();
            if made {
                free_cqs(id);
            }
            return Err(e);
        }
    }
    if made {
        let (_, mut g) = locked()?;
        if let Some(st) = svc(&mut g).ids.get_mut(&(id as usize)) {
            st.own_cqs = true;
        }
    }
    Ok(qp)
}

pub extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() || attr.is_null() {
            return err(EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        tri!(create_qp(id, pd, a));
        0
    })
}

pub extern "C" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() || attr.is_null() {
            return err(EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        if a.comp_mask & !(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 {
            return err(libc::EOPNOTSUPP);
        }
        let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            a.pd
        } else {
            null_mut()
        };
        let mut init = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        tri!(create_qp(id, pd, &mut init));
        a.send_cq = init.send_cq;
        a.recv_cq = init.recv_cq;
        0
    })
}

pub extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        if id.is_null() {
            return;
        }
        let own = {
            let Ok((_, mut g)) = locked() else { return };
            match svc(&mut g).ids.get_mut(&(id as usize)) {
                Some(st) => std::mem::replace(&mut st.own_cqs, false),
                None => return,
            }
        };
        // SAFETY: a live id of ours.
        let i = unsafe { &mut *id };
        if !i.qp.is_null() {
            verbs::ibv_destroy_qp(i.qp);
            i.qp = null_mut();
        }
        if own {
            free_cqs(id);
        }
    })
}

pub extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() || attr.is_null() {
            return err(EINVAL);
        }
        let pd = if pd.is_null() { tri!(default_pd()) } else { pd };
        let srq = verbs::ibv_create_srq(pd, attr);
        if srq.is_null() {
            return -1;
        }
        // SAFETY: a live id of ours (the program's contract).
        unsafe { (*id).srq = srq };
        let (_, mut g) = tri!(locked());
        if let Some(st) = svc(&mut g).ids.get_mut(&(id as usize)) {
            st.own_srq = true;
        }
        0
    })
}

pub extern "C" fn rdma_create_srq_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    err(libc::EOPNOTSUPP)
}

pub extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        if id.is_null() {
            return;
        }
        // SAFETY: a live id of ours.
        let i = unsafe { &mut *id };
        if !i.srq.is_null() {
            verbs::ibv_destroy_srq(i.srq);
            i.srq = null_mut();
        }
    })
}

// ---- the synchronous family -----------------------------------------------------------------

pub extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() || res.is_null() {
            return err(EINVAL);
        }
        // SAFETY: the caller's addrinfo (one of rdma_getaddrinfo's, usually).
        let r = unsafe { &*res };
        let ps = if r.ai_port_space != 0 {
            r.ai_port_space
        } else {
            RDMA_PS_TCP
        };
        let qt = if r.ai_qp_type != 0 {
            r.ai_qp_type
        } else {
            qp_type_of_ps(ps).unwrap_or(IBV_QPT_RC)
        };
        let cid = tri!(create_id(null_mut(), null_mut(), ps, qt));
        let fail = |e: c_int| {
            rdma_destroy_id(cid);
            err(e)
        };
        if r.ai_flags & RAI_PASSIVE != 0 {
            if !r.ai_src_addr.is_null() && rdma_bind_addr(cid, r.ai_src_addr) != 0 {
                return fail(errno());
            }
            if !qp_init_attr.is_null() {
                // SAFETY: the caller's attributes, copied for the requests to come.
                let a = unsafe { std::ptr::read(qp_init_attr) };
                let (_, mut g) = match locked() {
                    Ok(v) => v,
                    Err(e) => return fail(e),
                };
                if let Some(st) = svc(&mut g).ids.get_mut(&(cid as usize)) {
                    st.ep_qp = Some((a, pd as usize));
                }
            }
        } else {
            if rdma_resolve_addr(cid, r.ai_src_addr, r.ai_dst_addr, 2000) != 0 {
                return fail(errno());
            }
            if rdma_resolve_route(cid, 2000) != 0 {
                return fail(errno());
            }
            if !qp_init_attr.is_null() {
                // SAFETY: the caller's attributes (librdmacm writes the CQs it made back).
                let a = unsafe { &mut *qp_init_attr };
                if let Err(e) = create_qp(cid, pd, a) {
                    return fail(e);
                }
            }
        }
        // SAFETY: the caller's out pointer.
        unsafe { *id = cid };
        0
    })
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

pub extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        if id.is_null() {
            return;
        }
        rdma_destroy_qp(id);
        let own_srq = {
            let Ok((_, mut g)) = locked() else { return };
            svc(&mut g)
                .ids
                .get(&(id as usize))
                .is_some_and(|s| s.own_srq)
        };
        if own_srq {
            rdma_destroy_srq(id);
        }
        rdma_destroy_id(id);
    })
}

pub extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    guard(err(libc::EIO), || {
        if listen.is_null() || id.is_null() {
            return err(EINVAL);
        }
        let (sync, chan, ep) = {
            let (_, mut g) = tri!(locked());
            match svc(&mut g).ids.get(&(listen as usize)) {
                Some(s) if s.st == St::Listen => (s.sync, s.chan, s.ep_qp),
                _ => return err(EINVAL),
            }
        };
        if !sync {
            return err(EINVAL);
        }
        let mut ev: *mut rdma_cm_event = null_mut();
        if rdma_get_cm_event(chan as *mut rdma_event_channel, &mut ev) != 0 {
            return -1;
        }
        // SAFETY: the event just taken.
        let (kind, status, nid) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
        if status != 0 {
            rdma_ack_cm_event(ev);
            return err(if status < 0 { -status } else { status });
        }
        if kind != RDMA_CM_EVENT_CONNECT_REQUEST {
            rdma_ack_cm_event(ev);
            return err(libc::ECONNABORTED);
        }
        // The request's id gets a synchronous channel of its own (librdmacm migrates it).
        if rdma_migrate_id(nid, null_mut()) != 0 {
            rdma_ack_cm_event(ev);
            return -1;
        }
        if let Some((mut a, pd)) = ep {
            if let Err(e) = create_qp(nid, pd as *mut ibv_pd, &mut a) {
                rdma_ack_cm_event(ev);
                rdma_reject(nid, std::ptr::null(), 0);
                rdma_destroy_id(nid);
                return err(e);
            }
        }
        // SAFETY: a live id of ours; the caller's out pointer.
        unsafe {
            (*nid).event = ev;
            *id = nid;
        }
        0
    })
}

// ---- options, devices, strings ---------------------------------------------------------------

pub extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: size_t,
) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() || val.is_null() {
            return err(EINVAL);
        }
        let (_, mut g) = tri!(locked());
        let s = svc(&mut g);
        let Some(st) = s.ids.get_mut(&(id as usize)) else {
            return err(EINVAL);
        };
        // SAFETY: the caller's option value of `len` bytes (checked per option).
        unsafe {
            match (level, name) {
                (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if len == 1 => st.tos = *(val as *const u8),
                (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) if len == 4 => {
                    st.reuseaddr = *(val as *const c_int) != 0
                }
                (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) if len == 4 => {
                    st.afonly = *(val as *const c_int) != 0
                }
                (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if len == 1 => {
                    st.ack_timeout = Some((*(val as *const u8)).min(31))
                }
                // Path records: RoCE's path is the addresses' (accepted, not used).
                (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {}
                (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT)
                | (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => {
                    return err(EINVAL)
                }
                _ => return err(libc::ENOSYS),
            }
        }
        0
    })
}

pub extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(null_mut(), || {
        let ctx = default_ctx().ok();
        let v: Vec<*mut ibv_context> = ctx.into_iter().chain(std::iter::once(null_mut())).collect();
        if !num.is_null() {
            // SAFETY: the caller's out pointer.
            unsafe { *num = (v.len() - 1) as c_int };
        }
        Box::into_raw(v.into_boxed_slice()) as *mut *mut ibv_context
    })
}

pub extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    guard((), || {
        if list.is_null() {
            return;
        }
        // SAFETY: a list from rdma_get_devices: a boxed slice ending in NULL.
        unsafe {
            let mut n = 0;
            while !(*list.add(n)).is_null() {
                n += 1;
            }
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                list,
                n + 1,
            )));
        }
    })
}

pub extern "C" fn rdma_event_str(e: c_int) -> *const c_char {
    let s: &'static [u8] = match e {
        RDMA_CM_EVENT_ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        RDMA_CM_EVENT_ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        RDMA_CM_EVENT_ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        RDMA_CM_EVENT_ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        RDMA_CM_EVENT_CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        RDMA_CM_EVENT_CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        RDMA_CM_EVENT_CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        RDMA_CM_EVENT_UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
        RDMA_CM_EVENT_REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
        RDMA_CM_EVENT_ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
        RDMA_CM_EVENT_DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
        RDMA_CM_EVENT_DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        RDMA_CM_EVENT_MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        RDMA_CM_EVENT_MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        RDMA_CM_EVENT_ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr().cast()
}

fn port_of(a: &libc::sockaddr_storage) -> u16 {
    // SAFETY: a sockaddr_storage of ours: its family says which view is valid.
    unsafe {
        match a.ss_family as c_int {
            libc::AF_INET => (*(a as *const _ as *const libc::sockaddr_in)).sin_port,
            libc::AF_INET6 => (*(a as *const _ as *const libc::sockaddr_in6)).sin6_port,
            _ => 0,
        }
    }
}

pub extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    match NonNull::new(id) {
        // SAFETY: an id of ours (the program's contract).
        Some(p) => port_of(unsafe { &p.as_ref().route.addr.src_storage }),
        None => 0,
    }
}

pub extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    match NonNull::new(id) {
        // SAFETY: an id of ours (the program's contract).
        Some(p) => port_of(unsafe { &p.as_ref().route.addr.dst_storage }),
        None => 0,
    }
}

// ---- what RoCEmu does not do ------------------------------------------------------------------

/// Multicast needs the RNIC's multicast groups, which it does not have yet (`ibv_attach_mcast`
/// answers EOPNOTSUPP too).
pub extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut sockaddr,
    _context: *mut c_void,
) -> c_int {
    err(libc::ENOSYS)
}

pub extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut rdma_cm_join_mc_attr_ex,
    _context: *mut c_void,
) -> c_int {
    err(libc::ENOSYS)
}

pub extern "C" fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut sockaddr) -> c_int {
    err(libc::ENOSYS)
}

/// ECE (enhanced connection establishment, a ConnectX option carried in the CM's private
/// data): not negotiated.
pub extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut ibv_ece) -> c_int {
    err(libc::EOPNOTSUPP)
}

pub extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut ibv_ece) -> c_int {
    err(libc::EOPNOTSUPP)
}

/// How many objects are live: for leak checks (`dlsym(RTLD_DEFAULT, "rocemu_live_objects")`).
#[repr(C)]
pub struct rocemu_objects {
    pub pds: u64,
    pub cqs: u64,
    pub qps: u64,
    pub srqs: u64,
    pub mrs: u64,
    pub ahs: u64,
    pub comp_channels: u64,
    pub cm_ids: u64,
    pub cm_connections: u64,
    pub event_channels: u64,
}

pub extern "C" fn rocemu_live_objects(out: *mut rocemu_objects, len: size_t) -> c_int {
    guard(err(libc::EIO), || {
        if out.is_null() {
            return err(EINVAL);
        }
        let l = super::live::get;
        let conns = match locked() {
            Ok((_, mut g)) => svc(&mut g).agent.connections() as u64,
            Err(_) => 0,
        };
        let o = rocemu_objects {
            pds: l(super::live::PDS),
            cqs: l(super::live::CQS),
            qps: l(super::live::QPS),
            srqs: l(super::live::SRQS),
            mrs: l(super::live::MRS),
            ahs: l(super::live::AHS),
            comp_channels: l(super::live::COMP_CHANNELS),
            cm_ids: l(super::live::IDS),
            cm_connections: conns,
            event_channels: l(super::live::CHANNELS),
        };
        let n = len.min(std::mem::size_of::<rocemu_objects>());
        // SAFETY: the caller's buffer of `len` bytes; we write at most that many.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&o as *const rocemu_objects).cast::<u8>(),
                out.cast::<u8>(),
                n,
            )
        };
        0
    })
}

pub use super::addrinfo::{rdma_freeaddrinfo, rdma_getaddrinfo};
#[allow(unused_imports)]
use CommId as _;
