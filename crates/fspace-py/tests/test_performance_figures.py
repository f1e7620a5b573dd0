"""The performance page's plots are those its tables give: `scripts/performance_figures.py` redrawn
from `docs/PERFORMANCE.md` equals the committed `docs/performance/*.svg` byte for byte, and every
plot is shown on the page."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _script():
    spec = importlib.util.spec_from_file_location("performance_figures", ROOT / "scripts" / "performance_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_plots_are_those_the_tables_give():
    page = (ROOT / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8")
    drawn = _script().figures(page)
    committed = {p.name for p in (ROOT / "docs" / "performance").glob("*.svg")}
    assert committed == set(drawn), "run `python scripts/performance_figures.py`"
    for name, svg in drawn.items():
        assert (ROOT / "docs" / "performance" / name).read_text(encoding="utf-8") == svg, \
            f"{name} is stale: run `python scripts/performance_figures.py`"
        assert f"](performance/{name})" in page, f"{name} is not shown on the page"


def test_a_changed_table_changes_its_plot():
    """The plots read the numbers: a different time in the table is a different figure."""
    page = (ROOT / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8")
    module = _script()
    assert "| 10.14 s | 8.95 s |" in page
    changed = page.replace("| 10.14 s | 8.95 s |", "| 10.14 s | 4.50 s |")
    assert module.figures(changed)["sharded-time.svg"] != module.figures(page)["sharded-time.svg"]
    assert "4.5 s" in module.figures(changed)["sharded-time.svg"]
