#!/usr/bin/env python3
"""Open a `chessgrpo report` HTML file in headless Chromium and check that every image loaded and
every interactive (plotly) chart drew.

    python scripts/check_report.py runs/quickstart/grpo/report.html [--screenshot shot.png] [--browser PATH]

It copies the report to a temporary file with one added script that, at the page's load event
(fired once every image has loaded or failed), writes {images, broken, widths} into the DOM; Chromium
(`--headless --dump-dom`) prints the DOM and this script reads the result back. It passes when the
page has at least one image or chart, every <img> has naturalWidth > 0 (a truncated or corrupt base64
PNG fails) and every plotly chart holds its SVG. In a 1400x900 window (--window) it also checks the layout: the verdict's
headline (.headline) ends within the first screen, every PGN link (a.pgn) names an existing file, and no
table is wider than its panel (each sits in a scrolling .table-wrap inside its section, and the page does
not scroll sideways), also with the page squeezed to 600 px, where the wide tables must scroll. `--screenshot` also saves a full-page PNG for a look by eye.

The browser is $CHROMIUM, --browser, or the first of chromium, chromium-browser, google-chrome,
google-chrome-stable, chrome on PATH (Debian: `apt-get install chromium`). Nothing else is needed
(no Python packages). Exit codes: 0 all images loaded, 1 a check failed, 2 no browser found or it
could not run. CI does not depend on this script; the report's tests decode every PNG instead.
"""

from __future__ import annotations

import argparse
import html.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
RESULT_ID = "chessgrpo-report-check"
PROBE = f"""
<script>
window.addEventListener("load", () => {{
  // The load event fires after every image has loaded or failed, so naturalWidth is final here.
  const images = Array.from(document.images);
  const broken = images.filter((img) => !(img.complete && img.naturalWidth > 0)).map((img) => img.alt || img.src.slice(0, 60));
  const out = document.createElement("pre");
  out.id = "{RESULT_ID}";
  // Interactive reports: every plotly chart must have drawn its SVG (plotly.js is embedded in the page).
  const charts = Array.from(document.querySelectorAll(".plotly-graph-div"));
  const blank = charts.filter((div) => !div.querySelector("svg.main-svg")).map((div) => div.id);
  // Layout: every table sits in a scrolling wrapper that stays inside its section (a wide table scrolls, never
  // clips or widens the page); the verdict's headline is on the first screen; the PGN links' targets.
  const tables = Array.from(document.querySelectorAll("table"));
  const measure = (wholePage) => {{
    const overflow = [];
    let scrolling = 0;
    tables.forEach((table, index) => {{
      const wrap = table.parentElement;
      const name = (table.className || "table") + " #" + index + " (" + (table.rows[0] ? table.rows[0].innerText.slice(0, 40) : "") + ")";
      const scrolls = wrap.classList.contains("table-wrap") && ["auto", "scroll"].includes(getComputedStyle(wrap).overflowX);
      if (!scrolls) {{
        if (table.getBoundingClientRect().width > wrap.clientWidth + 1) overflow.push(name + ": wider than its panel, no scrolling wrapper");
        return;
      }}
      if (wrap.getBoundingClientRect().right > wrap.parentElement.getBoundingClientRect().right + 1) {{
        overflow.push(name + ": its wrapper sticks out of its panel");
      }}
      if (wrap.scrollWidth > wrap.clientWidth + 1) scrolling += 1;
    }});
    const page = document.documentElement;  // (the charts keep their drawn width until a window resize: page check wide only)
    if (wholePage && page.scrollWidth > page.clientWidth + 1) overflow.push("the page scrolls sideways: " + page.scrollWidth + " > " + page.clientWidth + " px");
    return {{overflow: overflow, scrolling: scrolling}};
  }};
  const wide = measure(true);
  // The same page squeezed to 600 px: wide tables must scroll inside their wrappers, not stick out.
  const width = document.body.style.maxWidth;
  document.body.style.maxWidth = "600px";
  const narrow = measure(false);
  document.body.style.maxWidth = width;
  const headline = document.querySelector(".headline");
  const verdict = headline ? {{text: headline.innerText, tone: headline.dataset.tone, top: headline.getBoundingClientRect().top,
                               bottom: headline.getBoundingClientRect().bottom, screen: window.innerHeight}} : null;
  const pgn = Array.from(document.querySelectorAll("a.pgn")).map((a) => a.href);
  out.textContent = JSON.stringify({{images: images.length, broken: broken, widths: images.map((img) => img.naturalWidth),
                                     charts: charts.length, blank: blank, tables: tables.length, overflow: wide.overflow,
                                     scrolling: wide.scrolling, narrow: narrow, verdict: verdict, pgn: pgn}});
  document.body.appendChild(out);
}});
</script>
"""


