//! The EAL as a value: [`Eal::init`] runs `rte_eal_init` and the last clone's `Drop` runs
//! `rte_eal_cleanup`.
//!
//! Invariants: `rte_eal_init` succeeds at most once per process (DPDK cannot initialise the EAL
//! again, even after `rte_eal_cleanup`), so a second [`Eal::init`] is an error while or after an
//! `Eal` lives; [`Eal::current`] hands out the live one. Every other value of this crate holds an
//! `Eal` clone, so the EAL's memory outlives every mempool, mbuf and port.
use crate::error::{check, rte_errno, Error, Result, EACCES, EALREADY, EINVAL, ENODEV, ENOMEM};
use rocemu_dpdk_sys as sys;
use std::ffi::{c_char, c_int, CStr, CString};
use std::fmt;
use std::sync::{Arc, Mutex, Weak};

/// What this process did with the EAL.
enum State {
    /// Never initialised, or every attempt failed.
    Uninit,
    /// Initialised; the EAL is live while the `Weak` upgrades.
    Live(Weak<Inner>),
    /// Initialised and cleaned up: DPDK cannot be initialised again in this process.
    Done,
}

static STATE: Mutex<State> = Mutex::new(State::Uninit);

fn state() -> std::sync::MutexGuard<'static, State> {
    // A panic while holding the lock cannot leave `State` half-written: every write is one store.
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

struct Inner {
    args: Vec<String>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The interrupt thread, if the gate runs it, is parked for good first.
        crate::gate::close();
        // SAFETY: the last `Eal` is gone, and with it every value of this crate that used DPDK
        // (they all hold an `Eal`), so nothing of the EAL is in use from Rust any more.
        unsafe { sys::rte_eal_cleanup() };
        *state() = State::Done;
    }
}

/// The initialised DPDK Environment Abstraction Layer. Cheap to clone; the last clone to go
/// runs `rte_eal_cleanup`.
#[derive(Clone)]
pub struct Eal(Arc<Inner>);

impl fmt::Debug for Eal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Eal").field("args", &self.0.args).finish()
    }
}

impl Eal {
    /// Runs `rte_eal_init` with `args` split like a shell splits words (see
    /// [`split_args`](crate::split_args)) and `rocemu` as argv\[0\], e.g.
    /// `--no-huge -m 256 --no-pci --file-prefix=t1 --vdev=net_ring0`.
    ///
    /// The calling thread becomes the EAL's main lcore: the EAL pins it (and so the threads it
    /// spawns afterwards) to that lcore's CPUs; use `--lcores` or `-l` to choose them.
    /// Arguments after `--` are not the EAL's and are ignored. The EAL can be initialised once
    /// per process: a second call fails while (or after) an `Eal` lives.
    pub fn init(args: &str) -> Result<Eal> {
        let words = crate::split_args(args)?;
        Eal::init_words(words)
    }

    /// [`Eal::init`] with the arguments already split.
    pub fn init_words<I, S>(args: I) -> Result<Eal>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let args: Vec<String> = args.into_iter().map(Into::into).collect();
        let shown = args.join(" ");
        if let Some(a) = args
            .iter()
            .take_while(|a| *a != "--")
            .find(|a| *a == "-h" || *a == "--help")
        {
            return Err(Error::other(
                "rte_eal_init",
                format!("`{a}` would make the EAL print its usage and exit the process"),
            ));
        }
        let mut argv_c = Vec::with_capacity(args.len() + 1);
        for a in std::iter::once("rocemu").chain(args.iter().map(String::as_str)) {
            let c = CString::new(a).map_err(|_| {
                Error::other(
                    "rte_eal_init",
                    format!("EAL argument `{a}` contains a NUL byte"),
                )
            })?;
            argv_c.push(c);
        }

        let mut st = state();
        match &*st {
            State::Live(w) if w.strong_count() > 0 => {
                return Err(Error::dpdk(
                    "rte_eal_init",
                    EALREADY,
                    "the EAL is already initialised in this process and DPDK allows that once: \
                     open more ports on the live one (Eal::current, DpdkPort::open_port)",
                ));
            }
            State::Live(_) | State::Done => {
                return Err(Error::dpdk(
                    "rte_eal_init",
                    EALREADY,
                    "the EAL was initialised and cleaned up in this process; DPDK cannot \
                     initialise it again: start a new process",
                ));
            }
            State::Uninit => {}
        }

