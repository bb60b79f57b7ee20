//! `rocemu exec` (contract: shared/contracts.md): runs an unmodified ibverbs program on RoCEmu's
//! drop-in `libibverbs.so.1` (crate `dropin/ibverbs`), with the datapath given on the command line.
//!
//! What it does, in order, and the invariants each step keeps:
//! - It finds the library directory ([`libdir`]): `$ROCEMU_LIBDIR`, or `rocemu-lib/` beside the
//!   running executable, a folder of symlinks under the sonames (`libibverbs.so.1 ->
//!   ../libibverbs.so`) so that the loader picks RoCEmu's build first. Links are replaced by
//!   rename, so a program starting while another `rocemu exec` refreshes them never sees a
//!   missing soname. A fallback folder outside the build tree (when that is not writable) must be
//!   a real directory owned by us and writable by nobody else: anyone who could plant a link there
//!   would choose the code every verbs program of ours runs.
//! - It checks the configuration ([`Config::from_args`]) before PROGRAM runs: the `--dev` syntax,
//!   that an AF_PACKET interface exists in this network namespace, `--ip`, `--mac`, `--name`.
//!   Any error is one line on stderr and exit status 125 (as `env`, `nice`, `chroot` do), so a
//!   caller can tell RoCEmu's refusal from PROGRAM's own status.
//! - It replaces itself with PROGRAM (`execvp`): PROGRAM's exit status is the command's, its
//!   signals are its own, and nothing of RoCEmu stays in between. A PROGRAM not found is 127 and
//!   one not executable 126, as in a shell.
//!
//! The library reads its configuration from `ROCEMU_DEV`, `ROCEMU_IP`, `ROCEMU_MAC`,
//! `ROCEMU_NAME`, the congestion control `ROCEMU_ECN`, `ROCEMU_CC`, `ROCEMU_CC_PARAMS`, and the impairments `ROCEMU_LOSS`, `ROCEMU_REORDER`,
//! `ROCEMU_DUPLICATE`, `ROCEMU_CORRUPT`, `ROCEMU_SEED` (`--loss` … `--seed`, checked here as
//! `rocemu perf` checks them; they need `--dev`), and the polling threads `ROCEMU_THREADS`
//! (`--threads`). With `--dev` the command line is the whole
//! configuration: any other of these inherited from the caller's environment is removed
//! unless given again (an impairment of 0 is not set at all). Without `--dev` the caller's `ROCEMU_*` variables pass through unchanged
//! (the library lists no device when there are none).
use std::ffi::{OsStr, OsString};
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use rocemu_wire::eth::Mac;

use crate::datapath::{CcArgs, ImpairArgs};

/// RoCEmu could not start (the convention of `env`, `nice`, `timeout`: 125 is the wrapper's own).
pub const EXIT_CANNOT_START: u8 = 125;
/// PROGRAM exists but could not be executed (a shell's 126).
pub const EXIT_NOT_EXECUTABLE: u8 = 126;
/// PROGRAM not found (a shell's 127).
pub const EXIT_NOT_FOUND: u8 = 127;

