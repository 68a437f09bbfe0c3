"""The report's last sections, where the runs came from: the runs table (kind, steps, last row written), their
metadata (git commit, package versions, hardware, wall time: what the run directory records, beside what generated
the report) and their configuration (the model as saved with its weights beside config.yaml's model section, and the
resolved config of one run or the differences between several)."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from chessgrpo.board.move_facts import FACT_CONFIG_KEYS
from chessgrpo.run_info import cpu_model, package_version, source_commit
from chessgrpo.track.report_sections import escape
from chessgrpo.track.run_data import RunData, effective_model_config

ABSENT = "(absent)"
"""What `config_differences` reports for a key a run's config does not have."""


def runs_section(runs: Sequence[RunData]) -> str:
    header = (
        "<table><tr><th>run</th><th>directory</th><th>kind</th><th>rows</th><th>steps logged</th><th>planned steps</th>"
        "<th>last row written</th></tr>"
    )
    lines = [header]
    for run in runs:
        steps = [row["step"] for row in run.rows]
        times = [row["time"] for row in run.rows if isinstance(row.get("time"), (int, float))]
        last = datetime.datetime.fromtimestamp(max(times)).astimezone().strftime("%Y-%m-%d %H:%M:%S") if times else "-"
        planned = run.setting("steps", "-")
        span = f"{steps[0]}-{steps[-1]}" if steps else "none yet"
        lines.append(
            f"<tr><td>{escape(run.name)}</td><td><code>{escape(run.path)}</code></td><td>{escape(run.kind)}</td>"
            f"<td class=num>{len(run.rows)}</td><td class=num>{escape(span)}</td><td class=num>{escape(planned)}</td>"
            f"<td>{escape(last)}</td></tr>"
        )
    lines.append("</table>")
    return "\n".join(lines)


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def duration_text(seconds: float) -> str:
    """1 h 02 min 03 s, 4 min 05 s, 6.2 s."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min {secs:02d} s" if hours else f"{minutes} min {secs:02d} s"


def _info_value(run: RunData, *paths: str) -> Any:
    """The first present value among dotted paths into the run's metadata file, then its config."""
    for source in (run.info, run.config):
        for dotted in paths:
            node: Any = source
            for part in dotted.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if node not in (None, "", {}, []):
                return node
    return None


def _started(run: RunData) -> float | None:
    value = _info_value(run, "started", "start_time", "time")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def run_metadata(run: RunData) -> dict[str, str | None]:
    """What the run directory records about the run: field -> text, None where nothing is recorded."""
    times = [row["time"] for row in run.rows if isinstance(row.get("time"), (int, float))]
    steps = [row["step"] for row in run.rows]
    config_kind = run.config.get("kind")
    kind = f"{config_kind} ({run.kind})" if config_kind and config_kind != run.kind else run.kind
    planned = run.setting("steps")
    logged = f"{min(steps)}-{max(steps)}" if steps else "none yet"
    meta: dict[str, str | None] = {
        "kind": kind,
        "steps": f"{logged} logged" + (f" of {planned} planned" if planned else ""),
    }
    started = _started(run)
    if times:
        first, last = min(times), max(times)
        if started is not None and started <= first:
            meta["wall time"] = f"{duration_text(last - started)} (run start to the last metrics row)"
        else:
            meta["wall time"] = (
                f"{duration_text(last - first)} between the first and last metrics rows (steps "
                f"{steps[0]}-{steps[-1]}; time before the first row not counted)"
            )
        meta["first / last metrics row"] = f"{_when(first)} / {_when(last)}"
    else:
        meta["wall time"] = None
        meta["first / last metrics row"] = None
    commit = _info_value(run, "git_commit", "git.commit", "commit", "run.git_commit", "meta.git_commit")
    if commit is None:
        commit = next(
            (row[k] for row in run.rows for k in ("git_commit", "meta/git_commit") if isinstance(row.get(k), str)), None
        )
    dirty = _info_value(run, "git_dirty", "git.dirty")
    meta["git commit"] = None if commit is None else f"{commit}{' (uncommitted changes)' if dirty is True else ''}"
    versions = _info_value(run, "versions", "packages")
    if isinstance(versions, dict):
        wanted = ["chessgrpo", "torch", "chess", "python-chess"]
        ordered = [k for k in wanted if k in versions] + sorted(k for k in versions if k not in wanted)
        meta["package versions"] = ", ".join(f"{'python-chess' if k == 'chess' else k} {versions[k]}" for k in ordered)
    else:
        meta["package versions"] = None
    python = _info_value(run, "python", "python_version")
    meta["python"] = str(python).split()[0] if python else None
    hardware = _info_value(run, "hardware")
    parts = []
    if isinstance(hardware, dict):
        cpu = hardware.get("cpu_model") or hardware.get("cpu")
        count = hardware.get("cpu_count")
        if cpu or count:
            parts.append(f"CPU {cpu or '?'}" + (f" x {count} cores" if count else ""))
        gpu = hardware.get("gpu") or hardware.get("gpus")
        if gpu:
            parts.append(f"GPU {', '.join(map(str, gpu)) if isinstance(gpu, list) else gpu}")
        if hardware.get("memory_gb"):
            parts.append(f"{hardware['memory_gb']} GB memory")
    host = _info_value(run, "hostname", "host")
    if host:
        parts.append(f"host {host}")
    meta["hardware"] = "; ".join(parts) or None
    device = run.setting("device")
    settings = [f"device {device}"] if device else []
    if run.setting("threads") is not None:
        settings.append(
            f"threads {run.setting('threads')}" + (" (0 = all cores)" if run.setting("threads") == 0 else "")
        )
    if run.setting("bf16") is not None:
        settings.append(f"bf16 {str(run.setting('bf16')).lower()}")
    if isinstance(run.setting("engine.processes"), int):
        settings.append(f"engine processes {run.setting('engine.processes')}")
    meta["device settings (config)"] = ", ".join(settings) or None
    meta["metadata file"] = str(run.info_path.name) if run.info_path is not None else None
    return meta


