"""The user guide site that ``cargo xtask docs`` builds (``$FSPACE_SITE``, set by ``cargo xtask
test``), opened in a real headless browser: Playwright driving Debian's ``chromium`` package
through its executable path (``$FSPACE_CHROMIUM``, default ``/usr/bin/chromium``; a browser
build that downloads itself cannot be fetched offline). Each page renders with its images and
no console error, the search finds a method by name, and every link and image of the guide
resolves inside the site."""

from __future__ import annotations

import functools
import html.parser
import http.server
import os
import pathlib
import threading
import urllib.parse

import pytest

SITE = os.environ.get("FSPACE_SITE")
CHROMIUM = os.environ.get("FSPACE_CHROMIUM", "/usr/bin/chromium")
needs_site = pytest.mark.skipif(not SITE, reason="$FSPACE_SITE names the built site (cargo xtask test builds it)")
# Flags for a machine without a network or a display (and as root): no sandbox, no GPU, no
# background connections, which a closed network refuses and logs.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def guide_pages(site: pathlib.Path):
    """The guide's pages (the rustdoc under ``rust/`` is rustdoc's own)."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                  if p.relative_to(site).parts[0] not in ("rust", "assets", "search") and p.name != "404.html")


class _Refs(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a and a["id"]:
            self.ids.add(a["id"])
        ref = a.get("href") if tag in ("a", "link") else a.get("src") if tag in ("img", "script") else None
        if ref:
            self.refs.append(ref)


@functools.lru_cache(maxsize=None)
def _parse(path: pathlib.Path) -> _Refs:
    refs = _Refs()
    refs.feed(path.read_text(encoding="utf-8", errors="replace"))
    return refs


@needs_site
def test_every_link_and_image_of_the_guide_resolves():
    site = pathlib.Path(SITE)
    pages = guide_pages(site)
    assert {"index.html", "getting-started/python.html", "methods/fsp-laplace.html", "laplace-torch.html",
            "scaling-out.html", "PERFORMANCE.html", "results/index.html", "trust-model.html",
            "api/python.html", "api/rust.html", "ARCHITECTURE.html"} <= set(pages)
    broken = []
    for page in pages:
        for ref in _parse(site / page).refs:
            parts = urllib.parse.urlsplit(ref)
            if parts.scheme or ref.startswith(("//", "mailto:")):
                continue  # the guide links nothing outside itself; see test below
            target = (site / page).parent / urllib.parse.unquote(parts.path) if parts.path else site / page
            target = target.resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file() or site.resolve() not in target.parents:
                broken.append(f"{page}: {ref}")
            elif parts.fragment and target.suffix == ".html" and target.parts[-2:-1] != ("rust",) \
                    and "rust" not in target.relative_to(site.resolve()).parts[:1] \
                    and parts.fragment not in _parse(target).ids:
                broken.append(f"{page}: {ref} (no such anchor)")
    assert not broken, f"{len(broken)} broken links: " + "; ".join(broken[:20])


@needs_site
def test_the_guide_loads_nothing_from_outside():
    """Offline by design: no web font, script or stylesheet from another host."""
    site = pathlib.Path(SITE)
    outside = [f"{page}: {ref}" for page in guide_pages(site) for ref in _parse(site / page).refs
               if ref.startswith(("http:", "https:", "//")) and _loads(site / page, ref)]
    assert not outside, outside[:10]


def _loads(page: pathlib.Path, ref: str) -> bool:
    """Whether ``ref`` is a resource the page loads (script, image, stylesheet), not a link."""
    text = page.read_text(encoding="utf-8", errors="replace")
    return any(f'{attr}="{ref}"' in text for attr in ("src",)) or f'rel="stylesheet" href="{ref}"' in text


@pytest.fixture(scope="module")
def served():
    """The site over HTTP on loopback (the search index is fetched by a worker: not from file://)."""
    handler = functools.partial(_Quiet, directory=SITE)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # noqa: D102 - keep the test output clean
        pass


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not pathlib.Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: Debian's package `chromium` (cargo xtask test installs it)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@needs_site
def test_every_page_renders_with_its_images_and_no_console_error(served, browser):
    site = pathlib.Path(SITE)
    context = browser.new_context()
    problems = []
    for page_path in guide_pages(site):
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
        page.on("requestfailed", lambda r, errors=errors: errors.append(f"request failed: {r.url}"))
        response = page.goto(f"{served}/{page_path}", wait_until="load")
        if response is None or response.status != 200:
            problems.append(f"{page_path}: HTTP {None if response is None else response.status}")
        text = page.inner_text("article")
        if len(text.strip()) < 40:
            problems.append(f"{page_path}: the article is empty")
        broken = page.eval_on_selector_all("article img", "imgs => imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)")
        problems += [f"{page_path}: image not loaded: {src}" for src in broken]
        problems += [f"{page_path}: console: {e}" for e in errors]
        page.close()
    context.close()
    assert not problems, "\n".join(problems[:30])


@needs_site
@pytest.mark.parametrize("query, page", [("FSPLaplace", "methods/fsp-laplace.html"), ("VaLLA", "methods/valla.html"),
                                         ("GFSVI", "methods/gfsvi.html")])
def test_the_search_finds_a_method_by_name(served, browser, query, page):
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.goto(f"{served}/index.html", wait_until="load")
    tab.click("input.md-search__input")  # the header's search box (a desktop-sized viewport)
    tab.keyboard.type(query)
    tab.wait_for_selector(".md-search-result__item a", timeout=15_000)
    hrefs = tab.eval_on_selector_all(".md-search-result__item a", "links => links.map(a => a.getAttribute('href'))")
    found = [urllib.parse.urlsplit(h).path.lstrip("/") for h in hrefs]
    assert page in found, found
    assert not errors, errors
    tab.close()
