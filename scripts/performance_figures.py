"""The performance page's plots, drawn from its own tables: `docs/PERFORMANCE.md` is the one
source of the numbers, and each figure under `docs/performance/` is a bar chart of one table.

    python scripts/performance_figures.py [--out docs/performance]

Plain SVG written by hand (no plotting library): the same tables give the same bytes, which
`crates/fspace-py/tests/test_performance_figures.py` checks against the committed files.
"""

from __future__ import annotations

import argparse
import html
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "PERFORMANCE.md"
UNITS = {"ms": 1e-3, "s": 1.0, "MB": 1.0, "MiB": 1.0}
COLOURS = ("#9e9e9e", "#3f51b5")  # the other code, fspace


def table_after(text: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped, header and rule dropped) of the first table after ``heading``."""
    start = text.index(heading)
    lines = text[start:].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[2:]


def numbers(cell: str) -> tuple[list[float], float]:
    """``"2.54 / 137.8 / 17.3 s"`` → ([2.54, 137.8, 17.3], 1.0): the numbers (thousands written
    with spaces) and the unit's factor to seconds or MB."""
    unit = cell.split()[-1]
    body = cell[: -len(unit)] if unit in UNITS else cell
    values = [float(part.replace(" ", "").replace("\u2009", "")) for part in body.split("/")]
    return values, UNITS.get(unit, 1.0)


def seconds(cell: str) -> float:
    values, factor = numbers(cell.replace("–", "-").split("(")[0].strip())
    return sum(values) * factor


