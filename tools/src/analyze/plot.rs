//! `--plot FILE.svg`: PSN over time per QP (Wireshark's TCP stream graph: PSNs relative to the
//! QP's first, retransmissions and NAKs marked) above goodput per QP over time. SVG only.
use super::{Event, Report};
use plotters::prelude::*;
use rocemu_wire::Psn;

/// QPs drawn at most (those with the most request packets).
pub const MAX_PLOTTED: usize = 12;

/// The SVG of the report's plots.
pub fn render_svg(r: &Report) -> Result<String, String> {
    let mut out = String::new();
    draw(r, &mut out).map_err(|e| format!("plot: {e}"))?;
    Ok(out)
}

fn draw(r: &Report, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let mut qps: Vec<&super::Qp> = r.qps.iter().filter(|q| q.request_packets > 0).collect();
    qps.sort_by_key(|q| std::cmp::Reverse(q.request_packets));
    qps.truncate(MAX_PLOTTED);
    let t_max = (r.span_ns as f64 / 1e9).max(1e-6);
    let rel = |q: &super::Qp, psn: u32| -> f64 {
        let first = q.first_psn.unwrap_or(Psn::new(0));
        f64::from(Psn::new(psn).diff(first))
    };
    let mut y_lo = 0f64;
    let mut y_hi = 1f64;
    let mut g_hi = 1f64;
    for q in &qps {
        for &(_, psn, _) in &q.psn_series.points {
            let y = rel(q, psn);
            y_lo = y_lo.min(y);
            y_hi = y_hi.max(y);
        }
        let w = q.goodput.width_ns as f64 / 1e9;
        for b in &q.goodput.bytes {
            g_hi = g_hi.max(*b as f64 * 8.0 / w / 1e6);
        }
    }
    let root = SVGBackend::with_string(out, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(560);
    let mut c = ChartBuilder::on(&top)
        .caption(
            "PSN over time (relative to each QP's first)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, y_lo..y_hi * 1.02)?;
    c.configure_mesh()
        .x_desc("time (s)")
        .y_desc("PSN − first PSN")
        .draw()?;
    for (k, q) in qps.iter().enumerate() {
        let col = Palette99::pick(k).to_rgba();
        let pts: Vec<(f64, f64)> = q
            .psn_series
            .points
            .iter()
            .map(|&(t, psn, _)| (t as f64 / 1e9, rel(q, psn)))
            .collect();
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 1, col.filled())))?
            .label(format!("QP 0x{:06x} {} → {}", q.key.2, q.key.0, q.key.1))
            .legend(move |(x, y)| Circle::new((x + 8, y), 4, col.filled()));
        let rtx = q
            .psn_series
            .points
            .iter()
            .filter(|p| p.2)
            .map(|&(t, psn, _)| Cross::new((t as f64 / 1e9, rel(q, psn)), 4, RED.stroke_width(1)));
        c.draw_series(rtx)?;
        let naks = q.events.iter().filter_map(|e| match *e {
            Event::Nak { t, psn, .. } | Event::Rnr { t, psn, .. } => Some(TriangleMarker::new(
                (t as f64 / 1e9, rel(q, psn.value())),
                5,
                BLACK.filled(),
            )),
            _ => None,
        });
        c.draw_series(naks)?;
    }
    // Legend entries for the marks.
    c.draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
        .label("retransmitted (×)")
        .legend(|(x, y)| Cross::new((x + 8, y), 4, RED.stroke_width(1)));
    c.draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
        .label("NAK / RNR NAK (▲)")
        .legend(|(x, y)| TriangleMarker::new((x + 8, y), 5, BLACK.filled()));
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;

    let mut g = ChartBuilder::on(&bottom)
        .caption("goodput per QP", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, 0f64..g_hi * 1.05)?;
    g.configure_mesh()
        .x_desc("time (s)")
        .y_desc("Mb/s")
        .draw()?;
    for (k, q) in qps.iter().enumerate() {
        let col = Palette99::pick(k).to_rgba();
        let w = q.goodput.width_ns as f64 / 1e9;
        let pts = q
            .goodput
            .bytes
            .iter()
            .enumerate()
            .map(|(i, b)| ((i as f64 + 0.5) * w, *b as f64 * 8.0 / w / 1e6));
        g.draw_series(LineSeries::new(pts, col.stroke_width(2)))?;
    }
    root.present()?;
    Ok(())
}
