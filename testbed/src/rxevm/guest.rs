//! The guest image: Debian 12's kernel and an initramfs of busybox, rdma-core, perftest and our
//! `imm_pingpong` and `ibv_agent` (the recipe and C sources are `testbed/rxevm/`).
//!
//! Invariants: the recipe is compiled into the binary and written into the work folder before it
//! runs, so nothing outside the work folder is needed at run time; a guest is built once per
//! recipe (the script keys its cache on the recipe) and [`build_guest`] returns at once when the
//! cached one serves.
use super::{tail, write_atomic};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The guest recipe, compiled in: `build_guest` writes it into the work folder and runs it.
const BUILD_SCRIPT: &str = include_str!("../../rxevm/build-guest.sh");
const INIT: &str = include_str!("../../rxevm/init");
/// Our tool for immediate data in the guest (no packaged one sends it); the script compiles it.
const IMM_PINGPONG: &str = include_str!("../../rxevm/imm_pingpong.c");
/// The conformance suite's agent over libibverbs (`docs/agent-protocol.md`); the script compiles it.
const IBV_AGENT: &str = include_str!("../../rxevm/ibv_agent.c");

/// A built guest: Debian's kernel and the initramfs.
#[derive(Debug, Clone)]
pub struct Guest {
    pub dir: PathBuf,
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
    /// `uname -r` in the guest (`6.1.0-57-amd64`).
    pub kernel: String,
}

/// Builds the guest into `workdir` unless this recipe's guest is there already (then it
/// returns at once). Downloads Debian 12 packages with `apt-get download`; needs root the first
/// time (it may install missing host tools and chroots to check libraries).
pub fn build_guest(workdir: &Path) -> Result<Guest, String> {
    let recipe = workdir.join("recipe");
    std::fs::create_dir_all(&recipe).map_err(|e| format!("{}: {e}", recipe.display()))?;
    write_atomic(&recipe.join("build-guest.sh"), BUILD_SCRIPT.as_bytes())?;
    write_atomic(&recipe.join("init"), INIT.as_bytes())?;
    write_atomic(&recipe.join("imm_pingpong.c"), IMM_PINGPONG.as_bytes())?;
    write_atomic(&recipe.join("ibv_agent.c"), IBV_AGENT.as_bytes())?;
    let t = Instant::now();
    let out = Command::new("bash")
        .arg(recipe.join("build-guest.sh"))
        .arg(workdir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("bash build-guest.sh: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "building the rxe guest failed ({}):\n{}{}",
            out.status,
            tail(&stdout, 20),
            tail(&stderr, 30)
        ));
    }
    let dir = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("GUEST="))
        .next_back()
        .ok_or_else(|| {
            format!("build-guest.sh said nothing about its output:\n{stdout}{stderr}")
        })?;
    let dir = PathBuf::from(dir);
    // Say so when it really built (it is silent when the cached guest served).
    for l in stderr
        .lines()
        .filter(|l| l.starts_with("build-guest: kernel"))
    {
        eprintln!("rxevm: {l} ({:.1} s)", t.elapsed().as_secs_f64());
    }
    let kernel = std::fs::read_to_string(dir.join("kernel-version"))
        .map_err(|e| format!("{}/kernel-version: {e}", dir.display()))?
        .trim()
        .to_string();
    Ok(Guest {
        vmlinuz: dir.join("vmlinuz"),
        initrd: dir.join("initrd.img"),
        dir,
        kernel,
    })
}
