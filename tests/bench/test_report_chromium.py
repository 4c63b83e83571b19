"""report.html in headless Chromium: it loads without errors and shows every table and image.

CI installs Debian's ``chromium`` (``apt-get install -y chromium``); the test skips only when
the binary is absent. A small script injected into a copy of the page records load errors and
each image's naturalWidth into the DOM, which ``--dump-dom`` prints after the page has loaded.
"""

import html
import json
import re
import shutil
import subprocess

import pytest

from tests.bench.handmade import sweep_records
from verispec.bench.metrics import summarize
from verispec.bench.report import PLOTS, paper_tables, write_reports

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    print("test_report_chromium: skipped because the 'chromium' binary is not on PATH (apt-get install -y chromium)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium binary not found on PATH; install it with apt-get install -y chromium")

CHECK_SCRIPT = """<script>
window.__errors = [];
window.addEventListener('error', function (e) {
  window.__errors.push(String(e.message || (e.target && (e.target.src || '').slice(0, 40)) || 'error'));
}, true);
window.addEventListener('load', function () {
  var images = Array.prototype.slice.call(document.images);
  var result = {
    tables: document.querySelectorAll('table').length,
    rows: document.querySelectorAll('table tbody tr').length,
    images: images.length,
    widths: images.map(function (i) { return i.complete ? i.naturalWidth : -1; }),
    errors: window.__errors
  };
  var pre = document.createElement('pre');
  pre.id = 'verispec-check';
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
});
</script>"""


def chromium_check(page_path, tmp_path) -> dict:
    """Load ``page_path`` (with the check script injected) in headless Chromium; the script's result."""
    checked = tmp_path / f"checked_{page_path.name}"
    checked.write_text(page_path.read_text().replace("<head>", "<head>" + CHECK_SCRIPT, 1))
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom", checked.as_uri(),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    match = re.search(r'<pre id="verispec-check">(.*?)</pre>', result.stdout, re.S)
    assert match, f"chromium printed no check result (rc={result.returncode}): {result.stderr[-2000:]}"
    return json.loads(html.unescape(match.group(1)))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    rows = summarize(sweep_records(), ["sd", "bv", "spectr"])
    paths = write_reports(out, sweep_records(), rows, (), {"target": "hand-made"})
    return paths["html"], rows


def test_report_loads_and_shows_every_table_and_image(report, tmp_path):
    page, rows = report
    check = chromium_check(page, tmp_path)
    assert check["errors"] == []
    assert check["tables"] == len(paper_tables(rows)) + 1
    assert check["rows"] == sum(len(t.rows) for t in paper_tables(rows)) + len(rows)
    assert check["images"] == len(PLOTS)
    assert all(width > 100 for width in check["widths"]), check["widths"]


def test_a_broken_image_is_detected(report, tmp_path):
    """Negative control: the check sees an image that does not decode."""
    page, _ = report
    broken = tmp_path / "broken.html"
    broken.write_text(page.read_text().replace("data:image/png;base64,iVBOR", "data:image/png;base64,AAAA", 1))
    check = chromium_check(broken, tmp_path)
    assert sorted(check["widths"])[0] <= 0
    assert check["errors"], "the failed image load should be reported as an error"