_UNKNOWN = {
    "git commit": "unknown (not recorded in the run directory)",
    "package versions": "not recorded in the run directory",
    "python": "not recorded",
    "hardware": "not recorded in the run directory (see the device settings)",
    "metadata file": "none (no run_info.json; the training loop does not write one yet)",
    "wall time": "unknown (no timed metrics row yet)",
    "first / last metrics row": "-",
    "device settings (config)": "-",
}


def report_environment() -> dict[str, str]:
    """The code and machine that generate the report (not necessarily the run's)."""
    versions = ", ".join(
        f"{label} {package_version(name)}"
        for label, name in (
            ("chessgrpo", "chessgrpo"),
            ("torch", "torch"),
            ("python-chess", "chess"),
            ("plotly", "plotly"),
            ("matplotlib", "matplotlib"),
        )
    )
    return {
        "chessgrpo source commit": source_commit(),
        "package versions": versions,
        "python": platform.python_version() + f" ({sys.implementation.name})",
        "hardware": f"CPU {cpu_model()} x {os.cpu_count() or '?'} cores; {platform.system()} {platform.release()}",
    }


def metadata_section(runs: Sequence[RunData]) -> str:
    metas = [run_metadata(run) for run in runs]
    header = "".join(f"<th>{escape(run.name)}</th>" for run in runs)
    lines = [f"<table><tr><th>recorded for the run</th>{header}</tr>"]
    for field in metas[0]:
        cells = []
        for meta in metas:
            value = meta.get(field)
            cells.append(
                f"<td>{escape(value)}</td>"
                if value is not None
                else f"<td class=unknown>{escape(_UNKNOWN.get(field, 'unknown'))}</td>"
            )
        lines.append(f"<tr><td>{escape(field)}</td>{''.join(cells)}</tr>")
    lines.append("</table>")
    environment = report_environment()
    lines.append(
        "<table><tr><th>this report was generated with</th><th>(not necessarily the run's code or machine)</th></tr>"
    )
    lines += [f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in environment.items()]
    lines.append(
        "</table><p class=note>Git commit, versions and hardware of a run come from a metadata file in the run "
        "directory (run_info.json; docs/report.md gives its fields) or its config; the wall time from the "
        "metrics rows' timestamps.</p>"
    )
    return "\n".join(lines)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(_flatten(value, name))
        else:
            flat[name] = value
    return flat


def config_differences(runs: Sequence[RunData]) -> list[tuple[str, list[Any]]]:
    """(dotted key, value per run) for every key whose value differs between the runs (`ABSENT` where a run lacks it)."""
    flats = [_flatten(run.config) for run in runs]
    keys = sorted(set().union(*flats))
    rows = []
    for key in keys:
        values = [flat.get(key, ABSENT) for flat in flats]
        if any(v != values[0] for v in values[1:]):
            rows.append((key, values))
    return rows


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The policy's shape as the run has it: config.yaml's model section beside the saved checkpoint's config."""

    source: Path
    """The model_config.json the effective values come from."""
    configured: dict[str, Any]
    """The run's config.yaml model section."""
    effective: dict[str, Any]
    """The checkpoint's saved policy config."""
    ignored: bool
    """Whether the model section is ignored (init_checkpoint is set: the run takes the checkpoint's shape)."""


