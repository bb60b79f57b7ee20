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
//!
//! Layout: [`LabConfig`] (`config.rs`) says what to build; `guest.rs` builds the guest image;
//! `network.rs` makes the namespace, bridge, veth and taps; `vm.rs` boots QEMU and waits for the
//! guests; [`RxeLab`] (`lab.rs`) owns a lab's lifetime; `state.rs` is the state file, stale-lab
//! reaping and [`down`]; [`Ctl`] and [`Bg`] (`ctl.rs`) are the control channel; `cli.rs` is
//! `rocemu rxevm`. Everything public is re-exported here: the paths are `rxevm::…`.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod cli;
mod config;
mod ctl;
mod guest;
mod lab;
mod network;
mod state;
mod vm;

pub use cli::cli;
pub use config::LabConfig;
pub use ctl::{Bg, Ctl, Output};
pub use guest::{build_guest, Guest};
pub use lab::{HostSide, RxeLab};
pub use state::{down, reap_stale};
pub use vm::Vm;

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

pub(super) fn nonce() -> String {
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

pub(super) fn write_atomic(path: &Path, data: &[u8]) -> Result<(), String> {
    if std::fs::read(path).ok().as_deref() == Some(data) {
        return Ok(());
    }
    let tmp = path.with_extension(format!("tmp{}", nonce()));
    std::fs::write(&tmp, data).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

pub(super) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub(super) fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

pub(super) fn short(cmd: &str) -> String {
    let one = cmd.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() > 100 {
        format!("{}…", one.chars().take(100).collect::<String>())
    } else {
        one
    }
}

pub(super) fn tail(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    let mut t = v[v.len().saturating_sub(n)..].join("\n");
    if !t.is_empty() {
        t.push('\n');
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

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
