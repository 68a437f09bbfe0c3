"""`chessgrpo report`: a self-contained HTML report (interactive plotly charts, or embedded PNGs) from real runs.

The runs are the real short runs of test_diagnose.py (`build_lab`: built once per session and
reused): a GRPO run with three held-out evaluations, a pretraining run, a GRPO run with an
entropy bonus (to compare configs) and one with an adaptive KL coefficient. The game evaluations
are real too: `chessgrpo eval games ... output=RUN/eval/games_*.json` played by the GRPO run's
checkpoints at steps 8 and 16 and by its init_checkpoint (step 0), 2 games per anchor against the
random mover and Stockfish at 1 node.

Both drawings are tested: the interactive report (plotly.js embedded once, a plotly div per
panel) and the static fallback (embedded PNGs, each decoded), forced by the parameter, by
CHESSGRPO_REPORT_STATIC=1, and by plotly failing to import (sys.modules["plotly"] = None). When
Chromium is installed the interactive report is opened in headless Chromium: its screenshot must
not be blank and every plotly div must have drawn its SVG (plotly.js ran offline). The only
synthetic input is the run_info.json of the metadata test: the training loop does not write one yet.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection

from chessgrpo import cli
from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from chessgrpo.track.figures import plotly_available
from chessgrpo.track.panel_drawing import integer_ticks, y_range
from chessgrpo.track.plot_series import is_constant
from chessgrpo.track.plots import build_figures, plan_figures
from chessgrpo.track.plots_evaluation import figure_games
from chessgrpo.track.report import STATIC_ENV, build_report, png_directory
from chessgrpo.track.report_provenance import config_differences, model_settings, run_metadata
from chessgrpo.track.report_verdict import NO_CHANGE, STRONGER, UNMEASURED, WEAKER, run_verdict, start_headline
from chessgrpo.track.run_data import EloValue, load_run
from test_diagnose import build_lab

REPO = Path(__file__).resolve().parents[1]
EMBEDDED = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
PLOT_DIV = re.compile(r'<div id="(plot-[a-z_]+-\d+)" class="plotly-graph-div"')
GRPO_FIGURES = {"reward", "heldout", "loss", "kl", "entropy", "signal", "clip", "ratio", "throughput", "optimizer"}
OPENINGS = (
    "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/3P4/8/PPP1PPPP/RNBQKBNR b KQkq - 0 1",
)
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_plotly = pytest.mark.skipif(not plotly_available(), reason="plotly is not installed (pip install 'plotly>=5.20')")


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
    assert sorted(embedded) == sorted(path.read_bytes() for path in pngs)  # the HTML shows exactly the PNGs beside it
    for path in pngs:
        image = matplotlib.image.imread(path)  # decodes
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 500
    return embedded


def _panels(text: str) -> list[str]:
    """The HTML of each interactive panel (title, plotly div and its script)."""
    return text.split('<div class="panel">')[1:]


@pytest.fixture(scope="module")
def healthy_report(lab, tmp_path_factory):
    run = _copy(lab.healthy, tmp_path_factory.mktemp("report"))
    return run, build_report([run], interactive=False)


@pytest.fixture(scope="module")
def games_run(lab, tmp_path_factory):
    """A copy of the healthy GRPO run with three real `eval games` summaries in its eval/ folder."""
    run = _copy(lab.healthy, tmp_path_factory.mktemp("games"))
    openings = run.parent / "openings.epd"
    openings.write_text("\n".join(OPENINGS) + "\n")
    checkpoints = {
        "games_a": lab.healthy / "checkpoints" / "step_000008",
        "games_b": lab.healthy / "checkpoints" / "step_000016",
        "games_init": lab.pretrain,
    }
    for name, checkpoint in checkpoints.items():
        code = cli.main(
            [
                "eval",
                "games",
                "--checkpoint",
                str(checkpoint),
                "--anchors",
                "random,sf-nodes:1",
                "--games",
                "2",
                "--openings",
                str(openings),
                "--workers",
                "1",
                "--pgn",
                str(run.parent / f"{name}.pgn"),
                "max_plies=60",
                "engine.syzygy_path=null",
                "anchor_ratings=[sf-nodes:1=1000]",
                f"output={run / 'eval' / (name + '.json')}",
            ]
        )
        assert code == 0
    return run


def _games_against_start(lab, run: Path, name: str, *extra: str, anchors: str = "") -> Path:
    """Real games of the healthy run's last checkpoint (step 16) against its start (lab.pretrain, its init_checkpoint)
    and `anchors`, 4 games each, the summary and PGN in run/eval/NAME.json|.pgn (what `make run` writes)."""
    openings = run.parent / "openings.epd"
    openings.write_text("\n".join(OPENINGS) + "\n")
    summary = run / "eval" / f"{name}.json"
    code = cli.main(
        [
            "eval",
            "games",
            "--checkpoint",
            str(lab.healthy / "checkpoints" / "step_000016"),
            "--anchors",
            ",".join([str(lab.pretrain), *filter(None, [anchors])]),
            "--games",
            "4",
            "--openings",
            str(openings),
            "--workers",
            "1",
            "--pgn",
            str(run / "eval" / f"{name}.pgn"),
            "engine.syzygy_path=null",
            *extra,
            f"output={summary}",
        ]
    )
    assert code == 0 and summary.is_file()
    return summary


@pytest.fixture(scope="module")
def verdict_run(lab, games_run, tmp_path_factory):
    """The healthy run with games against its start: 4 won (by the engine's resignation adjudication, so the Elo
    difference is a lower bound), Stockfish at 200 nodes (4 lost: an upper bound), and games_run's games at step 16
    against the random mover and sf-nodes:1 (two evaluations at one step, as make run's)."""
    run = _copy(lab.healthy, tmp_path_factory.mktemp("verdict"))
    _games_against_start(
        lab,
        run,
        "games_vs_pretrain",
        "max_plies=200",
        "resign_cp=500",
        "resign_plies=2",
        "resign_nodes=200",
        anchors="sf-nodes:200",
    )
    shutil.copy(games_run / "eval" / "games_b.json", run / "eval" / "games_b.json")
    return run


@pytest.fixture(scope="module")
def no_change_run(lab, tmp_path_factory):
    """The healthy run with 4 games against its start capped at 60 plies: every one a draw by the move cap."""
    run = _copy(lab.healthy, tmp_path_factory.mktemp("no_change"))
    _games_against_start(lab, run, "games_vs_start", "max_plies=60")
    return run


# ------------------------------------------------------------------------------------------------
# The verdict: did it get stronger, against whom, with intervals


def test_verdict_leads_with_the_games_against_its_start(verdict_run, tmp_path):
    summary = json.loads((verdict_run / "eval" / "games_vs_pretrain.json").read_text())
    start, engine = summary["anchors"]
    assert (start["wins"], start["elo_difference"]["bound"]) == (4, "lower")  # every game won: only a lower bound
    assert (engine["losses"], engine["elo_difference"]["bound"]) == (4, "upper")
    verdict = run_verdict(load_run(verdict_run))
    bound = start["elo_difference"]["value"]
    assert verdict.tone == STRONGER
    assert (
        verdict.headline
        == f"Stronger than its start: won all 4 games, so the Elo difference is only a lower bound: >= {bound:+.0f}."
    )
    assert [o.label for o in verdict.opponents] == ["its start", "sf-nodes:200", "random mover", "sf-nodes:1"]
    assert verdict.opponents[0].is_start and verdict.opponents[0].evaluation.step == 16
    assert any(line.startswith("esl: ") and "paired" in line for line in verdict.secondary)  # held-out: first vs last
    assert any("reward/mean" in line for line in verdict.secondary)
    assert verdict.rating is not None and "sf-nodes:1 = 1000" in verdict.rating  # the rated anchor's scale

    out = tmp_path / "elsewhere" / "report.html"  # the PGN links are relative to wherever the report is
    text = build_report(
        [verdict_run], out, pngs=False, interactive=plotly_available()
    ).html.read_text()  # no PNGs: faster
    assert text.index('class="headline stronger"') < text.index('<h2 id="findings">') < text.index('<h2 id="runs">')
    block = text[text.index('<h2 id="verdict">') : text.index('<h2 id="findings">')]
    assert "4 / 0 / 0" in block and "0 / 0 / 4" in block
    assert f"&gt;= {bound:+.0f} (lower bound: every game won)" in block and "(upper bound: every game lost)" in block
    links = re.findall(r'<a class=pgn href="([^"]+)">([^<]+)</a>', block)
    assert ("games_vs_pretrain.pgn" in {name for _, name in links}) and len(links) == 4
    for href, name in links:
        target = (out.parent / urllib.parse.unquote(href)).resolve()
        assert target.is_file() and target.name == name and not href.startswith("/")
    assert (out.parent / urllib.parse.unquote(links[0][0])).resolve() == (
        verdict_run / "eval" / "games_vs_pretrain.pgn"
    ).resolve()
    assert "strength against Stockfish" not in block  # rated anchors were played: nothing to suggest
    assert text.count("<table") == text.count('<div class="table-wrap"><table')  # every table scrolls inside its panel


def test_verdict_no_measurable_change_and_without_games(no_change_run, healthy_report):
    verdict = run_verdict(load_run(no_change_run))
    start = verdict.opponents[0].result
    assert (start.draws, verdict.tone) == (4, NO_CHANGE) and start.elo.bound is None
    assert verdict.headline.startswith("No measurable change against its start: +0 Elo [")
    assert verdict.headline.endswith("over 4 games (the 95% interval contains 0).")
    assert [o.label for o in verdict.opponents] == ["its start"]
    assert verdict.missing[0][0] == "strength against Stockfish (rated anchors)"
    # No games at all: the verdict says so, what it can instead (held-out, training trend) and how to measure it.
    run, result = healthy_report
    verdict = run_verdict(load_run(run))
    assert verdict.tone == UNMEASURED and verdict.headline.startswith("Strength in games not measured")
    assert [what for what, _ in verdict.missing] == [
        "games against its start",
        "strength against Stockfish (rated anchors)",
    ]
    assert "--anchors " + str(load_run(run).setting("init_checkpoint")) in verdict.missing[0][1]
    text = result.html.read_text()
    assert 'class="headline unmeasured"' in text and "Strength in games not measured" in text
    assert text.index('<h2 id="verdict">') < text.index('<h2 id="findings">')


def test_headline_decided_by_the_interval():
    assert start_headline(EloValue(48.0, 26.0, 70.0, 1000), 1000) == (
        STRONGER,
        "Stronger than its start: +48 Elo [+26, +70] over 1000 games.",
    )
    assert start_headline(EloValue(-48.0, -70.0, -26.0, 1000), 1000) == (
        WEAKER,
        "Weaker than its start: -48 Elo [-70, -26] over 1000 games.",
    )
    tone, text = start_headline(EloValue(10.0, -12.0, 32.0, 400), 400)
    assert tone == NO_CHANGE and text.startswith(
        "No measurable change against its start: +10 Elo [-12, +32] over 400 games"
    )
    tone, text = start_headline(EloValue(-7.0, None, -7.0, 4, "upper"), 4)
    assert (
        tone == WEAKER
        and text == "Weaker than its start: lost all 4 games, so the Elo difference is only an upper bound: <= -7."
    )


def test_games_plot_draws_bounds_as_bounds_with_distinct_ticks(verdict_run, games_run):
    figure = figure_games([load_run(verdict_run)])  # two evaluations at step 16: one point per anchor, not "16 16 16"
    score, elo, _ = figure.panels
    assert score.xticks == (
        [0, 1, 2, 3],
        [str(load_run(verdict_run).setting("init_checkpoint")), "sf-nodes:200", "random", "sf-nodes:1"],
    )
    bounds = {t.label: t.direction for t in elo.traces if t.kind == "bound"}
    start = str(load_run(verdict_run).setting("init_checkpoint"))
    assert bounds == {
        f"{start}: lower bound: every game won": "up",
        "sf-nodes:200: upper bound: every game lost": "down",
        "sf-nodes:1: upper bound: every game lost": "down",
    }  # games_b lost both games to sf-nodes:1 too
    assert [t.label for t in elo.traces if t.kind == "errorbar"] == [
        "random (95%)"
    ]  # a bound is never called an interval
    low, high = y_range(elo)
    assert high - low >= 200
    layout = json.loads(figure.plotly()[1].to_json())["layout"]
    arrows = [a for a in layout["annotations"] if a.get("showarrow")]
    assert sorted(a["ay"] for a in arrows) == [-38, 38, 38]  # up from the lower bound, down from the upper ones
    assert layout["yaxis"]["range"][1] - layout["yaxis"]["range"][0] >= 200
    FigureCanvasAgg(figure.figure).draw()  # the static drawing draws the bounds too
    # Evaluations at steps 0, 8 and 16: ticks at exactly those steps.
    steps = figure_games([load_run(games_run)])
    assert all(integer_ticks(panel) == [0.0, 8.0, 16.0] for panel in steps.panels)
    assert json.loads(steps.plotly()[0].to_json())["layout"]["xaxis"]["tickvals"] == [0.0, 8.0, 16.0]


def test_config_panel_shows_the_model_the_checkpoint_has(lab, tmp_path):
    """config.yaml says value_head: false, but the run starts from a checkpoint with a value head: the panel says what it has."""
    start = save_policy(
        ActionPolicy(PolicyConfig(value_head=True, move_facts=True, repetition=True)),
        tmp_path / "start_with_value_head",
    )
    run = _copy(lab.healthy, tmp_path)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["value_head"] is False
    config["init_checkpoint"] = str(start)
    config["model"]["repetition"] = (
        True  # a move fact set true is not ignored: it is added when the checkpoint lacks it
    )
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    model = model_settings(load_run(run))
    assert model.ignored and model.effective["value_head"] is True and model.source == start / "model_config.json"
    text = build_report([run], pngs=False, interactive=plotly_available()).html.read_text()
    config_part = text[text.index('<h2 id="config">') :]
    row = re.search(r'<tr data-key="value_head">(.*?)</tr>', config_part).group(1)
    assert re.findall(r"<td>(.*?)</td>", row) == ["<code>value_head</code>", "true", "false", "ignored (differs)"]
    assert "value_head: false  # ignored; the model has true" in config_part
    row = re.search(r'<tr data-key="repetition">(.*?)</tr>', config_part).group(1)
    assert re.findall(r"<td>(.*?)</td>", row)[1:] == ["true", "true", "used: added when the checkpoint lacks it"]
    assert re.search(r"^  repetition: true$", config_part, re.MULTILINE)  # no "ignored" comment on it
    # The run's own checkpoint wins once it has one (the model it trained): the healthy run has no value head.
    assert model_settings(load_run(lab.healthy)).effective["value_head"] is False


# ------------------------------------------------------------------------------------------------
# The static report (embedded PNGs)


def test_static_report_embeds_every_figure_and_writes_pngs(healthy_report):
    run, result = healthy_report
    assert not result.interactive
    assert result.html == run / "report.html" and png_directory(result.html) == run / "report"
    assert {p.stem for p in result.pngs} == GRPO_FIGURES and all(p.parent == run / "report" for p in result.pngs)
    _check_embedded_and_files(result.html, result.pngs)
    text = result.html.read_text()
    for section in ("Runs", "Run metadata", "Diagnosis", "Evaluation", "Game strength", "Figures", "Configuration"):
        assert f">{section}</h2>" in text
    assert "learning.too_short" in text  # the findings, with their severity
    for step in (0, 8, 16):  # the evaluation table (value [95% interval])
        assert f"<td class=num>{step}</td>" in text
    assert re.search(r"\d\.\d{4} \[\d\.\d{4}, \d\.\d{4}\]", text)
    assert "No game evaluation in this run directory" in text
    assert 'src="http' not in text and "<script" not in text  # self-contained, nothing to fetch or run


def test_figures_are_labelled_show_intervals_and_keep_legends_off_the_data(lab):
    figures = {f.name: f for f in build_figures([load_run(lab.healthy)])}
    assert set(figures) == GRPO_FIGURES
    for name, figure in figures.items():
        assert figure.figure._suptitle is not None and figure.figure._suptitle.get_text(), name
        FigureCanvasAgg(figure.figure).draw()
        renderer = figure.figure.canvas.get_renderer()
        for ax in figure.figure.axes:
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title(), (name, ax.get_title())
            legend = ax.get_legend()
            assert legend is not None, (name, ax.get_title())
            # below the axes, under the tick labels and the x label: never over the data
            assert legend.get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0, (name, ax.get_title())
    heldout = figures["heldout"].figure.axes
    assert all(ax.containers for ax in heldout)  # error bars on every held-out metric
    reward = figures["reward"].figure.axes[0]
    assert any(isinstance(c, PolyCollection) for c in reward.collections)  # the reward's interval band


def test_constant_panels_are_dropped_and_named(lab, healthy_report):
    """The healthy run's KL coefficient (0.05), learning rate (1e-4, no warmup) and cache hit rate (0, cache off) are constant."""
    run = load_run(lab.healthy)
    assert is_constant(run.series("kl/coef")[1]) and not is_constant(np.array([0.05]))
    plan = plan_figures([run])
    dropped = {d.panel: dict(d.values) for d in plan.dropped}
    assert dropped["KL coefficient (controller output)"] == {"kl/coef": pytest.approx(0.05)}
    assert dropped["learning rate"] == {"lr": pytest.approx(1e-4)}
    assert dropped["evaluation cache hit rate"] == {"perf/cache_hit_rate": 0.0}
    kl = next(f for f in plan.figures if f.name == "kl")
    assert [p.title for p in kl.panels] == [
        "KL to the reference: raw estimate, exact, weighted"
    ]  # the KL itself is kept
    text = healthy_report[1].html.read_text()
    line = re.search(r'<p class=note id="dropped">Constant, not drawn: (.*?)</p>', text).group(1)
    assert "kl/coef = 0.05" in line and "lr = 0.0001" in line and "perf/cache_hit_rate = 0" in line
    # A KL coefficient the adaptive controller moves is drawn; one constant run beside a varying one keeps the panel too.
    adaptive = plan_figures([load_run(lab.adaptive_kl)])
    assert "KL coefficient (controller output)" not in {d.panel for d in adaptive.dropped}
    both = plan_figures([run, load_run(lab.adaptive_kl)])
    kl = next(f for f in both.figures if f.name == "kl")
    assert "KL coefficient (controller output)" in [p.title for p in kl.panels]


def test_pretraining_report_plots_what_exists(lab, tmp_path):
    run = _copy(lab.pretrain, tmp_path)
    result = build_report([run], tmp_path / "out" / "pre.html", interactive=False)
    names = {p.stem for p in result.pngs}
    assert {"pretraining", "entropy", "optimizer", "throughput"} <= names
    assert not names & {"reward", "kl", "ratio", "clip", "signal", "heldout", "games"}
    assert all(p.parent == tmp_path / "out" / "pre" for p in result.pngs)
    _check_embedded_and_files(result.html, result.pngs)
    text = result.html.read_text()
    assert "eval/top1" in text  # the pretraining evaluation table
    assert "<tr><td>kind</td><td>pretrain</td></tr>" in text  # the metadata


def test_report_of_a_run_that_just_started(lab, tmp_path):
    run = tmp_path / "starting"
    run.mkdir()
    shutil.copy(lab.healthy / "config.yaml", run / "config.yaml")
    result = build_report([run])
    assert result.pngs == [] and result.figures == [] and "No metrics to plot yet" in result.html.read_text()
    assert "unknown (no timed metrics row yet)" in result.html.read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        build_report([empty])


# ------------------------------------------------------------------------------------------------
# The interactive report (plotly)


@needs_plotly
def test_comparison_overlays_runs_on_shared_axes(lab, tmp_path, capsys):
    out = tmp_path / "compare.html"
    assert cli.main(["report", str(lab.healthy), str(lab.entropy), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        f"report: {out}" in printed
        and "healthy:" in printed
        and "entropy:" in printed
        and "interactive (plotly)" in printed
    )
    assert "healthy: Strength in games not measured" in printed  # each run's verdict headline
    text = out.read_text()
    assert "Configuration differences" in text and "grpo.entropy_coef" in text
    differences = dict(config_differences([load_run(lab.healthy), load_run(lab.entropy)]))
    assert differences["grpo.entropy_coef"] == [0.0, 4.0] and differences["run.name"] == ["healthy", "entropy"]
    assert "grpo.kl_coef" not in differences
    assert text.count("<img ") == 0 and len(list((tmp_path / "compare").glob("*.png"))) >= 9  # PNGs beside, not inline
    # Every panel of a per-step metric both runs log draws both runs on its one set of axes, one colour per run.
    panels = _panels(text)
    assert len(panels) == len(PLOT_DIV.findall(text)) >= 12
    for title in (
        "reward of the sampled moves",
        "policy entropy against the uniform policy&#x27;s",
        "gradient norm",
        "loss terms (entropy term = -coef x entropy)",
    ):
        panel = next(p for p in panels if p.startswith(f'<div class="panel-title">{title}'))
        assert '"legendgroup":"healthy"' in panel and '"legendgroup":"entropy"' in panel, title
        assert '"color":"#1f77b4"' in panel and '"color":"#ff7f0e"' in panel, title
    figure = next(f for f in plan_figures([load_run(lab.healthy), load_run(lab.entropy)]).figures if f.name == "reward")
    groups = {t.group for t in figure.panels[0].traces if t.label}
    assert groups == {"healthy", "entropy"}


@needs_plotly
def test_games_panel_interactive_with_steps_and_intervals(games_run, tmp_path):
    run = load_run(games_run)
    assert [(e.path.name, e.step) for e in run.games] == [
        ("games_init.json", 0),
        ("games_a.json", 8),
        ("games_b.json", 16),
    ]
    assert "init_checkpoint" in run.games[0].step_source and "checkpoints/step_000008" in run.games[1].step_source
    summary = json.loads((games_run / "eval" / "games_b.json").read_text())
    result = build_report([games_run], tmp_path / "games.html", pngs=False)
    assert result.interactive and result.pngs == [] and "games" in result.figures
    text = result.html.read_text()
    head, body = text.split("</head>", 1)
    assert body.count("Plotly.newPlot(") == len(PLOT_DIV.findall(body)) > 10  # one chart per panel
    assert head.count("<script") == 1 and "/* plotly.js, embedded once" in head  # plotly.js once, inline
    assert not re.search(r"<script[^>]+src=", text) and not re.search(r"https?://", body)  # nothing to fetch
    games = text[text.index('<h2 id="games">') : text.index('<h2 id="figures">')]
    assert 'id="fig-games"' in games and "plot-games-0" in games and "plot-games-1" in games
    for row in summary["anchors"]:  # the table: W/D/L, Wilson score interval, Elo difference per anchor
        score = row["score"]
        assert f"{row['wins']} / {row['draws']} / {row['losses']}" in games
        assert f"{score['value']:.3f} [{score['low']:.3f}, {score['high']:.3f}]" in games
    assert "ML Elo over rated anchors" in games and "CCRL" in games
    for step in (0, 8, 16):
        assert f">{step}</td>" in games
    score_panel = next(p for p in _panels(games) if "score against each anchor" in p)
    assert (
        '"error_y"' in score_panel and "random (95% Wilson)" in score_panel and "sf-nodes:1 (95% Wilson)" in score_panel
    )
    figure = next(f for f in plan_figures([run]).figures if f.name == "games")
    score = figure.panels[0]
    assert all(t.kind == "errorbar" and len(t.x) == 3 for t in score.traces if t.label and "Wilson" in t.label)
    # legends below the data in every chart
    layout = json.loads(figure.plotly()[0].to_json())["layout"]
    assert (
        layout["legend"]["orientation"] == "h"
        and layout["legend"]["yref"] == "container"
        and layout["legend"]["y"] == 0
    )


def test_games_panel_in_the_static_fallback(games_run, tmp_path, monkeypatch):
    monkeypatch.setenv(STATIC_ENV, "1")
    result = build_report([games_run], tmp_path / "static.html")
    assert not result.interactive and "games" in {p.stem for p in result.pngs}
    text = result.html.read_text()
    assert "<script" not in text and 'id="fig-games"' in text
    _check_embedded_and_files(result.html, result.pngs)


def test_without_plotly_the_report_falls_back_to_pngs(lab, tmp_path, monkeypatch):
    """plotly made unimportable (as if not installed): the same call gives the static report; asking for plotly says why not."""
    monkeypatch.delenv(STATIC_ENV, raising=False)
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "plotly", None)
    assert not plotly_available()
    run = _copy(lab.entropy, tmp_path)
    result = build_report([run])
    assert not result.interactive and result.pngs
    _check_embedded_and_files(result.html, result.pngs)
    with pytest.raises(ImportError, match="pip install 'plotly>=5.20'"):
        build_report([run], interactive=True)


def test_run_metadata_recorded_or_unknown(lab, tmp_path):
    run_dir = _copy(lab.healthy, tmp_path)
    # The training loop records where the run came from (run_info.json) ...
    recorded = json.loads((run_dir / "run_info.json").read_text())
    assert recorded["versions"]["torch"] == torch.__version__ and recorded["hardware"]["cpu_count"] == os.cpu_count()
    meta = run_metadata(load_run(run_dir))
    assert meta["metadata file"] == "run_info.json" and "torch " + torch.__version__ in meta["package versions"]
    # ... and a run without one (made before it existed) says unknown.
    (run_dir / "run_info.json").unlink()
    meta = run_metadata(load_run(run_dir))
    assert meta["git commit"] is None and meta["package versions"] is None and meta["metadata file"] is None
    assert re.match(r"[\d.]+ s between the first and last metrics rows \(steps 0-16", meta["wall time"])
    assert meta["kind"] == "move_group (grpo)" and meta["steps"] == "0-16 logged of 16 planned"
    assert meta["device settings (config)"].startswith("device cpu, threads 1")
    text = build_report([run_dir], pngs=False, interactive=False).html.read_text()
    assert (
        "unknown (not recorded in the run directory)" in text and "python-chess" in text
    )  # and the report's own versions
    # What a hand-written run_info.json gives.
    first = load_run(run_dir).rows[0]["time"]
    (run_dir / "run_info.json").write_text(
        json.dumps(
            {
                "git_commit": "0123456789abcdef",
                "git_dirty": True,
                "versions": {"torch": "2.13.0", "chessgrpo": "0.1.0", "chess": "1.11.2"},
                "python": "3.11.7",
                "hardware": {"cpu_model": "AMD EPYC", "cpu_count": 2, "gpu": "NVIDIA H100"},
                "started": first - 30.0,
            }
        )
    )
    meta = run_metadata(load_run(run_dir))
    assert meta["git commit"] == "0123456789abcdef (uncommitted changes)"
    assert meta["package versions"] == "chessgrpo 0.1.0, torch 2.13.0, python-chess 1.11.2"
    assert meta["hardware"] == "CPU AMD EPYC x 2 cores; GPU NVIDIA H100" and meta["metadata file"] == "run_info.json"
    assert meta["wall time"].endswith("(run start to the last metrics row)")


# ------------------------------------------------------------------------------------------------
# In a browser


@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(healthy_report):
    _, result = healthy_report
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "check_report.py"), str(result.html)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(result.pngs)} images in the browser" in done.stdout and "OK: every image loaded" in done.stdout