/// The sonames the library directory provides, each with the file cargo builds for it (and
/// whether it must exist). One shared object serves both: the loader maps a file once however
/// many names it is reached by, so a program's verbs and its rdma_cm share one RNIC.
const SONAMES: [(&str, &str, bool); 2] = [
    ("libibverbs.so.1", "libibverbs.so", true),
    ("librdmacm.so.1", "libibverbs.so", true),
];

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Datapath of the program's RNIC: af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS'. Without it, the
    /// ROCEMU_* variables of the environment configure the library.
    #[arg(long)]
    dev: Option<String>,
    /// The RNIC's address (its GIDs), IPv4 or IPv6; needed with --dev.
    #[arg(long)]
    ip: Option<String>,
    /// The RNIC's MAC (default: the port's).
    #[arg(long)]
    mac: Option<String>,
    /// The device's name (default rocemu0).
    #[arg(long)]
    name: Option<String>,
    /// ECN, the reaction point and its parameters, as `rocemu perf` takes them (handed on as
    /// ROCEMU_ECN=1, ROCEMU_CC=ALGO, ROCEMU_CC_PARAMS=name=value,...).
    #[command(flatten)]
    cc: CcArgs,
    /// Impairments of every frame of the program's RNIC, both ways, as `rocemu perf` has them
    /// (handed on as ROCEMU_LOSS, ROCEMU_REORDER, ROCEMU_DUPLICATE, ROCEMU_CORRUPT, ROCEMU_SEED).
    #[command(flatten)]
    imp: ImpairArgs,
    /// The device on N polling threads, its QPs dealt out between them (handed on as
    /// ROCEMU_THREADS=N; as `rocemu perf --threads N`: a datapath with several queues, and no
    /// impairments).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Print the directory to put first on LD_LIBRARY_PATH, and exit.
    #[arg(long, conflicts_with_all = ["dev", "ip", "mac", "name", "ecn", "loss", "reorder",
        "duplicate", "corrupt", "seed", "threads", "program"])]
    libdir: bool,
    /// The program and its arguments (after `--`).
    #[arg(
        trailing_var_arg = true,
        required_unless_present = "libdir",
        value_name = "PROGRAM [ARGS]"
    )]
    program: Vec<OsString>,
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match exec(a) {
        Ok(code) => Ok(code),
        Err(Refusal(code, msg)) => {
            eprintln!("rocemu exec: {msg}");
            Ok(ExitCode::from(code))
        }
    }
}

/// Why `rocemu exec` did not become PROGRAM: the exit status and the one line to print.
#[derive(Debug)]
struct Refusal(u8, String);

fn cannot_start(msg: impl Into<String>) -> Refusal {
    Refusal(EXIT_CANNOT_START, msg.into())
}

