//! PNG figures with plotters (bitmap backend; text via the embedded DejaVu Sans, so no system
//! fonts are needed).

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;
use serde::{Deserialize, Serialize};

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../../assets/DejaVuSans.ttf");
        // The embedded font is valid; if registration failed, plots would still be drawn
        // without text rather than abort the experiment.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, bytes);
    });
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// A tick label without spurious decimals: the fewest decimals (up to 4) that give `v` back
/// ("1975", "0.25", "-91"), scientific notation outside `[1e-3, 1e5)`.
pub(crate) fn tick_label(v: &f64) -> String {
    let v = *v;
    let a = v.abs();
    if a < 1e-12 {
        return "0".into();
    }
    if !(1e-3..1e5).contains(&a) {
        let s = format!("{v:.2e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e{exponent}");
    }
    (0..=4)
        .map(|d| format!("{v:.d$}"))
        .find(|s| s.parse::<f64>().is_ok_and(|back| (back - v).abs() <= 1e-9 * a.max(1.0)))
        .unwrap_or_else(|| format!("{v:.4}"))
}

/// The label of the decade `10^k` on a log axis: `tick_label`'s plain digits inside
/// `[1e-3, 1e5)`, `1e{k}` outside (never "0": `tick_label` rounds magnitudes below 1e-12 to 0).
pub(crate) fn decade_label(k: i32) -> String {
    if (-3..5).contains(&k) {
        tick_label(&10f64.powi(k))
    } else {
        format!("1e{k}")
    }
}

/// A corner of a chart's plotting area (where a legend goes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Corner {
    UpperLeft,
    UpperRight,
    LowerLeft,
    LowerRight,
}

impl Corner {
    fn position(self) -> SeriesLabelPosition {
        match self {
            Corner::UpperLeft => SeriesLabelPosition::UpperLeft,
            Corner::UpperRight => SeriesLabelPosition::UpperRight,
            Corner::LowerLeft => SeriesLabelPosition::LowerLeft,
            Corner::LowerRight => SeriesLabelPosition::LowerRight,
        }
    }
}

/// How many `ink` points (data coordinates) a legend box — `frac` (width, height) of the
/// plotting area `x` × `y` — in `corner` covers.
fn covered(ink: &[(f64, f64)], corner: Corner, x: (f64, f64), y: (f64, f64), frac: (f64, f64)) -> usize {
    let (w, h) = ((x.1 - x.0) * frac.0, (y.1 - y.0) * frac.1);
    let (cx, cy) = match corner {
        Corner::UpperLeft => (x.0, y.1 - h),
        Corner::UpperRight => (x.1 - w, y.1 - h),
        Corner::LowerLeft => (x.0, y.0),
        Corner::LowerRight => (x.1 - w, y.0),
    };
    ink.iter().filter(|&&(px, py)| px >= cx && px <= cx + w && py >= cy && py <= cy + h).count()
}

/// The corner whose legend box covers the fewest `ink` points ([`covered`]), with that count;
/// ties go to the first of upper left, upper right, lower left, lower right.
fn quietest(ink: &[(f64, f64)], x: (f64, f64), y: (f64, f64), frac: (f64, f64)) -> (Corner, usize) {
    [Corner::UpperLeft, Corner::UpperRight, Corner::LowerLeft, Corner::LowerRight]
        .into_iter()
        .map(|c| (c, covered(ink, c, x, y, frac)))
        .min_by_key(|&(_, n)| n)
        .unwrap_or((Corner::UpperLeft, 0))
}

/// Where a panel's legend goes and the top of its y range: the emptiest corner if one is
/// empty, else the upper right above a y range grown by the legend's height, so that the legend
/// covers no `ink` either way.
fn legend_placement(ink: &[(f64, f64)], x: (f64, f64), y: (f64, f64), frac: (f64, f64)) -> (Corner, f64) {
    match quietest(ink, x, y, frac) {
        (best, 0) => (best, y.1),
        // 2 % more than the box, so that the box's edge clears the highest line.
        _ => (Corner::UpperRight, y.0 + (y.1 - y.0) / (0.98 - frac.1)),
    }
}

