//! `rocemu sim --plot FILE.svg`: per-flow rate, the bottleneck queue and the pause frames over
//! time, and (with finite flows) FCT slowdown by flow size. SVG only.
use super::report::Report;
use plotters::prelude::*;

/// Flows drawn at most in the rate panel.
pub const MAX_PLOTTED: usize = 16;

/// The SVG of a run's plots.
pub fn render_svg(r: &Report) -> Result<String, String> {
    let mut out = String::new();
    draw(r, &mut out).map_err(|e| format!("plot: {e}"))?;
    Ok(out)
}

fn draw(r: &Report, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let step = r.series_ns.max(1) as f64;
    let n = r.queue_series.len().max(2);
    let t_max = n as f64 * step / 1e6;
    let finite = r.flows.iter().any(|f| !f.long);
    let root =
        SVGBackend::with_string(out, (1200, if finite { 1200 } else { 900 })).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((if finite { 4 } else { 3 }, 1));

    // Per-flow rate: the bytes each sample period added.
    let rates: Vec<Vec<(f64, f64)>> = r
        .flow_series
        .iter()
        .take(MAX_PLOTTED)
        .map(|s| {
            s.windows(2)
                .enumerate()
                .map(|(i, w)| {
                    (
                        (i + 1) as f64 * step / 1e6,
                        (w[1] - w[0]) as f64 * 8.0 / step,
                    )
                })
                .collect()
        })
        .collect();
    let r_hi = rates.iter().flatten().map(|p| p.1).fold(1.0f64, f64::max);
    let mut c = ChartBuilder::on(&areas[0])
        .caption(
            format!("per-flow rate ({} · cc {})", r.scenario, r.cc),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max, 0f64..r_hi * 1.05)?;
    c.configure_mesh()
        .x_desc("time (ms)")
        .y_desc("Gb/s")
        .draw()?;
    for (k, pts) in rates.iter().enumerate() {
        let col = Palette99::pick(k).to_rgba();
        c.draw_series(LineSeries::new(pts.iter().copied(), col.stroke_width(2)))?
            .label(format!("flow {k}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], col));
    }
    if !rates.is_empty() {
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }

    let q_hi = r.queue_series.iter().copied().max().unwrap_or(1).max(1) as f64 / 1e3;
    let mut q = ChartBuilder::on(&areas[1])
        .caption("bottleneck queue", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max, 0f64..q_hi * 1.05)?;
    q.configure_mesh().x_desc("time (ms)").y_desc("KB").draw()?;
    q.draw_series(LineSeries::new(
        r.queue_series
            .iter()
            .enumerate()
            .map(|(i, &b)| (i as f64 * step / 1e6, b as f64 / 1e3)),
        BLUE.stroke_width(2),
    ))?;

    let p_hi = r.pause_series.last().copied().unwrap_or(0).max(1) as f64;
    let mut p = ChartBuilder::on(&areas[2])
        .caption("PFC pause frames sent (cumulative)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max, 0f64..p_hi * 1.05)?;
    p.configure_mesh()
        .x_desc("time (ms)")
        .y_desc("frames")
        .draw()?;
    p.draw_series(LineSeries::new(
        r.pause_series
            .iter()
            .enumerate()
            .map(|(i, &b)| (i as f64 * step / 1e6, b as f64)),
        RED.stroke_width(2),
    ))?;

    if finite {
        let pts: Vec<(f64, f64)> = r
            .flows
            .iter()
            .filter_map(|f| f.slowdown.map(|s| ((f.bytes.max(1) as f64).log10(), s)))
            .collect();
        let s_hi = pts.iter().map(|p| p.1).fold(2.0f64, f64::max);
        let x_hi = pts.iter().map(|p| p.0).fold(1.0f64, f64::max);
        let mut f = ChartBuilder::on(&areas[3])
            .caption("FCT slowdown by flow size", ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_hi + 0.2, 1f64..s_hi * 1.05)?;
        f.configure_mesh()
            .x_desc("log10(flow size, bytes)")
            .y_desc("slowdown")
            .draw()?;
        f.draw_series(pts.iter().map(|&p| Circle::new(p, 2, BLACK.filled())))?;
    }
    root.present()?;
    Ok(())
}
