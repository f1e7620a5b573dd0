"""Every Python block of the user guide (the pages under ``docs/`` that ``mkdocs.yml`` builds into
the site) runs as printed: a page's blocks run in order in one namespace, as a reader pastes
them into one session. The Rust blocks of the same pages run as doctests (``src/lib.rs``).

The blocks of ``docs/scaling-out.md`` need several processes: ``test_distributed.py`` runs them
under ``torchrun`` and ``mpiexec``."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
RUN_ELSEWHERE = {"scaling-out.md": "test_distributed.py runs them under torchrun and mpiexec"}


def pages():
    """The guide's Markdown pages: ``docs/`` without the committed runs' folders."""
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "results" not in p.relative_to(DOCS).parts[:1])


def python_blocks(text: str):
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_the_pages_are_the_ones_the_site_builds():
    """Each page here is in ``mkdocs.yml``'s nav (so none is built but unreachable), and the
    nav names no missing page."""
    nav = re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
    in_nav = {n for n in nav if not n.startswith("results/")}
    assert in_nav == set(pages())
    assert all((DOCS / n).is_file() for n in nav)


def test_every_page_with_rust_blocks_runs_them_as_doctests():
    """A page with a Rust block is included in ``src/lib.rs`` as a doctest (``cargo test --doc
    -p fspace`` runs it)."""
    lib = (ROOT / "src" / "lib.rs").read_text(encoding="utf-8")
    with_rust = [p for p in pages() if re.search(r"^```rust\n", (DOCS / p).read_text(encoding="utf-8"), re.M)]
    assert with_rust, "the guide has Rust examples"
    missing = [p for p in with_rust if f'include_str!("../docs/{p}")' not in lib]
    assert not missing, f"pages whose Rust blocks no doctest runs: {missing}"


def test_the_pages_run_elsewhere_are_run_there():
    """Each page whose blocks another test runs names that test, and the test reads the page."""
    for page, why in RUN_ELSEWHERE.items():
        runner = pathlib.Path(__file__).with_name(why.split()[0])
        assert runner.is_file() and page in runner.read_text(encoding="utf-8"), (page, why)


@pytest.mark.parametrize("page", [p for p in pages() if python_blocks((DOCS / p).read_text(encoding="utf-8"))
                                  and p not in RUN_ELSEWHERE])
def test_every_python_block_of_the_page_runs(page, one_torch_thread):
    pytest.importorskip("torch")
    namespace: dict = {"__name__": "__guide__"}
    for i, block in enumerate(python_blocks((DOCS / page).read_text(encoding="utf-8"))):
        exec(compile(block, f"docs/{page} (Python block {i + 1})", "exec"), namespace)