/// Points along a polyline, `per_segment` per segment, so a line crossing a box counts as ink
/// even where its vertices lie outside it.
fn along(points: impl IntoIterator<Item = (f64, f64)>, per_segment: usize) -> Vec<(f64, f64)> {
    let pts: Vec<(f64, f64)> = points.into_iter().collect();
    let mut out: Vec<(f64, f64)> = pts
        .windows(2)
        .flat_map(|w| {
            let ((x0, y0), (x1, y1)) = (w[0], w[1]);
            (0..per_segment).map(move |k| {
                let t = k as f64 / per_segment as f64;
                (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t)
            })
        })
        .collect();
    out.extend(pts.last());
    out
}

/// How a legend entry is drawn.
#[derive(Debug, Clone, Copy)]
enum Swatch {
    /// A filled box (a band).
    Band(RGBAColor),
    /// A line of this width.
    Line(RGBAColor, u32),
    /// A dot (data points).
    Dot(RGBAColor),
    /// A short vertical tick (context points on the x axis).
    Tick(RGBAColor),
}

/// Pixel width of a legend entry: the swatch, the label as the embedded font sets it at 12 px
/// (≈ 7 px a character if the font cannot measure it), the gap.
fn legend_entry_width(label: &str) -> i32 {
    register_font();
    let text = ("sans-serif", 12)
        .into_font()
        .box_size(label)
        .map_or(7 * label.chars().count() as i32, |(w, _)| w as i32);
    22 + text + 18
}

/// Rows of a left-to-right legend of `entries` within `width` px: each entry's `(x, row)`.
fn legend_layout(entries: &[(String, Swatch)], width: i32) -> Vec<(i32, i32)> {
    let (mut x, mut row, mut out) = (12, 0, Vec::with_capacity(entries.len()));
    for (label, _) in entries {
        let w = legend_entry_width(label);
        if x > 12 && x + w > width {
            x = 12;
            row += 1;
        }
        out.push((x, row));
        x += w;
    }
    out
}

/// Height (px) of the legend strip that [`draw_legend_strip`] needs for `entries` in `width` px.
fn legend_strip_height(entries: &[(String, Swatch)], width: u32) -> u32 {
    let rows = legend_layout(entries, width as i32).last().map_or(0, |&(_, r)| r + 1) as u32;
    if rows == 0 {
        0
    } else {
        8 + 22 * rows
    }
}

/// One legend for a whole figure, in a strip above its panels, so that no legend covers a
/// panel's data.
fn draw_legend_strip<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(String, Swatch)],
) -> Result<()> {
    let width = area.dim_in_pixel().0 as i32;
    let style = TextStyle::from(("sans-serif", 12).into_font()).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Left,
        plotters::style::text_anchor::VPos::Center,
    ));
    for ((label, swatch), (x, row)) in entries.iter().zip(legend_layout(entries, width)) {
        let y = 15 + 22 * row;
        match *swatch {
            Swatch::Band(c) => area.draw(&Rectangle::new([(x, y - 5), (x + 16, y + 5)], c.filled())),
            Swatch::Line(c, w) => area.draw(&PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(w))),
            Swatch::Dot(c) => area.draw(&Circle::new((x + 8, y), 3, c.filled())),
            Swatch::Tick(c) => {
                area.draw(&PathElement::new(vec![(x + 8, y - 6), (x + 8, y + 6)], c.stroke_width(2)))
            }
        }
        .map_err(err)?;
        area.draw(&Text::new(label.clone(), (x + 22, y), style.clone())).map_err(err)?;
    }
    Ok(())
}

/// One 1-d regression panel: data, a predictive (mean, ±2σ band), function samples. It
/// serialises, so an experiment can store its panels in `metrics.json` and `cargo xtask redraw`
/// draws them again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Panel1d {
    /// Panel title.
    pub title: String,
    /// Training inputs and targets.
    pub data: Vec<(f64, f64)>,
    /// Evaluation grid.
    pub x: Vec<f64>,
    /// Predictive mean on the grid.
    pub mean: Vec<f64>,
    /// Predictive standard deviation of f on the grid.
    pub std: Vec<f64>,
    /// Function samples on the grid.
    pub samples: Vec<Vec<f64>>,
    /// What the thin lines of `samples` are, for the legend ("samples"; the VaLLA toy draws the
    /// exact LLA's ±2σ there).
    pub sample_label: String,
    /// Context points to mark on the x axis (may be empty).
    pub context: Vec<f64>,
    /// What the ticks of `context` are, for the legend ("context points"; VaLLA's are its
    /// inducing inputs Z).
    pub context_label: String,
}