def model_settings(run: RunData) -> ModelSettings | None:
    """What the run's model actually has (`run_data.effective_model_config`), or None for a run without a policy checkpoint."""
    found = effective_model_config(run)
    configured = run.config.get("model")
    if found is None or not isinstance(configured, dict):
        return None
    effective, source = found
    return ModelSettings(source, configured, effective, bool(run.setting("init_checkpoint")))


def _model_table(model: ModelSettings) -> str:
    why = (
        "init_checkpoint is set, so the run takes the checkpoint's shape and ignores config.yaml's model section, "
        "except move facts set true (added to a checkpoint that lacks them)"
        if model.ignored
        else "config.yaml's model section as built (sizes resolved)"
    )
    rows = [
        f"<p>The model as saved with its weights (<code>{escape(model.source)}</code>): {escape(why)}.</p>",
        "<table class=model-table><tr><th>model key</th><th>the model has</th><th>config.yaml says</th><th></th></tr>",
    ]
    for key in dict.fromkeys([*model.effective, *model.configured]):
        has, says = model.effective.get(key, ABSENT), model.configured.get(key, ABSENT)
        if model.ignored and _adds_fact(key, says):
            mark = "used: added when the checkpoint lacks it" if has is True else "ignored (differs)"
        elif model.ignored:
            mark = "ignored" + (" (differs)" if has != says and says is not None and says != ABSENT else "")
        else:
            mark = "" if has == says or says is None else "resolved"
        rows.append(
            f'<tr data-key="{escape(key)}"><td><code>{escape(key)}</code></td><td>{escape(_yaml_value(has))}</td>'
            f"<td>{escape(_yaml_value(says))}</td><td>{escape(mark)}</td></tr>"
        )
    rows.append("</table>")
    return "\n".join(rows)


def _adds_fact(key: str, says: Any) -> bool:
    """Whether a model key set so counts beside an init_checkpoint: a move fact set true is added to a checkpoint
    that lacks it (`models.add_facts`)."""
    return key in FACT_CONFIG_KEYS and says is True


def _yaml_value(value: Any) -> str:
    if value is ABSENT:
        return ABSENT
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _mark_ignored(text: str, model: ModelSettings) -> str:
    """The YAML dump with a comment on each model-section key that the run does not use (init_checkpoint is set)."""
    if not model.ignored:
        return text
    lines, inside = [], False
    for line in text.splitlines():
        if not line.startswith(" "):
            inside = line.startswith("model:")
            if inside:
                line += (
                    "  # ignored: init_checkpoint is set (the model is the checkpoint's, table above), "
                    "but for move facts set true: those the checkpoint lacks are added"
                )
        elif inside and re.match(r"^  ([A-Za-z_]\w*):", line):
            key = line.split(":", 1)[0].strip()
            says = line.split(":", 1)[1].strip()
            if key in model.effective and not (_adds_fact(key, model.configured.get(key)) and says == "true"):
                line += f"  # ignored; the model has {_yaml_value(model.effective[key])}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def config_section(runs: Sequence[RunData]) -> str:
    if len(runs) == 1:
        run = runs[0]
        if not run.config:
            return "<p>No config.yaml in the run directory.</p>"
        model = model_settings(run)
        text = yaml.safe_dump(run.config, sort_keys=False)
        if model is None:
            return f"<details open><summary>resolved config (RUN_DIR/config.yaml)</summary><pre>{escape(text)}</pre></details>"
        return (
            _model_table(model) + "<details open><summary>resolved config (RUN_DIR/config.yaml; the model section's "
            f"ignored keys are marked)</summary><pre>{escape(_mark_ignored(text, model))}</pre></details>"
        )
    differences = config_differences(runs)
    if not differences:
        return "<p>The runs' configs are identical.</p>"
    header = "".join(f"<th>{escape(run.name)}</th>" for run in runs)
    rows = "".join(
        f"<tr><td><code>{escape(key)}</code></td>"
        + "".join(f"<td>{escape('null' if v is None else v)}</td>" for v in values)
        + "</tr>"
        for key, values in differences
    )
    return (
        f"<table><tr><th>key</th>{header}</tr>{rows}</table><p class=note>Only keys whose values differ are listed.</p>"
    )
