//! `rocemu demo` (contract: shared/contracts.md).
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write every frame the two RNICs exchanged to this pcap.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Seed for keys, QPNs, PSNs and the lossy wire (the run is deterministic for a seed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let rows = rocemu_tools::demo::run(a.seed, a.pcap.as_deref())?;
    print!("{}", rocemu_tools::demo::table(&rows));
    let failed = rows.iter().filter(|r| !r.ok).count();
    if let Some(p) = &a.pcap {
        println!("frames written to {}", p.display());
    }
    if failed == 0 {
        println!(
            "demo: all {} operations verified (seed {})",
            rows.len(),
            a.seed
        );
        Ok(ExitCode::SUCCESS)
    } else {
        // What the RNICs counted when each failed row ended (stderr: stdout is the table).
        for r in rows.iter().filter(|r| !r.ok && !r.counters.is_empty()) {
            eprint!("{}:\n{}", r.operation, r.counters);
        }
        println!(
            "demo: {failed} of {} operations FAILED (seed {})",
            rows.len(),
            a.seed
        );
        Ok(ExitCode::FAILURE)
    }
}