def bar_chart(title: str, categories: list[str], series: list[tuple[str, list[float | None], list[str]]],
              axis: str, log: bool) -> str:
    """Horizontal grouped bars, one group per category, one bar per series, labelled."""
    width, left, right, top = 760, 190, 120, 58
    bar, gap = 16, 14
    group = bar * len(series) + gap
    height = top + group * len(categories) + 46
    values = [v for _, vs, _ in series for v in vs if v is not None]
    lo = 10 ** math.floor(math.log10(min(values))) if log else 0.0
    if log:
        hi = 10 ** math.ceil(math.log10(max(values)))
    else:
        # A round step (1, 2 or 5 × 10^k) giving at most five intervals.
        rough = max(values) / 5
        power = 10 ** math.floor(math.log10(rough))
        step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
        hi = step * math.ceil(max(values) / step)
    span = width - left - right

    def x(v: float) -> float:
        if log:
            return left + span * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        return left + span * (v - lo) / (hi - lo)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="14" font-weight="bold">'
           f'{html.escape(title)}</text>']
    for k, (name, _, _) in enumerate(series):
        lx = left + k * 220
        out.append(f'<rect x="{lx}" y="30" width="12" height="12" fill="{COLOURS[k % 2]}"/>')
        out.append(f'<text x="{lx + 18}" y="40">{html.escape(name)}</text>')
    ticks = [10.0 ** e for e in range(round(math.log10(lo)), round(math.log10(hi)) + 1)] if log else \
        [step * i for i in range(round(hi / step) + 1)]
    bottom = height - 40
    for t in ticks:
        tx = x(t)
        out.append(f'<line x1="{tx:.1f}" y1="{top - 4}" x2="{tx:.1f}" y2="{bottom}" stroke="#e0e0e0"/>')
        label = f"{t:g}"
        out.append(f'<text x="{tx:.1f}" y="{bottom + 14}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{left + span / 2:.0f}" y="{bottom + 32}" text-anchor="middle">{html.escape(axis)}</text>')
    for i, category in enumerate(categories):
        gy = top + i * group
        out.append(f'<text x="{left - 8}" y="{gy + group / 2 - gap / 2 + 4:.1f}" text-anchor="end">'
                   f'{html.escape(category)}</text>')
        for k, (_, vs, labels) in enumerate(series):
            v, y = vs[i], gy + k * bar
            if v is not None:
                out.append(f'<rect x="{left}" y="{y}" width="{x(v) - left:.1f}" height="{bar - 2}" '
                           f'fill="{COLOURS[k % 2]}"/>')
            end = x(v) if v is not None else left
            out.append(f'<text x="{end + 4:.1f}" y="{y + bar - 5}">{html.escape(labels[i])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def laplace_torch_figures(text: str) -> dict[str, str]:
    rows = table_after(text, "### fspace's Python `Laplace` beside laplace-torch")
    names, theirs, ours, their_labels, our_labels = [], [], [], [], []
    mem_theirs, mem_ours, mem_their_labels, mem_our_labels = [], [], [], []
    for row in rows:
        names.append(row[0])
        t_ours = seconds(row[2])
        if row[1].startswith("not finished in"):
            bound = float(re.search(r"not finished in (\d+) s", row[1]).group(1))
            t_theirs, label = bound, f"> {bound:g} s (not finished)"
        else:
            t_theirs = seconds(row[1])
            label = f"{t_theirs:.3g} s"
        theirs.append(t_theirs)
        ours.append(t_ours)
        their_labels.append(label)
        our_labels.append(f"{t_ours:.3g} s ({row[3]})")
        memory = row[4].split("/")
        their_mb = memory[0].strip().replace(" ", "")
        our_mb = numbers(memory[1].strip())[0][0]
        mem_theirs.append(None if their_mb in ("—", "-") else float(their_mb))
        mem_ours.append(our_mb)
        mem_their_labels.append("not measured" if mem_theirs[-1] is None else f"{mem_theirs[-1]:g} MB")
        mem_our_labels.append(f"{our_mb:g} MB")
    return {
        "laplace-torch-time.svg": bar_chart(
            "fit + optimize_prior_precision + predict, wall time", names,
            [("laplace-torch 0.3", theirs, their_labels), ("fspace", ours, our_labels)], "seconds (log scale)", True),
        "laplace-torch-memory.svg": bar_chart(
            "peak memory of the process (VmHWM)", names,
            [("laplace-torch 0.3", mem_theirs, mem_their_labels), ("fspace", mem_ours, mem_our_labels)],
            "MB (log scale)", True),
    }


def streaming_figure(text: str) -> dict[str, str]:
    rows = table_after(text, "### `fit(loader)` streamed against `fit(X, y)` in memory (Python)")
    names = [r[0].replace("`", "") for r in rows]
    held = [numbers(r[4])[0][0] for r in rows]
    streamed = [numbers(r[5])[0][0] for r in rows]
    return {"streaming-memory.svg": bar_chart(
        "memory growth of a 60 000-image MNIST fit", names,
        [("fit(X, y), data in memory", held, [f"{v:g} MiB" for v in held]),
         ("fit(loader), streamed", streamed, [f"{v:g} MiB" for v in streamed])], "MiB", False)}


def sharded_figure(text: str) -> dict[str, str]:
    rows = table_after(text, "### Sharded fitting: processes against threads, and the communication model (Python)")
    names = [r[0].replace("`", "") for r in rows]
    threads = [seconds(r[1]) for r in rows]
    processes = [seconds(r[2]) for r in rows]
    return {"sharded-time.svg": bar_chart(
        "Laplace fit on 59 800 MNIST images, two cores", names,
        [("1 process × 2 threads", threads, [f"{v:g} s" for v in threads]),
         ("2 processes × 1 thread", processes, [f"{v:g} s" for v in processes])], "seconds", False)}


def figures(text: str) -> dict[str, str]:
    """Every figure of the page, by file name."""
    return {**laplace_torch_figures(text), **streaming_figure(text), **sharded_figure(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, svg in figures(PAGE.read_text(encoding="utf-8")).items():
        (args.out / name).write_text(svg, encoding="utf-8")
        print(args.out / name)


if __name__ == "__main__":
    main()