        // The EAL permutes argv (getopt) and may keep pointers into it for the life of the
        // process, so argv and its strings are leaked: a few bytes, once per process.
        let argv: &'static mut [*mut c_char] = Vec::leak(
            argv_c
                .into_iter()
                .map(CString::into_raw)
                .chain(std::iter::once(std::ptr::null_mut()))
                .collect(),
        );
        let argc = (argv.len() - 1) as c_int;
        // SAFETY: argv holds argc valid NUL-terminated strings followed by a NULL, all leaked so
        // they live as long as the process; the state lock serialises calls from this crate.
        let ret = unsafe { sys::rte_eal_init(argc, argv.as_mut_ptr()) };
        if ret < 0 {
            let errno = rte_errno();
            let hint = match errno {
                EALREADY => format!(
                    "the EAL was already initialised in this process (outside this crate, or an \
                     earlier rte_eal_init failed half-way and left it unusable); arguments: `{shown}`"
                ),
                EINVAL => format!(
                    "the EAL rejected its arguments (it printed why above): `{shown}`"
                ),
                ENODEV => format!(
                    "no driver takes a device the arguments name (the EAL printed which above; \
                     drivers load from {}): `{shown}`",
                    sys::PMD_DIR
                ),
                ENOMEM | EACCES => format!(
                    "arguments: `{shown}`; without hugepages add `--no-huge -m 256`, and give \
                     each process its own `--file-prefix`"
                ),
                _ => format!("arguments: `{shown}` (the EAL printed more above)"),
            };
            return Err(Error::dpdk("rte_eal_init", errno, hint));
        }
        let inner = Arc::new(Inner { args });
        *st = State::Live(Arc::downgrade(&inner));
        Ok(Eal(inner))
    }

    /// The live EAL of this process, if one was initialised through this crate and not yet
    /// cleaned up.
    pub fn current() -> Option<Eal> {
        match &*state() {
            State::Live(w) => w.upgrade().map(Eal),
            _ => None,
        }
    }

    /// The arguments it was initialised with (without argv\[0\]).
    pub fn args(&self) -> &[String] {
        &self.0.args
    }

    /// The ids of the Ethernet ports the EAL found (`rte_eth_find_next`), in order.
    pub fn ports(&self) -> Vec<u16> {
        let mut out = Vec::new();
        // SAFETY: rte_eth_find_next only reads the port table, which the live EAL owns.
        let mut id = unsafe { sys::rte_eth_find_next(0) };
        while u32::from(id) < sys::RTE_MAX_ETHPORTS {
            out.push(id);
            // SAFETY: as above.
            id = unsafe { sys::rte_eth_find_next(id + 1) };
        }
        out
    }

    /// The first available port, or an error saying how to make one appear.
    pub fn first_port(&self) -> Result<u16> {
        self.ports().first().copied().ok_or_else(|| {
            Error::other(
                "rte_eth_find_next",
                format!(
                    "no DPDK port: the EAL found no usable Ethernet device (arguments `{}`). \
                     Name one with --vdev (e.g. --vdev=net_ring0, --vdev=net_memif0,role=server, \
                     --vdev=net_af_packet0,iface=eth0) or -a <PCI address> bound to vfio-pci; \
                     drivers load from {} (see the EAL's messages above)",
                    self.0.args.join(" "),
                    sys::PMD_DIR
                ),
            )
        })
    }

    /// The id of the port named `name` (`net_ring0`, `0000:3b:00.0`, …).
    pub fn port_by_name(&self, name: &str) -> Result<u16> {
        let c = CString::new(name)
            .map_err(|_| Error::other("rte_eth_dev_get_port_by_name", "name contains a NUL"))?;
        let mut id = 0u16;
        // SAFETY: `c` is a valid C string and `id` a valid place for the result; both outlive
        // the call.
        let ret = unsafe { sys::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id) };
        check("rte_eth_dev_get_port_by_name", ret, || {
            let names: Vec<String> = self
                .ports()
                .into_iter()
                .filter_map(|p| port_name(p).ok())
                .collect();
            format!(
                "no port named `{name}`; the ports are [{}]",
                names.join(", ")
            )
        })?;
        Ok(id)
    }
}

/// The name of port `id` (`rte_eth_dev_get_name_by_port`).
pub(crate) fn port_name(id: u16) -> Result<String> {
    let mut buf = [0 as c_char; sys::RTE_ETH_NAME_MAX_LEN as usize];
    // SAFETY: `buf` has the RTE_ETH_NAME_MAX_LEN bytes the function may write, NUL included.
    let ret = unsafe { sys::rte_eth_dev_get_name_by_port(id, buf.as_mut_ptr()) };
    check("rte_eth_dev_get_name_by_port", ret, || format!("port {id}"))?;
    // SAFETY: on success the function wrote a NUL-terminated string into `buf`.
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}