fn exec(a: &Args) -> Result<ExitCode, Refusal> {
    if a.libdir {
        println!("{}", libdir()?.display());
        return Ok(ExitCode::SUCCESS);
    }
    let cfg = Config::from_args(a)?;
    let dir = libdir()?;
    let (prog, args) = a
        .program
        .split_first()
        .ok_or_else(|| cannot_start("give the program to run after `--`"))?;
    let mut cmd = Command::new(prog);
    cmd.args(args);
    cmd.env(
        "LD_LIBRARY_PATH",
        library_path(&dir, std::env::var_os("LD_LIBRARY_PATH")),
    );
    if let Some(cfg) = cfg {
        for (k, v) in cfg.env() {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
    }
    // Returns only when execvp failed.
    let e = cmd.exec();
    let p = Path::new(prog).display();
    Err(match e.kind() {
        io::ErrorKind::NotFound => Refusal(EXIT_NOT_FOUND, format!("{p}: command not found")),
        _ => Refusal(EXIT_NOT_EXECUTABLE, format!("{p}: cannot execute: {e}")),
    })
}

/// `LD_LIBRARY_PATH` for PROGRAM: the library directory first, then the caller's own entries.
fn library_path(dir: &Path, old: Option<OsString>) -> OsString {
    let mut p = dir.as_os_str().to_owned();
    if let Some(old) = old.filter(|o| !o.is_empty()) {
        p.push(":");
        p.push(old);
    }
    p
}

/// A checked configuration of the library, as given on the command line.
#[derive(Debug, PartialEq)]
struct Config {
    dev: String,
    ip: IpAddr,
    mac: Option<Mac>,
    name: Option<String>,
    cc: CcArgs,
    /// Loss, reorder, duplicate, corrupt: each a probability in 0…1 (checked).
    imp: [f64; 4],
    seed: Option<u64>,
    threads: Option<usize>,
}

/// The impairments' variables, in the order of [`Config::imp`].
const IMPAIR_VARS: [&str; 4] = [
    "ROCEMU_LOSS",
    "ROCEMU_REORDER",
    "ROCEMU_DUPLICATE",
    "ROCEMU_CORRUPT",
];

impl Config {
    /// `None` when no `--dev` is given (the environment's configuration applies): then `--ip` and
    /// `--mac` are refused, as they would configure nothing.
    fn from_args(a: &Args) -> Result<Option<Config>, Refusal> {
        if let Some(n) = &a.name {
            check_name(n)?;
        }
        let imp = a.imp.get().map_err(cannot_start)?;
        let Some(dev) = &a.dev else {
            if a.ip.is_some() || a.mac.is_some() {
                return Err(cannot_start(
                    "--ip and --mac need --dev (af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS')",
                ));
            }
            // (An impairment the environment's configuration would silently go without.)
            if a.cc != CcArgs::default() {
                return Err(cannot_start(
                    "--ecn, --cc and the congestion-control parameters need --dev \
                     (af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS')",
                ));
            }
            if !imp.is_none() || a.imp.seed.is_some() {
                return Err(cannot_start(
                    "--loss, --reorder, --duplicate, --corrupt and --seed need --dev \
                     (af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS')",
                ));
            }
            if a.threads.is_some() {
                return Err(cannot_start(
                    "--threads needs --dev (af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS')",
                ));
            }
            return Ok(None);
        };
        check_dev(dev)?;
        a.cc.config(None).map_err(cannot_start)?;
        if let Some(n) = a.threads {
            use rocemu_emulator::rnic::MAX_SHARDS;
            if !(1..=MAX_SHARDS).contains(&n) {
                return Err(cannot_start(format!(
                    "--threads {n}: from 1 to {MAX_SHARDS}"
                )));
            }
            if n > 1 && !imp.is_none() {
                return Err(cannot_start(format!(
                    "--threads {n} with impairments: each thread's port would need its own"
                )));
            }
        }
        let ip = a.ip.as_deref().ok_or_else(|| {
            cannot_start(format!("--dev {dev} needs --ip ADDR (the RNIC's address)"))
        })?;
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| cannot_start(format!("--ip {ip}: not an IPv4 or IPv6 address")))?;
        if ip.is_unspecified() || ip.is_multicast() || ip == IpAddr::from([255, 255, 255, 255]) {
            return Err(cannot_start(format!("--ip {ip}: not a unicast address")));
        }
        let mac = match &a.mac {
            None => None,
            Some(m) => {
                let mac: Mac = m
                    .parse()
                    .map_err(|e| cannot_start(format!("--mac {m}: {e}")))?;
                if mac == Mac([0; 6]) || mac.is_multicast() {
                    return Err(cannot_start(format!("--mac {m}: not a unicast MAC")));
                }
                Some(mac)
            }
        };
        Ok(Some(Config {
            dev: dev.clone(),
            ip,
            mac,
            name: a.name.clone(),
            cc: a.cc.clone(),
            imp: [imp.loss, imp.reorder, imp.duplicate, imp.corrupt],
            seed: a.imp.seed,
            threads: a.threads,
        }))
    }

    /// The variables the library reads: `Some` to set, `None` to remove.
    fn env(&self) -> Vec<(&'static str, Option<String>)> {
        let mut v = vec![
            ("ROCEMU_DEV", Some(self.dev.clone())),
            ("ROCEMU_IP", Some(self.ip.to_string())),
            ("ROCEMU_MAC", self.mac.map(|m| m.to_string())),
            ("ROCEMU_NAME", self.name.clone()),
        ];
        v.extend(self.cc.env());
        for (k, p) in IMPAIR_VARS.into_iter().zip(self.imp) {
            v.push((k, (p > 0.0).then(|| p.to_string())));
        }
        v.push(("ROCEMU_SEED", self.seed.map(|s| s.to_string())));
        v.push(("ROCEMU_THREADS", self.threads.map(|n| n.to_string())));
        v
    }
}

/// `af_packet:IFACE` or `af_xdp:IFACE` (an interface of this network namespace) or
/// `dpdk:'EAL ARGS'`.
fn check_dev(dev: &str) -> Result<(), Refusal> {
    if let Some(ifname) = rocemu_emulator::port::open::kernel_iface(dev) {
        if ifname.is_empty() || ifname.len() >= 16 || ifname.contains(['/', ' ', '\0']) {
            return Err(cannot_start(format!(
                "--dev {dev}: {ifname:?} is not an interface name"
            )));
        }
        if !interface_exists(ifname) {
            return Err(cannot_start(format!(
                "--dev {dev}: no interface {ifname} in this network namespace (see `ip link`)"
            )));
        }
        Ok(())
    } else if let Some(args) = dev.strip_prefix("dpdk:") {
        if args.trim().is_empty() {
            return Err(cannot_start(format!(
                "--dev {dev}: give the EAL arguments, e.g. dpdk:'--vdev=net_memif0 ...'"
            )));
        }
        Ok(())
    } else {
        Err(cannot_start(format!(
            "--dev {dev}: give af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS'"
        )))
    }
}

