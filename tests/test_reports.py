"""HTML and Markdown reports: sections, plots, self-contained, deterministic, escaped, the same
numbers as the JSON, matplotlib only when asked for, and each page rendered in a real browser
(Debian's chromium through Playwright; skipped where either is missing, `.ci/run` installs both)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import archscan
from archscan.cli import main
from archscan.api import compare
from archscan.measure import DeviceProfile, MeasureOptions
from archscan.report.html import compare_html, report_html
from archscan.report.markdown import compare_markdown, report_markdown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILE = DeviceProfile(device="cpu", name="Test CPU", threads=2, peak_flops={"float32": 2e10}, bandwidth=1e10,
                        launch_overhead_ms=0.005, created="2026-11-22T00:00:00+00:00", torch_version="x")
MODEL, INPUT = "zoo:shufflenet_v2_x0_5", "1,3,64,64"
SINGLE = ["summary", "modules", "roofline", "latency", "memory", "findings", "recommendations", "blocks"]


@pytest.fixture(scope="module")
def pages() -> dict[str, tuple[str, str, int, list[str]]]:
    """Each report kind: (html, markdown, number of plots, section ids), and the JSON behind it."""
    static = archscan.scan(MODEL, [INPUT], profile=False).to_json()
    predicted = archscan.scan(MODEL, [INPUT], profile=PROFILE).to_json()
    measured = archscan.scan(MODEL, [INPUT], profile=PROFILE, measure=MeasureOptions(
        device="cpu", node_budget_ms=2, e2e_budget_ms=5, progress=False)).to_json()
    result = compare([MODEL, "zoo:mobilenet_v1_050", "missing.py:Net"], [INPUT], profile=PROFILE)
    data = result.to_json()
    # plots: the roofline, the latency bars where there is latency, the memory timeline
    out = {"static": (report_html(static), report_markdown(static), 2, SINGLE, static),
           "predicted": (report_html(predicted), report_markdown(predicted), 3, SINGLE, predicted),
           "measured": (report_html(measured), report_markdown(measured), 3, SINGLE, measured),
           "compare": (compare_html(data, result.reports), compare_markdown(data, result.reports), 1,
                       ["summary", "table", "scatter", "model-1", "model-2", "model-3"], (data, result.reports))}
    return out


@pytest.mark.parametrize("kind", ["static", "predicted", "measured", "compare"])
def test_sections_and_plots(pages, kind):
    html, _, plots, sections, _ = pages[kind]
    assert re.findall(r'<section id="([^"]+)"', html) == sections
    assert html.count("<svg") == plots
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    if kind == "static":
        assert "No latency" in html and "archscan calibrate" in html
    if kind == "measured":
        assert "measured on" in html and "slowest nodes (measured)" in html
    if kind == "compare":
        assert "failed: model file not found: missing.py" in html and "zoo:mobilenet_v1_050" in html


@pytest.mark.parametrize("kind", ["static", "measured", "compare"])
def test_self_contained(pages, kind):
    """Opens from disk, offline: no script, no stylesheet link, no image or font fetched; the only
    URLs are the SVG namespace names, which are never requested."""
    html = pages[kind][0]
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\((?!#)|src=", html, re.I)  # url(#id): a clip path in the page
    for match in re.finditer(r"https?://[^\s\"'<>]+", html):
        before = html[max(0, match.start() - 20):match.start()]
        assert re.search(r'xmlns(:\w+)?="$', before), f"a URL in the page: {match.group()}"
    assert len(html) < 400_000


def test_deterministic(pages):
    """The same report gives the same bytes (the SVG ids are salted, no date is written), and a
    second scan of the same model gives the same page."""
    html, md, _, _, static = pages["static"]
    assert report_html(copy.deepcopy(static)) == html and report_markdown(static) == md
    again = archscan.scan(MODEL, [INPUT], profile=False).to_json()
    assert report_html(again) == html


def test_markdown_numbers_are_the_json(pages):
    """Every count in the Markdown tables is the JSON's exact integer; times agree to 3 decimals."""
    _, md, _, _, report = pages["measured"]
    rows = {}
    for line in md.splitlines():
        m = re.match(r"\| (?:&nbsp;)*\*{0,2}`([^`]+)`\*{0,2} \| (\w+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d.]+) \|", line)
        if m:
            rows[m.group(1)] = m.groups()[1:]
    modules = {m["path"] or report["model"]: m for m in report["modules"] if m["depth"] <= 2}
    assert set(rows) == set(modules)
    for path, (kind, params, flops, mac, ms) in rows.items():
        m = modules[path]
        assert (kind, int(params.replace(",", "")), int(flops.replace(",", "")), int(mac.replace(",", ""))) == (
            m["type"], m["params"], m["flops"], m["mac_bytes"])
        # printed to 3 decimals: half a unit off at most, plus the float error of a value on the half
        assert float(ms) == pytest.approx(m["latency_ms"], abs=5e-4 + 1e-9)
    t = report["totals"]
    assert f"| FLOPs (multiply-adds) | {t['flops']:,} |" in md
    assert f"| MAC (bytes moved) | {t['mac_bytes']:,} (" in md
    assert f"| params | {t['params']:,} (" in md
    blocks = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^\| `([^`]+)` \| \w+ \| \w+ \| (\d+) \| (\d+) \| \d+ \| \d+ \| ([\d,]+) \| ([\d,]+) \|", md, re.M)}
    assert len(blocks) == len(report["blocks"]) > 0
    for b in report["blocks"]:
        assert tuple(int(x.replace(",", "")) for x in blocks[b["name"]]) == (b["nodes"], b["fragments"], b["flops"],
                                                                             b["mac_bytes"])


def test_compare_markdown_numbers_are_the_json(pages):
    _, md, _, _, (data, _) = pages["compare"]
    ok = [r for r in data["rows"] if "error" not in r]
    header = next(line for line in md.splitlines() if line.startswith("| model |"))
    names = [c.strip() for c in header.strip("|").split(" | ")]
    for r in ok:
        line = next(line for line in md.splitlines() if line.startswith(f"| `{r['model']}` |"))
        cell = dict(zip(names, (c.strip() for c in line.strip("|").split(" | "))))
        assert [int(cell[k].replace(",", "")) for k in ("params", "FLOPs", "MAC bytes")] == \
            [r["params"], r["flops"], r["mac_bytes"]]
        assert float(cell["predicted ms"]) == pytest.approx(r["predicted_ms"], abs=5e-4)
        assert [int(cell[g]) for g in ("G1", "G2", "G3", "G4")] == [r["findings"][g] for g in ("G1", "G2", "G3", "G4")]
        if "peak_bytes" in r:  # every figure of the terminal's table is in the Markdown too
            assert int(cell["peak memory"].replace(",", "")) == r["peak_bytes"]
    assert "`missing.py:Net` failed: model file not found" in md


def test_escaped():
    """Names and messages from the model are text, never markup (HTML) or table structure (Markdown)."""
    report = archscan.scan(MODEL, [INPUT], profile=False).to_json()
    report["model"] = "evil<script>alert(1)</script>|x"
    report["findings"][0]["message"] = "a | b <img src=x onerror=alert(1)>"
    html = report_html(report)
    assert "<script" not in html and "<img" not in html
    assert "evil&lt;script&gt;" in html and "&lt;img src=x" in html
    md = report_markdown(report)
    assert "a \\| b" in md


def test_matplotlib_only_for_reports(tmp_path):
    """The renderers import neither torch nor matplotlib; a scan without --report never loads matplotlib."""
    code = """
import sys
import archscan.report.html, archscan.report.markdown
assert "matplotlib" not in sys.modules and "torch" not in sys.modules, sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "matplotlib"))[:3]
from archscan.cli import main
assert main(["zoo:shufflenet_v2_x0_5", "--input", "1,3,64,64", "--json"]) == 0
assert "matplotlib" not in sys.modules
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_cli_writes_reports(tmp_path, capsys, monkeypatch):
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    assert main([MODEL, "--input", INPUT, "--report", str(html), "--markdown", str(md), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert html.read_text().count("<svg") >= 1 and f"{data['totals']['flops']:,}" in md.read_text()
    cmp_html = tmp_path / "c.html"
    assert main(["compare", MODEL, "zoo:mobilenet_v1_050", "--input", INPUT, "--report", str(cmp_html)]) == 0
    assert '<section id="scatter">' in cmp_html.read_text()
    # a path that cannot be written, or no matplotlib: one message before any analysis
    for bad in (tmp_path / "no" / "dir" / "r.html", tmp_path):
        assert main([MODEL, "--input", INPUT, "--report", str(bad)]) == 2
        assert "cannot write --report" in capsys.readouterr().err
    assert main(["compare", MODEL, "--markdown", str(tmp_path / "nope" / "c.md")]) == 2
    assert "cannot write --markdown" in capsys.readouterr().err
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    assert main([MODEL, "--input", INPUT, "--report", str(html)]) == 2
    assert "pip install matplotlib" in capsys.readouterr().err


# --- in a real browser ------------------------------------------------------------------------------

def _chromium() -> str:
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    return path


@pytest.fixture(scope="module")
def browser():
    path = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.mark.parametrize("kind", ["static", "predicted", "measured", "compare"])
def test_in_a_browser(pages, browser, kind, tmp_path):
    """Every section and plot renders, nothing is fetched from anywhere, no console or page error,
    nothing wider than the window, and the full-page screenshot is not blank."""
    from PIL import Image

    html, _, plots, sections, _ = pages[kind]
    page_file = tmp_path / f"{kind}.html"
    page_file.write_text(html, encoding="utf-8")
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    requested, errors = [], []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            requested.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(page_file.as_uri())
    page.wait_for_load_state("load")
    assert requested == [] and errors == []
    for sid in sections:
        box = page.locator(f"section#{sid}").bounding_box()
        assert box and box["height"] > 20, sid
    sizes = page.evaluate("[...document.querySelectorAll('svg')].map(s => s.getBoundingClientRect())"
                          ".map(r => [r.width, r.height])")
    assert len(sizes) == plots and all(w > 300 and h > 150 for w, h in sizes)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1200
    shot = tmp_path / f"{kind}.png"
    page.screenshot(path=str(shot), full_page=True)
    page.close()
    image = Image.open(shot).convert("L")
    assert image.height > 900
    histogram = image.histogram()
    dark = sum(histogram[:128]) / (image.width * image.height)
    assert 0.002 < dark < 0.5, f"screenshot looks blank or broken ({dark:.2%} dark pixels)"
    assert len(image.getcolors(maxcolors=256 * 256) or range(257)) > 16