class _ImgCounter(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "img":
            self.images += 1


class _ResultReader(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self._inside = False
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "pre" and ("id", RESULT_ID) in attrs:
            self._inside = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre":
            self._inside = False

    def handle_data(self, data: str) -> None:
        if self._inside:
            self.text += data


def find_browser(explicit: str | None) -> str | None:
    for candidate in (explicit, os.environ.get("CHROMIUM")):
        if candidate:
            return candidate if Path(candidate).exists() or shutil.which(candidate) else None
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def _browser_command(browser: str, *extra: str) -> list[str]:
    # --no-sandbox: Chromium refuses to run as root with its sandbox (containers, CI); the page is our own file.
    return [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--allow-file-access-from-files",
        *extra,
    ]


def check(
    report: Path, browser: str, screenshot: Path | None, timeout: float, width: int = 1400, height: int = 900
) -> int:
    text = report.read_text(encoding="utf-8")
    counter = _ImgCounter()
    counter.feed(text)
    charts_in_file = text.count('class="plotly-graph-div"')
    if counter.images == 0 and charts_in_file == 0:
        print(f"FAIL: {report} has no <img> element and no plotly chart", file=sys.stderr)
        return 1
    probed = text.replace("</body>", PROBE + "</body>") if "</body>" in text else text + PROBE
    # The copy resolves its relative links (the PGNs) from the report's own folder, as the original does.
    base = f'<base href="{report.resolve().parent.as_uri()}/">'
    probed = probed.replace("<head>", "<head>" + base, 1) if "<head>" in probed else base + probed
    with tempfile.TemporaryDirectory() as directory:
        page = Path(directory) / "report.html"
        page.write_text(probed, encoding="utf-8")
        size = f"--window-size={width},{height}"
        command = _browser_command(browser, size, "--virtual-time-budget=15000", "--dump-dom", page.as_uri())
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            print(f"could not run {browser}: {error}", file=sys.stderr)
            return 2
        reader = _ResultReader()
        reader.feed(done.stdout)
        if not reader.text:
            print(
                f"{browser} gave no result (exit {done.returncode}); stderr tail:\n{done.stderr[-1500:]}",
                file=sys.stderr,
            )
            return 2
        result = json.loads(reader.text)
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            size, target = "--window-size=1300,9000", f"--screenshot={screenshot.resolve()}"
            shot = _browser_command(browser, size, target, report.resolve().as_uri())
            subprocess.run(shot, capture_output=True, text=True, timeout=timeout, check=False)
            print(f"screenshot: {screenshot}" if screenshot.is_file() else f"screenshot failed: {screenshot}")
    print(
        f"{report}: {result['images']} images in the browser ({counter.images} <img> in the file), "
        f"natural widths {sorted(set(result['widths']))}"
    )
    if result["images"] != counter.images:
        print(f"FAIL: the browser saw {result['images']} images, the file has {counter.images}", file=sys.stderr)
        return 1
    if result["broken"]:
        print(f"FAIL: {len(result['broken'])} image(s) did not load: {result['broken']}", file=sys.stderr)
        return 1
    if result.get("blank"):
        print(f"FAIL: {len(result['blank'])} plotly chart(s) drew nothing: {result['blank'][:5]}", file=sys.stderr)
        return 1
    return _check_layout(result, width, height) or _ok(result)


def _ok(result: dict) -> int:
    print(f"OK: every image loaded (naturalWidth > 0); {result.get('charts', 0)} interactive charts drawn")
    return 0


def _check_layout(result: dict, width: int, height: int) -> int:
    """The verdict on the first screen, every PGN link to an existing file, no table wider than its panel; 1 on failure."""
    verdict = result.get("verdict")
    if verdict is None:
        print("FAIL: no verdict (.headline) in the report", file=sys.stderr)
        return 1
    print(
        f"verdict ({verdict['tone']}): {verdict['text']!r}, at {verdict['top']:.0f}-{verdict['bottom']:.0f} px of a "
        f"{width}x{verdict['screen']} window"
    )
    if verdict["bottom"] > verdict["screen"]:
        print(
            f"FAIL: the verdict ends at {verdict['bottom']:.0f} px, below the first screen ({verdict['screen']} px)",
            file=sys.stderr,
        )
        return 1
    missing = [href for href in result.get("pgn", []) if not _file_of(href).is_file()]
    print(
        f"PGN links: {len(result.get('pgn', []))}"
        + (f", {len(missing)} broken" if missing else ", every one to an existing file")
    )
    if missing:
        print(f"FAIL: PGN link(s) to no file: {missing[:5]}", file=sys.stderr)
        return 1
    narrow = result.get("narrow") or {}
    print(
        f"tables: {result.get('tables', 0)}, {result.get('scrolling', 0)} scrolling inside their panel "
        f"({narrow.get('scrolling', 0)} when the page is squeezed to 600 px)"
    )
    for overflow, where in ((result.get("overflow"), f"at {width} px"), (narrow.get("overflow"), "squeezed to 600 px")):
        if overflow:
            print(f"FAIL: {len(overflow)} table(s) overflow their panel {where}: {overflow[:5]}", file=sys.stderr)
            return 1
    return 0


def _file_of(href: str) -> Path:
    parsed = urllib.parse.urlparse(href)
    return Path(urllib.parse.unquote(parsed.path)) if parsed.scheme == "file" else Path("/nonexistent") / href


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check that a chessgrpo HTML report renders in headless Chromium.")
    parser.add_argument("report", type=Path, help="the report's HTML file")
    parser.add_argument("--browser", default=None, help="Chromium/Chrome executable (default: $CHROMIUM or PATH)")
    parser.add_argument("--screenshot", type=Path, default=None, help="also save a full-page screenshot here")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the browser")
    parser.add_argument(
        "--window", default="1400x900", help="browser window WIDTHxHEIGHT: the first screen the verdict must fit"
    )
    args = parser.parse_args(argv)
    if not args.report.is_file():
        print(f"no report at {args.report}", file=sys.stderr)
        return 2
    browser = find_browser(args.browser)
    if browser is None:
        print(
            "no Chromium or Chrome found (tried $CHROMIUM, --browser and "
            + ", ".join(BROWSERS)
            + " on PATH); install one, "
            "e.g. `apt-get install chromium` on Debian/Ubuntu, or pass --browser PATH",
            file=sys.stderr,
        )
        return 2
    try:
        width, height = (int(v) for v in args.window.lower().split("x"))
    except ValueError:
        print(f"--window {args.window!r}: expected WIDTHxHEIGHT, e.g. 1400x900", file=sys.stderr)
        return 2
    return check(args.report, browser, args.screenshot, args.timeout, width, height)


if __name__ == "__main__":
    sys.exit(main())