/// The labels in order of first appearance, each once.
fn distinct<'a>(labels: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = Vec::new();
    for l in labels {
        if !seen.contains(&l) {
            seen.push(l);
        }
    }
    seen
}

/// Draws panels in a grid of `cols` columns to `path` (each panel 480×320 px), with the axis
/// titles `axes` (x, y) and one legend above the panels (±2σ band of f, samples, mean, data,
/// context points: those the panels draw).
pub fn regression_panels(
    path: &Path,
    panels: &[Panel1d],
    cols: usize,
    y_range: (f64, f64),
    axes: (&str, &str),
) -> Result<()> {
    register_font();
    let grey = RGBColor(120, 120, 120);
    let mut entries = vec![("±2σ of f".to_string(), Swatch::Band(GREEN.mix(0.2)))];
    let samples = distinct(panels.iter().filter(|p| !p.samples.is_empty()).map(|p| p.sample_label.as_str()));
    entries.extend(samples.iter().map(|l| (l.to_string(), Swatch::Line(GREEN.mix(0.6), 1))));
    entries.push(("mean".into(), Swatch::Line(RED.to_rgba(), 2)));
    if panels.iter().any(|p| !p.data.is_empty()) {
        entries.push(("data".into(), Swatch::Dot(grey.to_rgba())));
    }
    let contexts =
        distinct(panels.iter().filter(|p| !p.context.is_empty()).map(|p| p.context_label.as_str()));
    entries.extend(contexts.iter().map(|l| (l.to_string(), Swatch::Tick(BLACK.mix(0.5)))));
    let rows = panels.len().div_ceil(cols);
    let width = 480 * cols as u32;
    let strip = legend_strip_height(&entries, width);
    let root = BitMapBackend::new(path, (width, strip + 320 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (legend, grid) = root.split_vertically(strip);
    draw_legend_strip(&legend, &entries)?;
    for (area, p) in grid.split_evenly((rows, cols)).iter().zip(panels) {
        let (x0, x1) = (p.x[0], p.x[p.x.len() - 1]);
        let mut chart = ChartBuilder::on(area)
            .caption(&p.title, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(40)
            .y_label_area_size(52)
            .build_cartesian_2d(x0..x1, y_range.0..y_range.1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(axes.0)
            .y_desc(axes.1)
            .x_labels(7)
            .x_label_formatter(&tick_label)
            .y_label_formatter(&tick_label)
            .label_style(("sans-serif", 12))
            .axis_desc_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        let band: Vec<(f64, f64)> =
            p.x.iter()
                .zip(p.mean.iter().zip(&p.std))
                .map(|(&x, (&m, &s))| (x, m + 2.0 * s))
                .chain(
                    p.x.iter()
                        .rev()
                        .zip(p.mean.iter().rev().zip(p.std.iter().rev()))
                        .map(|(&x, (&m, &s))| (x, m - 2.0 * s)),
                )
                .collect();
        chart.draw_series(std::iter::once(Polygon::new(band, GREEN.mix(0.2)))).map_err(err)?;
        for s in &p.samples {
            chart
                .draw_series(LineSeries::new(p.x.iter().cloned().zip(s.iter().cloned()), GREEN.mix(0.6)))
                .map_err(err)?;
        }
        chart
            .draw_series(LineSeries::new(
                p.x.iter().cloned().zip(p.mean.iter().cloned()),
                RED.stroke_width(2),
            ))
            .map_err(err)?;
        chart.draw_series(p.data.iter().map(|&(x, y)| Circle::new((x, y), 2, grey.filled()))).map_err(err)?;
        let tick = (y_range.1 - y_range.0) * 0.02;
        chart
            .draw_series(
                p.context
                    .iter()
                    .map(|&c| PathElement::new(vec![(c, y_range.0), (c, y_range.0 + tick)], BLACK.mix(0.5))),
            )
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The axes of a map panel (heat map, quiver): no grid, ticks by [`tick_label`], and the axis
/// titles `axes` (empty: none).
fn map_axes(
    chart: &mut ChartContext<'_, BitMapBackend<'_>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    axes: &(String, String),
) -> Result<()> {
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(axes.0.as_str())
        .y_desc(axes.1.as_str())
        .x_label_formatter(&tick_label)
        .y_label_formatter(&tick_label)
        .label_style(("sans-serif", 11))
        .axis_desc_style(("sans-serif", 12))
        .draw()
        .map_err(err)
}

/// One 2-d heat map on a regular grid (`values[i][j]` at `(xs[j], ys[i])`) with labelled points.
pub struct Heatmap {
    /// Panel title.
    pub title: String,
    /// Grid abscissae.
    pub xs: Vec<f64>,
    /// Grid ordinates.
    pub ys: Vec<f64>,
    /// Values, row `i` at ordinate `ys[i]`.
    pub values: Vec<Vec<f64>>,
    /// Colour scale limits.
    pub range: (f64, f64),
    /// Points `(x, y, class)` overlaid (class 0 red, 1 blue).
    pub points: Vec<(f64, f64, usize)>,
    /// Axis titles `(x, y)` with units (empty: none).
    pub axes: (String, String),
}

fn viridis(t: f64) -> RGBColor {
    // A 5-stop approximation of viridis, linear in between.
    const STOPS: [(f64, f64, f64); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (253.0, 231.0, 37.0),
    ];
    let t = t.clamp(0.0, 1.0) * 4.0;
    let i = (t.floor() as usize).min(3);
    let f = t - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |u: f64, v: f64| (u + (v - u) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Draws heat maps in a grid of `cols` columns (each 420×400 px, colour bar on the right).
pub fn heatmaps(path: &Path, maps: &[Heatmap], cols: usize) -> Result<()> {
    register_font();
    let rows = maps.len().div_ceil(cols);
    let root = BitMapBackend::new(path, (420 * cols as u32, 400 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    for (panel, m) in root.split_evenly((rows, cols)).iter().zip(maps) {
        // A colour bar in the right-hand 56 px, labelled with the scale's limits.
        let (w, h) = panel.dim_in_pixel();
        let (area, bar) = panel.split_horizontally(w.saturating_sub(56));
        let steps = 64;
        let (top, bottom) = (30i32, h as i32 - 30);
        for k in 0..steps {
            let y_hi = bottom - (bottom - top) * (k + 1) / steps;
            let y_lo = bottom - (bottom - top) * k / steps;
            bar.draw(&Rectangle::new(
                [(6, y_hi), (20, y_lo)],
                viridis((k as f64 + 0.5) / steps as f64).filled(),
            ))
            .map_err(err)?;
        }
        let label = |v: f64| {
            if v.abs() >= 1e3 || (v != 0.0 && v.abs() < 1e-2) {
                format!("{v:.1e}")
            } else {
                format!("{v:.2}")
            }
        };
        bar.draw(&Text::new(label(m.range.1), (22, top - 6), ("sans-serif", 11))).map_err(err)?;
        bar.draw(&Text::new(label(m.range.0), (22, bottom - 6), ("sans-serif", 11))).map_err(err)?;
        let (nx, ny) = (m.xs.len(), m.ys.len());
        let dx = (m.xs[nx - 1] - m.xs[0]) / (nx - 1) as f64;
        let dy = (m.ys[ny - 1] - m.ys[0]) / (ny - 1) as f64;
        let mut chart = ChartBuilder::on(&area)
            .caption(format!("{} [{:.2}, {:.2}]", m.title, m.range.0, m.range.1), ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(if m.axes.0.is_empty() { 24 } else { 40 })
            .y_label_area_size(if m.axes.1.is_empty() { 30 } else { 48 })
            .build_cartesian_2d(
                m.xs[0] - dx / 2.0..m.xs[nx - 1] + dx / 2.0,
                m.ys[0] - dy / 2.0..m.ys[ny - 1] + dy / 2.0,
            )
            .map_err(err)?;
        map_axes(&mut chart, &m.axes)?;
        let span = (m.range.1 - m.range.0).max(f64::MIN_POSITIVE);
        chart
            .draw_series((0..ny).flat_map(|i| {
                (0..nx).map(move |j| {
                    let (x, y) = (m.xs[j], m.ys[i]);
                    let c = viridis((m.values[i][j] - m.range.0) / span);
                    Rectangle::new([(x - dx / 2.0, y - dy / 2.0), (x + dx / 2.0, y + dy / 2.0)], c.filled())
                })
            }))
            .map_err(err)?;
        chart
            .draw_series(m.points.iter().map(|&(x, y, c)| {
                let col = if c == 0 { RGBColor(220, 40, 40) } else { RGBColor(40, 90, 230) };
                Circle::new((x, y), 2, col.filled())
            }))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// One line chart panel: named series of `(x, y)` points, optionally on a log-scaled x axis.
pub struct LinePanel {
    /// Panel title.
    pub title: String,
    /// Axis labels `(x, y)`.
    pub labels: (String, String),
    /// `(name, points)` per series.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    /// Plot `log10 x` (ticks show log10 values).
    pub log_x: bool,
}

const LINE_COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Draws line-chart panels side by side in `cols` columns (each 520×360 px). When every panel
/// draws the same series, one legend above the panels names them; otherwise each panel has its
/// own, in the corner with the fewest lines under it, and the panel's y range grows upwards
/// until that corner is empty — no legend covers a line.
pub fn line_panels(path: &Path, panels: &[LinePanel], cols: usize) -> Result<()> {
    register_font();
    let names = |p: &LinePanel| p.series.iter().map(|s| s.0.clone()).collect::<Vec<_>>();
    let shared = panels.windows(2).all(|w| names(&w[0]) == names(&w[1]));
    let entries: Vec<(String, Swatch)> = match (shared, panels.first()) {
        (true, Some(first)) => names(first)
            .into_iter()
            .enumerate()
            .map(|(i, n)| (n, Swatch::Line(LINE_COLOURS[i % LINE_COLOURS.len()].to_rgba(), 2)))
            .collect(),
        _ => Vec::new(),
    };
    let rows = panels.len().div_ceil(cols);
    let width = 520 * cols as u32;
    let strip = legend_strip_height(&entries, width);
    let root = BitMapBackend::new(path, (width, strip + 360 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (legend, grid) = root.split_vertically(strip);
    draw_legend_strip(&legend, &entries)?;
    for (area, p) in grid.split_evenly((rows, cols)).iter().zip(panels) {
        let tx = |x: f64| if p.log_x { x.log10() } else { x };
        let pts = p.series.iter().flat_map(|s| s.1.iter());
        let (mut x0, mut x1, mut y0, mut y1) =
            (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
        for &(x, y) in pts {
            x0 = x0.min(tx(x));
            x1 = x1.max(tx(x));
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        let pad = ((y1 - y0) * 0.08).max(1e-6);
        let (lo, mut hi) = (y0 - pad, y1 + pad);
        let mut corner = None;
        if !shared {
            // The legend box: ≈ 7 px per character of the longest name plus the swatch, 17 px
            // per entry, against the ≈ 450 × 250 px plotting area.
            let longest = p.series.iter().map(|s| s.0.chars().count()).max().unwrap_or(0);
            let frac = (
                ((longest * 7 + 44) as f64 / 450.0).min(0.6),
                ((p.series.len() * 17 + 12) as f64 / 250.0).min(0.8),
            );
            let ink: Vec<(f64, f64)> =
                p.series.iter().flat_map(|s| along(s.1.iter().map(|&(x, y)| (tx(x), y)), 8)).collect();
            let (c, top) = legend_placement(&ink, (x0, x1), (lo, hi), frac);
            corner = Some(c);
            hi = top;
        }
        let mut chart = ChartBuilder::on(area)
            .caption(&p.title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .build_cartesian_2d(x0..x1, lo..hi)
            .map_err(err)?;
        // On a log axis the ticks sit at log10 x: label the decades with x itself.
        let x_tick = |v: &f64| {
            if !p.log_x {
                tick_label(v)
            } else if (v - v.round()).abs() < 1e-6 {
                decade_label(v.round() as i32)
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc(p.labels.0.as_str())
            .y_desc(p.labels.1.as_str())
            .x_label_formatter(&x_tick)
            .y_label_formatter(&tick_label)
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(err)?;
        for (i, (name, pts)) in p.series.iter().enumerate() {
            let c = LINE_COLOURS[i % LINE_COLOURS.len()];
            chart
                .draw_series(LineSeries::new(pts.iter().map(|&(x, y)| (tx(x), y)), c.stroke_width(2)))
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
            chart
                .draw_series(pts.iter().map(|&(x, y)| Circle::new((tx(x), y), 3, c.filled())))
                .map_err(err)?;
        }
        if let Some(corner) = corner {
            chart
                .configure_series_labels()
                .position(corner.position())
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK.mix(0.3))
                .label_font(("sans-serif", 12))
                .draw()
                .map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Horizontal box plots of positive values on a log10 axis (one row per `(name, values)`;
/// the whiskers span min–max, the box the quartiles, the bar the median), as the fit-time
/// panels of the VaLLA paper's Figs. 3 and 4.
pub fn log_box_plot(path: &Path, title: &str, x_label: &str, groups: &[(String, Vec<f64>)]) -> Result<()> {
    register_font();
    let quartiles = |v: &[f64]| -> [f64; 5] {
        let mut s: Vec<f64> = v.iter().map(|x| x.max(1e-12).log10()).collect();
        s.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let t = p * (s.len() - 1) as f64;
            let (i, f) = (t.floor() as usize, t.fract());
            s[i] + f * (s[(i + 1).min(s.len() - 1)] - s[i])
        };
        [s[0], q(0.25), q(0.5), q(0.75), s[s.len() - 1]]
    };
    let stats: Vec<(String, [f64; 5])> =
        groups.iter().filter(|g| !g.1.is_empty()).map(|(n, v)| (n.clone(), quartiles(v))).collect();
    if stats.is_empty() {
        return Err(anyhow!("box plot {title:?}: no values"));
    }
    let lo = stats.iter().map(|s| s.1[0]).fold(f64::INFINITY, f64::min).floor();
    let hi = stats.iter().map(|s| s.1[4]).fold(f64::NEG_INFINITY, f64::max).ceil().max(lo + 1.0);
    let height = 80 + 40 * stats.len() as u32;
    let root = BitMapBackend::new(path, (640, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let rows = stats.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(110)
        .build_cartesian_2d(lo..hi, -0.5..rows - 0.5)
        .map_err(err)?;
    let names: Vec<String> = stats.iter().map(|s| s.0.clone()).collect();
    chart
        .configure_mesh()
        .x_desc(x_label)
        .x_labels((hi - lo) as usize + 1)
        .x_label_formatter(&|v| {
            if (v - v.round()).abs() < 1e-6 {
                format!("1e{}", v.round() as i64)
            } else {
                String::new()
            }
        })
        .y_labels(stats.len())
        .y_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].clone()
            } else {
                String::new()
            }
        })
        .label_style(("sans-serif", 12))
        .draw()
        .map_err(err)?;
    for (i, (_, q)) in stats.iter().enumerate() {
        let (y, c) = (i as f64, LINE_COLOURS[i % LINE_COLOURS.len()]);
        let h = 0.3;
        chart
            .draw_series([
                Rectangle::new([(q[1], y - h), (q[3], y + h)], c.mix(0.35).filled()),
                Rectangle::new([(q[1], y - h), (q[3], y + h)], c.stroke_width(2)),
            ])
            .map_err(err)?;
        chart
            .draw_series([
                PathElement::new(vec![(q[0], y), (q[1], y)], c.stroke_width(2)),
                PathElement::new(vec![(q[3], y), (q[4], y)], c.stroke_width(2)),
                PathElement::new(vec![(q[2], y - h), (q[2], y + h)], BLACK.stroke_width(2)),
                PathElement::new(vec![(q[0], y - h / 2.0), (q[0], y + h / 2.0)], c.stroke_width(2)),
                PathElement::new(vec![(q[4], y - h / 2.0), (q[4], y + h / 2.0)], c.stroke_width(2)),
            ])
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// An arrow `(x, y, u, v)`: position and velocity.
pub type Arrow = (f64, f64, f64, f64);

/// One quiver panel: arrows `(x, y, u, v)` in named colour groups, drawn `scale` × `(u, v)`
/// long in data units, with a reference arrow of length `reference` (velocity units).
pub struct QuiverPanel {
    /// Panel title.
    pub title: String,
    /// Groups of arrows with their colour.
    pub groups: Vec<(RGBColor, Vec<Arrow>)>,
    /// Plot box `((x0, x1), (y0, y1))`.
    pub bounds: ((f64, f64), (f64, f64)),
    /// Data units per velocity unit.
    pub scale: f64,
    /// Length of the key arrow (velocity units) and its label.
    pub reference: (f64, String),
    /// Axis titles `(x, y)` with units (empty: none).
    pub axes: (String, String),
}

/// Draws quiver panels in a grid of `cols` columns (each 560×360 px).
pub fn quiver_panels(path: &Path, panels: &[QuiverPanel], cols: usize) -> Result<()> {
    register_font();
    let rows = panels.len().div_ceil(cols);
    let root = BitMapBackend::new(path, (560 * cols as u32, 360 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    for (area, p) in root.split_evenly((rows, cols)).iter().zip(panels) {
        let ((x0, x1), (y0, y1)) = p.bounds;
        let mut chart = ChartBuilder::on(area)
            .caption(&p.title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(if p.axes.0.is_empty() { 24 } else { 40 })
            .y_label_area_size(if p.axes.1.is_empty() { 34 } else { 50 })
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(err)?;
        map_axes(&mut chart, &p.axes)?;
        let arrow = |x: f64, y: f64, u: f64, v: f64, c: RGBColor| {
            let (ex, ey) = (x + p.scale * u, y + p.scale * v);
            let len = (u * u + v * v).sqrt() * p.scale;
            let (dx, dy) = if len > 0.0 { ((ex - x) / len, (ey - y) / len) } else { (0.0, 0.0) };
            let h = 0.3 * len;
            let (lx, ly) = (ex - h * (dx * 0.87 - dy * 0.5), ey - h * (dy * 0.87 + dx * 0.5));
            let (rx, ry) = (ex - h * (dx * 0.87 + dy * 0.5), ey - h * (dy * 0.87 - dx * 0.5));
            PathElement::new(vec![(x, y), (ex, ey), (lx, ly), (ex, ey), (rx, ry)], c.stroke_width(1))
        };
        for (c, arrows) in &p.groups {
            chart.draw_series(arrows.iter().map(|&(x, y, u, v)| arrow(x, y, u, v, *c))).map_err(err)?;
        }
        let (kx, ky) = (x0 + 0.05 * (x1 - x0), y1 - 0.07 * (y1 - y0));
        chart.draw_series(std::iter::once(arrow(kx, ky, p.reference.0, 0.0, BLACK))).map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                p.reference.1.clone(),
                (kx + p.scale * p.reference.0 + 0.01 * (x1 - x0), ky),
                ("sans-serif", 12),
            )))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legend_goes_to_the_emptiest_corner() {
        let (x, y) = ((0.0, 10.0), (0.0, 10.0));
        // Nothing drawn: the first corner.
        assert_eq!(quietest(&[], x, y, (0.3, 0.3)).0, Corner::UpperLeft);
        // A rising line from lower left to upper right leaves the other two corners empty.
        let rising = along([(0.0, 0.0), (10.0, 10.0)], 100);
        assert_eq!(quietest(&rising, x, y, (0.3, 0.3)).0, Corner::UpperLeft);
        // Flat ends at the top (best-reward curves) and data in the upper left: lower right.
        let mut ink = along([(0.0, 0.0), (2.0, 9.0), (10.0, 9.5)], 50);
        ink.extend([(1.0, 8.0), (2.0, 8.5), (0.5, 9.5)]);
        assert_eq!(quietest(&ink, x, y, (0.3, 0.3)).0, Corner::LowerRight);
        // A segment crossing the box counts even though both of its vertices lie outside it.
        let mut ink = vec![(1.0, 9.0), (2.0, 9.0), (1.0, 1.0), (2.0, 1.0), (9.0, 1.0), (9.0, 2.0)];
        assert_eq!(
            quietest(&[ink.clone(), vec![(5.0, 10.0), (10.0, 5.0)]].concat(), x, y, (0.3, 0.3)).0,
            Corner::UpperRight
        );
        ink.extend(along([(5.0, 10.0), (10.0, 5.0)], 10));
        assert_eq!(quietest(&ink, x, y, (0.3, 0.3)).0, Corner::UpperLeft);
    }

    #[test]
    fn a_legend_never_covers_ink() {
        let (x, y, frac) = ((0.0, 10.0), (0.0, 10.0), (0.3, 0.3));
        // An empty corner: kept, the range unchanged.
        let rising = along([(0.0, 0.0), (10.0, 10.0)], 100);
        assert_eq!(legend_placement(&rising, x, y, frac), (Corner::UpperLeft, 10.0));
        // Lines through all four corners: the range grows by the legend's height (30 % of the
        // new range) and 2 %, and the legend's box above the old top is empty.
        let ink = along([(0.0, 0.0), (0.0, 10.0), (10.0, 0.0), (10.0, 10.0)], 100);
        assert!(quietest(&ink, x, y, frac).1 > 0);
        let (corner, top) = legend_placement(&ink, x, y, frac);
        assert!((top - 10.0 / 0.68).abs() < 1e-12, "{top}");
        assert_eq!(covered(&ink, corner, x, (y.0, top), frac), 0);
    }

    #[test]
    fn the_legend_strip_wraps_its_entries_into_rows() {
        let entries: Vec<(String, Swatch)> = ["±2σ of f", "samples", "mean", "data"]
            .iter()
            .map(|n| (n.to_string(), Swatch::Dot(BLACK.to_rgba())))
            .collect();
        // One row in a wide figure, entries left to right without overlap.
        let wide = legend_layout(&entries, 960);
        assert!(wide.iter().all(|&(_, r)| r == 0));
        for (k, pair) in wide.windows(2).enumerate() {
            assert_eq!(pair[1].0 - pair[0].0, legend_entry_width(&entries[k].0));
        }
        assert_eq!(legend_strip_height(&entries, 960), 30);
        // A narrow one wraps, never starting a row past its width.
        let narrow = legend_layout(&entries, 200);
        assert!(narrow.last().unwrap().1 >= 1);
        for (&(x, _), (label, _)) in narrow.iter().zip(&entries) {
            assert!(x == 12 || x + legend_entry_width(label) <= 200, "{label} at {x}");
        }
        assert_eq!(legend_strip_height(&[], 960), 0);
    }

    #[test]
    fn legend_entries_are_as_wide_as_the_font_sets_their_labels() {
        // Measured, not counted: narrow letters take less room than wide ones (7 px a
        // character would make these equal), and a 12 px label is 4–10 px a character.
        let text = |l: &str| legend_entry_width(l) - 40;
        assert!(text("iiiiiiii") < text("MMMMMMMM"), "{} vs {}", text("iiiiiiii"), text("MMMMMMMM"));
        for label in ["samples", "optimised inducing inputs Z", "±2σ of f"] {
            let per_char = text(label) as f64 / label.chars().count() as f64;
            assert!((4.0..10.0).contains(&per_char), "{label}: {per_char} px a character");
        }
    }

    #[test]
    fn tick_labels_have_no_spurious_decimals() {
        let cases = [
            (1975.0, "1975"),
            (440.0, "440"),
            (-91.0, "-91"),
            (27.5, "27.5"),
            (0.25, "0.25"),
            (-0.04, "-0.04"),
            (2.0, "2"),
            (0.0, "0"),
            (-1e-17, "0"),
            (1e-5, "1e-5"),
            (2.5e6, "2.5e6"),
            (1.0 / 3.0, "0.3333"),
            (0.1 + 0.2, "0.3"),
        ];
        for (v, want) in cases {
            assert_eq!(tick_label(&v), want, "{v}");
        }
        // Decades of a log axis: 1e-14 was labelled "0" (below tick_label's zero threshold).
        for (k, want) in [
            (-14, "1e-14"),
            (-12, "1e-12"),
            (-4, "1e-4"),
            (-3, "0.001"),
            (-2, "0.01"),
            (0, "1"),
            (4, "10000"),
            (5, "1e5"),
        ] {
            assert_eq!(decade_label(k), want, "10^{k}");
        }
    }

    #[test]
    fn along_keeps_the_vertices_and_interpolates() {
        let pts = along([(0.0, 0.0), (1.0, 2.0), (3.0, 2.0)], 2);
        assert_eq!(pts, vec![(0.0, 0.0), (0.5, 1.0), (1.0, 2.0), (2.0, 2.0), (3.0, 2.0)]);
        assert!(along(std::iter::empty(), 3).is_empty());
        assert_eq!(along([(1.0, 1.0)], 3), vec![(1.0, 1.0)]);
    }
}