/// Whether the interface exists in this process's network namespace (as the library will look
/// for it: `if_nametoindex`, not `/sys`, which may belong to another namespace).
fn interface_exists(ifname: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(ifname) else {
        return false;
    };
    // SAFETY: `if_nametoindex` reads the NUL-terminated string `c`, which lives across the call,
    // and touches no other memory of ours.
    unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
}

/// A device name as `ibv_get_device_name` returns it: 1…63 bytes (IBV_SYSFS_NAME_MAX is 64, with
/// the NUL), printable, no `/` (rdma-core names sysfs paths after it).
fn check_name(n: &str) -> Result<(), Refusal> {
    if n.is_empty() || n.len() > 63 || !n.bytes().all(|b| b.is_ascii_graphic() && b != b'/') {
        return Err(cannot_start(format!(
            "--name {n:?}: a device name is 1 to 63 printable characters without '/'"
        )));
    }
    Ok(())
}

/// The directory to put first on `LD_LIBRARY_PATH`: `$ROCEMU_LIBDIR`, or `rocemu-lib/` beside
/// the running executable (created when missing), or when that folder is not writable,
/// `$XDG_RUNTIME_DIR/rocemu-lib` or `/tmp/rocemu-lib-$UID`.
fn libdir() -> Result<PathBuf, Refusal> {
    if let Some(d) = std::env::var_os("ROCEMU_LIBDIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        if !d.join(SONAMES[0].0).exists() {
            return Err(cannot_start(format!(
                "ROCEMU_LIBDIR={}: no {} there",
                d.display(),
                SONAMES[0].0
            )));
        }
        return Ok(d);
    }
    let exe = std::env::current_exe()
        .map_err(|e| cannot_start(format!("cannot find the rocemu executable: {e}")))?;
    let bin = exe
        .parent()
        .ok_or_else(|| cannot_start("the rocemu executable has no folder"))?;
    let lib = bin.join(SONAMES[0].1);
    if !lib.exists() {
        return Err(cannot_start(format!(
            "no {} beside {}: build it with `cargo build --release` (the dropin/ibverbs crate)",
            SONAMES[0].1,
            exe.display()
        )));
    }
    match link_dir(&bin.join("rocemu-lib"), bin, true) {
        Ok(d) => return Ok(d),
        Err(e)
            if !matches!(
                e.kind(),
                io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            return Err(cannot_start(format!(
                "{}: {e}",
                bin.join("rocemu-lib").display()
            )));
        }
        Err(_) => {}
    }
    let fallback = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("rocemu-lib"),
        // SAFETY: `getuid` has no preconditions and cannot fail.
        None => PathBuf::from(format!("/tmp/rocemu-lib-{}", unsafe { libc::getuid() })),
    };
    link_dir(&fallback, bin, false)
        .map_err(|e| cannot_start(format!("{}: {e}", fallback.display())))
}

/// Makes `dir` hold the sonames' links to the files in `bin` (relative links when `dir` is
/// inside `bin`, absolute ones otherwise), creating it when missing. A folder that is not
/// `bin`'s own must be a directory (not a link) owned by us and writable by no one else.
fn link_dir(dir: &Path, bin: &Path, relative: bool) -> io::Result<PathBuf> {
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if !relative {
        let m = std::fs::symlink_metadata(dir)?;
        // SAFETY: `geteuid` has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if !m.is_dir() || m.uid() != me || m.permissions().mode() & 0o022 != 0 {
            return Err(io::Error::other(
                "not a directory of ours that only we can write: refusing to load libraries from it",
            ));
        }
    }
    for (soname, file, required) in SONAMES {
        let real = bin.join(file);
        if !required && !real.exists() {
            continue;
        }
        let target = if relative {
            Path::new("..").join(file)
        } else {
            real
        };
        ensure_link(&dir.join(soname), &target)?;
    }
    Ok(dir.to_path_buf())
}

