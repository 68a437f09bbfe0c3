"""`chessgrpo report`: a self-contained HTML report (embedded PNGs) plus the PNGs, from real runs.

The runs are the real short runs of test_diagnose.py (`build_lab`: built once per session and
reused): a GRPO run with three held-out evaluations, a pretraining run and a GRPO run with an
entropy bonus (to compare configs). Every PNG is decoded; the figures are checked for titles,
axis labels and legends, and for interval bands / error bars. When Chromium is installed the
report is also opened in headless Chromium (scripts/check_report.py); CI does not need it.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
from matplotlib.collections import PolyCollection

from chessgrpo import cli
from chessgrpo.track.plots import build_figures
from chessgrpo.track.report import build_report, config_differences, png_directory
from chessgrpo.track.run_data import load_run

from test_diagnose import build_lab

REPO = Path(__file__).resolve().parents[1]
EMBEDDED = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
GRPO_FIGURES = {"reward", "heldout", "loss", "kl", "entropy", "signal", "clip", "ratio", "throughput", "optimizer"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return build_lab(tmp_path_factory.getbasetemp() / "diagnose_lab")


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / run.name
    shutil.copytree(run, target, ignore=shutil.ignore_patterns("checkpoints"))
    return target


def _check_embedded_and_files(html_path: Path, pngs: list[Path]) -> list[bytes]:
    text = html_path.read_text()
    embedded = [base64.b64decode(data) for data in EMBEDDED.findall(text)]
    assert len(embedded) == len(pngs) == text.count("<img ")
    for data, path in zip(embedded, pngs):
        assert data == path.read_bytes()  # the HTML shows exactly the PNG beside it
        image = matplotlib.image.imread(path)  # decodes
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 500
    return embedded


@pytest.fixture(scope="module")
def healthy_report(lab, tmp_path_factory):
    run = _copy(lab.healthy, tmp_path_factory.mktemp("report"))
    return run, build_report([run])


def test_grpo_report_embeds_every_figure_and_writes_pngs(healthy_report):
    run, result = healthy_report
    assert result.html == run / "report.html" and png_directory(result.html) == run / "report"
    assert {p.stem for p in result.pngs} == GRPO_FIGURES and all(p.parent == run / "report" for p in result.pngs)
    _check_embedded_and_files(result.html, result.pngs)
    text = result.html.read_text()
    for section in ("Runs", "Diagnosis", "Evaluation", "Figures", "Configuration"):
        assert f">{section}</h2>" in text
    assert "learning.too_short" in text  # the findings, with their severity
    for step in (0, 8, 16):  # the evaluation table (value [95% interval])
        assert f"<td class=num>{step}</td>" in text
    assert re.search(r"\d\.\d{4} \[\d\.\d{4}, \d\.\d{4}\]", text)
    assert "src=\"http" not in text and "<script" not in text  # self-contained, nothing to fetch or run


def test_figures_are_labelled_and_show_intervals(lab):
    figures = {f.name: f for f in build_figures([load_run(lab.healthy)])}
    for name, figure in figures.items():
        assert figure.figure._suptitle is not None and figure.figure._suptitle.get_text(), name
        for ax in figure.figure.axes:
            if not ax.get_visible():
                continue
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title(), (name, ax.get_title())
            assert ax.get_legend() is not None, (name, ax.get_title())
    heldout = figures["heldout"].figure.axes
    assert all(ax.containers for ax in heldout if ax.get_visible())  # error bars on every held-out metric
    reward = figures["reward"].figure.axes[0]
    assert any(isinstance(c, PolyCollection) for c in reward.collections)  # the reward's interval band


def test_pretraining_report_plots_what_exists(lab, tmp_path):
    run = _copy(lab.pretrain, tmp_path)
    result = build_report([run], tmp_path / "out" / "pre.html")
    names = {p.stem for p in result.pngs}
    assert {"pretraining", "entropy", "optimizer", "throughput"} <= names
    assert not names & {"reward", "kl", "ratio", "clip", "signal", "heldout"}
    assert all(p.parent == tmp_path / "out" / "pre" for p in result.pngs)
    _check_embedded_and_files(result.html, result.pngs)
    assert "eval/top1" in result.html.read_text()  # the pretraining evaluation table


def test_comparing_runs_lists_config_differences(lab, tmp_path, capsys):
    out = tmp_path / "compare.html"
    assert cli.main(["report", str(lab.healthy), str(lab.entropy), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"report: {out}" in printed and "healthy:" in printed and "entropy:" in printed
    text = out.read_text()
    assert "Configuration differences" in text and "grpo.entropy_coef" in text
    differences = dict(config_differences([load_run(lab.healthy), load_run(lab.entropy)]))
    assert differences["grpo.entropy_coef"] == [0.0, 0.1] and differences["run.name"] == ["healthy", "entropy"]
    assert "grpo.kl_coef" not in differences
    assert len(EMBEDDED.findall(text)) == len(list((tmp_path / "compare").glob("*.png"))) >= 9


def test_report_of_a_run_that_just_started(lab, tmp_path):
    run = tmp_path / "starting"
    run.mkdir()
    shutil.copy(lab.healthy / "config.yaml", run / "config.yaml")
    result = build_report([run])
    assert result.pngs == [] and "No metrics to plot yet" in result.html.read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        build_report([empty])


@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("google-chrome") is None, reason="no Chromium installed")
def test_report_renders_in_headless_chromium(healthy_report):
    _, result = healthy_report
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "check_report.py"), str(result.html)], capture_output=True,
                          text=True, timeout=180, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(result.pngs)} images in the browser" in done.stdout and "OK: every image loaded" in done.stdout
