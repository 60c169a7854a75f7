"""Markdown reports and PNG plots for eval runs, run comparisons and reward ablations."""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from turngym.episode import Episode


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def format_metric(m: Any) -> str:
    """A metric as report.md shows it: value and 95% interval, or the reason there is no interval (small n)."""
    if isinstance(m, dict) and "value" in m:
        lo, hi = m["ci95"]
        if not (math.isfinite(m["value"])):
            return "– (no data)"
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return f"{m['value']:.3f} ({m.get('ci', 'no interval')})"
        return f"{m['value']:.3f} [{lo:.3f}, {hi:.3f}]"
    if isinstance(m, float):
        return f"{m:.3f}"
    return str(m)


def model_name(model: str) -> str:
    """The model as a reader knows it: ``default`` is shown by what it is."""
    from turngym.agents.loading import DEFAULT_MODEL, DEFAULT_MODEL_DESCRIPTION

    return DEFAULT_MODEL_DESCRIPTION if model == DEFAULT_MODEL else model


def rate_bars(ax: Any, metric_names: Sequence[str], runs: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Grouped bars of rates in [0, 1] with their 95% intervals and value labels.

    A zero value still shows (a dash at 0 in the bar's colour, the axis starts just below 0);
    a metric without an interval gets no error bar and says so in its label.
    """
    from matplotlib.patches import Patch

    width = 0.8 / max(1, len(runs))
    colours = [f"C{i % 10}" for i in range(len(runs))]
    crowded = len(runs) * len(metric_names) > 8
    for i, (_label, metrics) in enumerate(runs):
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(metric_names))]
        for x, name in zip(xs, metric_names, strict=True):
            m = metrics.get(name)
            if not isinstance(m, dict) or not math.isfinite(m.get("value", math.nan)):
                continue
            v = float(m["value"])
            lo, hi = m["ci95"]
            has_ci = math.isfinite(lo) and math.isfinite(hi)
            ax.bar(x, v, width=width * 0.9, color=colours[i], alpha=0.85, edgecolor="black", linewidth=0.6)
            ax.plot([x - width * 0.4, x + width * 0.4], [v, v], color=colours[i], linewidth=2.5, solid_capstyle="butt")
            top = v
            if has_ci:
                err = [[max(0.0, v - lo)], [max(0.0, hi - v)]]
                ax.errorbar(x, v, yerr=err, fmt="none", ecolor="black", capsize=3, linewidth=0.9)
                top = max(v, hi)
            text = f"{v:.3f}" if has_ci else f"{v:.3f}\n(no CI)"
            ax.annotate(text, (x, top), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                        fontsize=6.5, rotation=90 if crowded else 0)
    ax.set_xticks(range(len(metric_names)), metric_names, rotation=30 if len(metric_names) > 4 else 0,
                  ha="right" if len(metric_names) > 4 else "center")
    ax.set_xlim(-0.6, len(metric_names) - 0.4)
    ax.set_ylim(-0.03, 1.32 if crowded else 1.15)
    ax.set_yticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.axhline(0, color="grey", linewidth=0.6)
    ax.set_ylabel("value (bars: 95% CI)")
    if len(runs) > 1:
        handles = [Patch(color=c, label=n) for c, (n, _) in zip(colours, runs, strict=True)]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _subset_line(sub: dict[str, Any]) -> str:
    """The evaluated subset, naming only the fields the run recorded."""
    count = sub.get("count", len(sub.get("indices", [])))
    parts = [f"{count} items"]
    if sub.get("dataset"):
        parts.append(f"dataset `{sub['dataset']}`")
    if sub.get("split"):
        parts.append(f"split `{sub['split']}`")
    if sub.get("source"):
        parts.append(f"from `{sub['source']}`")
    if sub.get("sha256"):
        parts.append(f"sha256 `{str(sub['sha256'])[:16]}`")
    ids = "item ids" if sub.get("item_ids") else "indices"
    return "- subset: " + ", ".join(parts) + f"; {ids} in `results.json`"


def render_eval_report(results: dict[str, Any], episodes: Sequence[Episode], out: Path) -> Path:
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    metrics = results["metrics"]
    model = model_name(results["model"])
    names = [k for k, v in metrics.items() if isinstance(v, dict) and "value" in v]
    if names:
        fig, ax = plt.subplots(figsize=(max(4.5, 0.9 * len(names) + 1.5), 3.4))
        rate_bars(ax, names, [(model, metrics)])
        ax.set_title("\n".join([results["env"], *textwrap.wrap(model, 60)]), fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "metrics.png", dpi=110)
        plt.close(fig)
    if episodes:
        fig, axes = plt.subplots(1, 2, figsize=(7, 2.8))
        turns = [len(e.turns) for e in episodes]
        lo, hi = min(turns), max(turns)
        axes[0].hist(turns, bins=range(lo, hi + 2), align="left", rwidth=0.8, color="#55a868", edgecolor="black",
                     linewidth=0.5)
        axes[0].set_xlim(lo - 0.7, hi + 0.7)
        axes[0].set_xlabel("turns per episode")
        axes[1].hist([e.meta.get("wall_ms", 0.0) / 1000 for e in episodes], bins=20, color="#c44e52")
        axes[1].set_xlabel("episode wall time (s)")
        for ax in axes:
            ax.set_ylabel("episodes")
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if hi - lo <= 15:
            axes[0].set_xticks(range(lo, hi + 1))
        else:
            axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        fig.savefig(out / "behaviour.png", dpi=110)
        plt.close(fig)
    lines = [
        f"# Evaluation: {results['env']}",
        "",
        f"- model: `{model}`; k = {results['k']}; sampling: {results['sampling']}",
        _subset_line(results["subset"]),
        f"- episodes: {results['episodes']}; turngym {results['turngym']}",
        *([f"- **ungraded: {results['ungraded']}** episodes whose grader itself failed (no answer caused it; "
           "`outcome.grading` says how; a refused or timed-out answer is wrong): left out of every rate above"]
          if results.get("ungraded") else []),
    ]
    if (out / "view.html").exists():
        lines.append("- browse the episodes turn by turn: [view.html](view.html)")
    lines += [
        "",
        "| metric | value [95% CI] | interval |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {k} | {format_metric(v)} | {v.get('ci', '') if isinstance(v, dict) else ''} |" for k, v in metrics.items()]
    beh = results["behaviour"]
    lines += ["", "| behaviour | value |", "| --- | --- |"]
    lines += [f"| {k} | {format_metric(v)} |" for k, v in beh.items() if k != "latency_ms"]
    lines += [f"| latency {k} (ms) | {v:.1f} |" for k, v in beh.get("latency_ms", {}).items()]
    if len([k for k in results["per_dataset"] if not k.startswith("_")]) > 1:
        lines += ["", "## Per dataset", "", "| dataset | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for ds, m in results["per_dataset"].items():
            lines.append(f"| {ds} | " + " | ".join(format_metric(m.get(n, "")) for n in names) + " |")
    if "bfcl" in results:
        lines += bfcl_lines(results["bfcl"])
    lines += ["", ("Intervals: the unit is the task when any task has several samples, else the episode; "
                   "Wilson for metrics that score each unit 0 or 1, BCa bootstrap for fractional ones; "
                   "none where the sample has no spread (turngym docs/viewer.md)."), ""]
    if names:
        lines += ["![metrics](metrics.png)", ""]
    if episodes:
        lines += ["![behaviour](behaviour.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def bfcl_lines(b: dict[str, Any]) -> list[str]:
    """The BFCL section: accuracy per category, V4 group scores and the weighted overall."""
    lines = ["", "## BFCL", "", "| category | accuracy [95% CI] | episodes |", "| --- | --- | --- |"]
    lines += [f"| {c} | {format_metric(m)} | {b['episodes_per_category'].get(c, '')} |" for c, m in b["per_category"].items()]
    lines += ["", "| V4 group (weight) | score |", "| --- | --- |"]
    from turngym.envs.bfcl.score import V4_WEIGHTS

    lines += [f"| {g} ({V4_WEIGHTS.get(g, '')}%) | {v:.3f} |" for g, v in b["groups"].items()]
    lines += [f"| **overall (V4 weights)** | **{b['overall_v4']:.3f}** |", "",
              f"Not evaluated (count as 0): {', '.join(b['missing']) or 'none'}."
              + (f" Subsets: {b['partial_categories']}." if b.get("partial_categories") else ""), "", b["note"] + "."]
    return lines


def compare_runs(dirs: Sequence[str | Path], out: str | Path) -> Path:
    """``turngym report``: one table and one chart across several eval output folders."""
    plt = _plt()
    runs = []
    for d in dirs:
        p = Path(d) / "results.json"
        if not p.is_file():
            raise FileNotFoundError(f"no results.json in {d} (run `turngym eval --out {d}` first)")
        runs.append((Path(d).name, json.loads(p.read_text())))
    names = sorted({k for _, r in runs for k, v in r["metrics"].items() if isinstance(v, dict) and "value" in v})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Runs side by side", "", "| run | env | model | items | k | " + " | ".join(names) + " | turns/ep |",
             "|---" * (6 + len(names)) + "|"]
    for name, r in runs:
        turns = r["behaviour"].get("turns_per_episode", {}).get("value", float("nan"))
        cells = [format_metric(r["metrics"].get(n, "–")) for n in names]
        items = r["subset"].get("count", len(r["subset"].get("indices", [])))
        lines.append(f"| {name} | {r['env']} | {model_name(r['model'])} | {items} | {r['k']} | "
                     + " | ".join(cells) + f" | {turns:.2f} |")
    if names:
        fig, ax = plt.subplots(figsize=(max(4.5, 0.6 * len(names) * max(2, len(runs)) + 2.5), 3.4))
        rate_bars(ax, names, [(name, r["metrics"]) for name, r in runs])
        fig.tight_layout()
        png = out.with_suffix(".png")
        fig.savefig(png, dpi=110)
        plt.close(fig)
        lines += ["", f"![comparison]({png.name})"]
    bfcl_runs = [(name, r) for name, r in runs if "bfcl" in r]
    if bfcl_runs:  # BFCL is scored over categories, which are usually separate runs: combine them
        from turngym.envs.bfcl.score import v4_summary

        per_cat: dict[str, Any] = {}
        counts: dict[str, int] = {}
        for _, r in bfcl_runs:
            per_cat.update(r["bfcl"]["per_category"])
            counts.update(r["bfcl"]["episodes_per_category"])
        summary = v4_summary({c: m["value"] for c, m in per_cat.items()})
        lines += bfcl_lines({"per_category": per_cat, "episodes_per_category": counts, **summary,
                             "partial_categories": {}, "note": bfcl_runs[0][1]["bfcl"]["note"]})
    out.write_text("\n".join(lines) + "\n")
    return out


def integer_ticks(count: int, most: int) -> list[int]:
    """At most ``most`` whole-number ticks from 1 to ``count`` (both shown), evenly stepped."""
    step = max(1, math.ceil(count / most))
    ticks = list(range(1, count + 1, step))
    if count - ticks[-1] > step // 2 and len(ticks) < most:  # the last index, unless it would crowd its neighbour
        ticks.append(count)
    return ticks


def credit_heatmap(rewards: dict[str, list[list[float]]], out: Path, max_rows: int = 32) -> None:
    """Write :func:`credit_figure` to ``out``."""
    plt = _plt()
    fig = credit_figure(rewards, max_rows)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def credit_figure(rewards: dict[str, list[list[float]]], max_rows: int = 32) -> Any:
    """Per-turn credit maps: one panel per reward (rows: episodes, columns: turns, both numbered
    from 1, whole-number ticks), all on one diverging scale centred on 0 with one labelled colour bar.
    Only the first ``max_rows`` episodes fit; the figure title says so when there are more."""
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    plt = _plt()
    names = list(rewards)
    width = max((len(r) for rs in rewards.values() for r in rs), default=1) or 1
    grids = {}
    for name in names:
        rows = rewards[name][:max_rows]
        grid = np.full((max(1, len(rows)), width), np.nan)
        for i, r in enumerate(rows):
            grid[i, : len(r)] = r
        grids[name] = grid
    finite = [np.abs(g[np.isfinite(g)]) for g in grids.values()]
    lim = max((float(f.max()) for f in finite if f.size), default=0.0) or 1.0
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad=(0, 0, 0, 0))
    fig, axes = plt.subplots(1, len(names), figsize=(2.3 * len(names) + 2.0, 4), squeeze=False, layout="constrained")
    image = None
    for ax, name in zip(axes[0], names, strict=True):
        grid = grids[name]
        extent = (0.5, width + 0.5, grid.shape[0] + 0.5, 0.5)
        ax.add_patch(Rectangle((0.5, 0.5), width, grid.shape[0], hatch="///", fill=False, edgecolor="#bbbbbb",
                               linewidth=0, zorder=0))
        image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, norm=norm, interpolation="nearest",
                          extent=extent, zorder=1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("turn")
        ax.set_xticks(integer_ticks(width, 8))
        ax.set_yticks(integer_ticks(grid.shape[0], 10))
    axes[0][0].set_ylabel("episode")
    total = max((len(rs) for rs in rewards.values()), default=0)
    if total > max_rows:
        fig.suptitle(f"first {max_rows} of {total} episodes shown", fontsize=9)
    if image is not None:
        bar = fig.colorbar(image, ax=axes[0].tolist(), shrink=0.85)
        bar.set_label("per-turn reward (one scale; hatched: no turn)", fontsize=8)
    return fig