def _chromium(*args: str) -> subprocess.CompletedProcess:
    command = [
        BROWSER,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--virtual-time-budget=15000",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


@needs_plotly
@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")
def test_interactive_report_screenshot_in_headless_chromium(verdict_run, tmp_path):
    """The report's first screen (1400x900) answers "did it get stronger"; its PGN links open; no table overflows."""
    from PIL import Image

    result = build_report([verdict_run], tmp_path / "report.html", pngs=False)
    text = result.html.read_text()
    divs = PLOT_DIV.findall(text)
    assert 'id="fig-games"' in text and "plot-games-0" in divs and len(divs) > 10
    shot = tmp_path / "report.png"
    done = _chromium(f"--screenshot={shot}", "--window-size=1400,900", result.html.as_uri())
    assert shot.is_file() and shot.stat().st_size > 20_000, done.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (900, 1400)
    assert pixels.std() > 10 and len(np.unique(pixels)) > 50  # text and tables: not one colour
    # In the browser (scripts/check_report.py, at 1400x900): every plotly chart drew its SVG (plotly.js embedded,
    # offline), the verdict's headline ends on the first screen, every PGN link opens a file, no table overflows its panel.
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "check_report.py"), str(result.html), "--window", "1400x900"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = re.search(r"verdict \((\w+)\): '(.*)', at (\d+)-(\d+) px", done.stdout)
    assert (
        verdict
        and verdict.group(1) == "stronger"
        and verdict.group(2).startswith("Stronger than its start: won all 4 games")
    )
    assert int(verdict.group(4)) <= 900
    links = text.count("<a class=pgn ")
    assert links == 6  # the verdict's 4 opponents and the game-strength table's 2 files
    assert (
        f"PGN links: {links}, every one to an existing file" in done.stdout
        and f"{len(divs)} interactive charts drawn" in done.stdout
    )
    # Squeezed narrower than the tables (600 px), they scroll inside their wrappers instead of sticking out.
    scrolling = re.search(
        r"tables: (\d+), \d+ scrolling inside their panel \((\d+) when the page is squeezed", done.stdout
    )
    assert scrolling and int(scrolling.group(1)) == text.count("<table") and int(scrolling.group(2)) > 0
    print(f"screenshot: {shot}")