/// Points `link` at `target` unless it already does: a link under a temporary name, renamed over
/// `link` (atomic, so a concurrent loader sees the old link or the new one, never none).
fn ensure_link(link: &Path, target: &Path) -> io::Result<()> {
    if std::fs::read_link(link).is_ok_and(|t| t == target) {
        return Ok(());
    }
    let mut tmp = link.as_os_str().to_owned();
    tmp.push(OsStr::new(&format!(".tmp{}", std::process::id())));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dev: Option<&str>, ip: Option<&str>, mac: Option<&str>) -> Args {
        Args {
            dev: dev.map(Into::into),
            ip: ip.map(Into::into),
            mac: mac.map(Into::into),
            name: None,
            cc: CcArgs::default(),
            imp: ImpairArgs {
                loss: 0.0,
                reorder: 0.0,
                duplicate: 0.0,
                corrupt: 0.0,
                seed: None,
            },
            threads: None,
            libdir: false,
            program: vec!["true".into()],
        }
    }

    fn refused(a: &Args) -> String {
        match Config::from_args(a) {
            Err(Refusal(125, m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn loopback_af_packet_configures_every_variable() {
        let mut a = args(
            Some("af_packet:lo"),
            Some("10.0.0.1"),
            Some("02:00:00:00:00:01"),
        );
        a.name = Some("rocemu7".into());
        a.cc.ecn = true;
        let c = Config::from_args(&a).unwrap().unwrap();
        assert_eq!(
            c.env(),
            vec![
                ("ROCEMU_DEV", Some("af_packet:lo".into())),
                ("ROCEMU_IP", Some("10.0.0.1".into())),
                ("ROCEMU_MAC", Some("02:00:00:00:00:01".into())),
                ("ROCEMU_NAME", Some("rocemu7".into())),
                ("ROCEMU_ECN", Some("1".into())),
                ("ROCEMU_CC", None),
                ("ROCEMU_CC_PARAMS", None),
                ("ROCEMU_LOSS", None),
                ("ROCEMU_REORDER", None),
                ("ROCEMU_DUPLICATE", None),
                ("ROCEMU_CORRUPT", None),
                ("ROCEMU_SEED", None),
                ("ROCEMU_THREADS", None),
            ]
        );
    }

    #[test]
    fn threads_are_checked_and_handed_on() {
        let mut a = args(Some("af_packet:lo"), Some("10.0.0.1"), None);
        a.threads = Some(2);
        let env = Config::from_args(&a).unwrap().unwrap().env();
        assert!(env.contains(&("ROCEMU_THREADS", Some("2".into()))));
        for n in [0, rocemu_emulator::rnic::MAX_SHARDS + 1] {
            a.threads = Some(n);
            assert!(refused(&a).contains("from 1 to"), "{n}");
        }
        a.threads = Some(2);
        a.imp.loss = 0.1;
        assert!(refused(&a).contains("with impairments"));
        let mut a = args(None, None, None);
        a.threads = Some(2);
        assert!(refused(&a).contains("--threads needs --dev"));
    }

    #[test]
    fn impairments_are_checked_and_handed_on() {
        let mut a = args(Some("af_packet:lo"), Some("10.0.0.1"), None);
        a.imp.loss = 0.05;
        a.imp.reorder = 0.1;
        a.imp.corrupt = 1.0;
        a.imp.seed = Some(7);
        let env = Config::from_args(&a).unwrap().unwrap().env();
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("ROCEMU_LOSS").as_deref(), Some("0.05"));
        assert_eq!(get("ROCEMU_REORDER").as_deref(), Some("0.1"));
        assert_eq!(get("ROCEMU_DUPLICATE"), None);
        assert_eq!(get("ROCEMU_CORRUPT").as_deref(), Some("1"));
        assert_eq!(get("ROCEMU_SEED").as_deref(), Some("7"));
        for bad in [1.5, -0.01, f64::NAN, f64::INFINITY] {
            a.imp.duplicate = bad;
            assert!(refused(&a).contains("--duplicate"), "{bad}");
        }
        let mut a = args(None, None, None);
        a.imp.loss = 0.05;
        assert!(refused(&a).contains("need --dev"));
        let mut a = args(None, None, None);
        a.imp.seed = Some(3);
        assert!(refused(&a).contains("need --dev"));
    }

    #[test]
    fn bad_inputs_are_refused_with_the_reason() {
        assert!(refused(&args(Some("eth:lo"), Some("10.0.0.1"), None)).contains("af_packet:IFACE"));
        assert!(
            refused(&args(Some("af_packet:"), Some("10.0.0.1"), None)).contains("not an interface")
        );
        assert!(refused(&args(
            Some("af_packet:nonexistent0"),
            Some("10.0.0.1"),
            None
        ))
        .contains("no interface"));
        assert!(refused(&args(Some("eth:lo"), Some("10.0.0.1"), None)).contains("af_xdp:IFACE"));
        assert!(
            refused(&args(Some("af_xdp:nonexistent0"), Some("10.0.0.1"), None))
                .contains("no interface nonexistent0")
        );
        assert!(
            refused(&args(Some("af_xdp:"), Some("10.0.0.1"), None)).contains("not an interface")
        );
        assert!(refused(&args(Some("dpdk: "), Some("10.0.0.1"), None)).contains("EAL"));
        assert!(refused(&args(Some("af_packet:lo"), None, None)).contains("needs --ip"));
        assert!(
            refused(&args(Some("af_packet:lo"), Some("10.0.0.300"), None)).contains("not an IPv4")
        );
        assert!(refused(&args(Some("af_packet:lo"), Some("224.0.0.1"), None)).contains("unicast"));
        assert!(
            refused(&args(Some("af_packet:lo"), Some("::1"), Some("02:00"))).contains("six hex")
        );
        assert!(refused(&args(
            Some("af_packet:lo"),
            Some("::1"),
            Some("01:00:5e:00:00:01")
        ))
        .contains("unicast"));
        assert!(refused(&args(None, Some("10.0.0.1"), None)).contains("need --dev"));
        let mut a = args(None, None, None);
        a.name = Some("a/b".into());
        assert!(refused(&a).contains("--name"));
    }

    #[test]
    fn without_dev_the_environment_configures() {
        assert_eq!(Config::from_args(&args(None, None, None)).unwrap(), None);
    }

    #[test]
    fn library_path_puts_ours_first() {
        let d = Path::new("/x/rocemu-lib");
        assert_eq!(library_path(d, None), "/x/rocemu-lib");
        assert_eq!(library_path(d, Some("".into())), "/x/rocemu-lib");
        assert_eq!(library_path(d, Some("/a:/b".into())), "/x/rocemu-lib:/a:/b");
    }

    #[test]
    fn links_are_made_and_repointed() {
        let base = std::env::temp_dir().join(format!("rocemu-exec-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(base.join("libibverbs.so"), b"").unwrap();
        let d = link_dir(&base.join("rocemu-lib"), &base, true).unwrap();
        assert_eq!(
            std::fs::read_link(d.join("libibverbs.so.1")).unwrap(),
            Path::new("../libibverbs.so")
        );
        assert!(
            d.join("libibverbs.so.1").exists(),
            "the relative link resolves"
        );
        assert_eq!(
            std::fs::read_link(d.join("librdmacm.so.1")).unwrap(),
            Path::new("../libibverbs.so"),
            "librdmacm.so.1 is the same library"
        );
        // A stale link is replaced.
        std::fs::remove_file(d.join("libibverbs.so.1")).unwrap();
        std::os::unix::fs::symlink("/nowhere", d.join("libibverbs.so.1")).unwrap();
        link_dir(&d, &base, true).unwrap();
        assert_eq!(
            std::fs::read_link(d.join("libibverbs.so.1")).unwrap(),
            Path::new("../libibverbs.so")
        );
        // A fallback folder others can write to is refused.
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(link_dir(&open, &base, false).is_err());
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o700)).unwrap();
        let d = link_dir(&open, &base, false).unwrap();
        assert_eq!(
            std::fs::read_link(d.join("libibverbs.so.1")).unwrap(),
            base.join("libibverbs.so")
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
