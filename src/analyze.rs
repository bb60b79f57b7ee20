//! `rocemu analyze [--json] [--plot FILE.svg] CAPTURE` (contract: shared/contracts.md). The
//! analysis is `rocemu_tools::analyze`; this prints it.
use rocemu_tools::analyze;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON object instead of the text summary.
    #[arg(long)]
    json: bool,
    /// Also draw PSN over time and goodput per QP into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// The capture: pcap (micro- or nanosecond, either byte order) or pcapng.
    capture: PathBuf,
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let r = analyze::analyze_path(&a.capture)?;
    if let Some(p) = &a.plot {
        let svg = analyze::render_svg(&r)?;
        std::fs::write(p, svg).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let text = if a.json {
        let mut s = serde_json::to_string(&r.to_json())?;
        s.push('\n');
        s
    } else {
        r.to_text()
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    // As `decode`: a capture cut mid-record is an error, after everything before it was shown.
    if let Some(why) = &r.truncated {
        return Err(format!("{}: {why}", a.capture.display()).into());
    }
    Ok(ExitCode::SUCCESS)
}
