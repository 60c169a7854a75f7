"""Markdown reports and PNG plots for eval runs, run comparisons and reward ablations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from turngym.episode import Episode


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fmt(m: Any) -> str:
    if isinstance(m, dict) and "value" in m:
        lo, hi = m["ci95"]
        return f"{m['value']:.3f} [{lo:.3f}, {hi:.3f}]"
    if isinstance(m, float):
        return f"{m:.3f}"
    return str(m)


def render_eval_report(results: dict[str, Any], episodes: Sequence[Episode], out: Path) -> Path:
    plt = _plt()
    metrics = results["metrics"]
    names = [k for k, v in metrics.items() if isinstance(v, dict) and "value" in v]
    if names:
        fig, ax = plt.subplots(figsize=(max(3, 1.2 * len(names)), 3))
        vals = [metrics[n]["value"] for n in names]
        err = [[v - metrics[n]["ci95"][0] for n, v in zip(names, vals)], [metrics[n]["ci95"][1] - v for n, v in zip(names, vals)]]
        ax.bar(names, vals, yerr=err, capsize=4, color="#4c72b0")
        ax.set_ylim(0, 1)
        ax.set_title(f"{results['env']} · {results['model']}", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "metrics.png", dpi=110)
        plt.close(fig)
    if episodes:
        fig, axes = plt.subplots(1, 2, figsize=(7, 2.8))
        turns = [len(e.turns) for e in episodes]
        axes[0].hist(turns, bins=range(1, max(turns) + 2), align="left", color="#55a868")
        axes[0].set_xlabel("turns per episode")
        axes[1].hist([e.meta.get("wall_ms", 0.0) / 1000 for e in episodes], bins=20, color="#c44e52")
        axes[1].set_xlabel("episode wall time (s)")
        fig.tight_layout()
        fig.savefig(out / "behaviour.png", dpi=110)
        plt.close(fig)
    sub = results["subset"]
    lines = [
        f"# Evaluation: {results['env']}",
        "",
        f"- model: `{results['model']}`; k = {results['k']}; sampling: {results['sampling']}",
        f"- subset: dataset `{sub.get('dataset')}` split `{sub.get('split', '')}`, {sub.get('count', len(sub.get('indices', [])))} items"
        f" from `{sub.get('source', '')}` (sha256 `{str(sub.get('sha256', ''))[:16]}`); item ids in `results.json`",
        f"- episodes: {results['episodes']}; turngym {results['turngym']}",
        "",
        "| metric | value [95% CI] |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in metrics.items()]
    beh = results["behaviour"]
    lines += ["", "| behaviour | value |", "| --- | --- |"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in beh.items() if k != "latency_ms"]
    lines += [f"| latency {k} (ms) | {v:.1f} |" for k, v in beh.get("latency_ms", {}).items()]
    if len([k for k in results["per_dataset"] if not k.startswith("_")]) > 1:
        lines += ["", "## Per dataset", "", "| dataset | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for ds, m in results["per_dataset"].items():
            lines.append(f"| {ds} | " + " | ".join(_fmt(m.get(n, "")) for n in names) + " |")
    if "bfcl" in results:
        lines += bfcl_lines(results["bfcl"])
    lines += ["", "![metrics](metrics.png)", "", "![behaviour](behaviour.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def bfcl_lines(b: dict[str, Any]) -> list[str]:
    """The BFCL section: accuracy per category, V4 group scores and the weighted overall."""
    lines = ["", "## BFCL", "", "| category | accuracy [95% CI] | episodes |", "| --- | --- | --- |"]
    lines += [f"| {c} | {_fmt(m)} | {b['episodes_per_category'].get(c, '')} |" for c, m in b["per_category"].items()]
    lines += ["", "| V4 group (weight) | score |", "| --- | --- |"]
    from turngym.evals.bfcl_score import V4_WEIGHTS

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
        cells = [_fmt(r["metrics"].get(n, "–")) for n in names]
        items = r["subset"].get("count", len(r["subset"].get("indices", [])))
        lines.append(f"| {name} | {r['env']} | {r['model']} | {items} | {r['k']} | "
                     + " | ".join(cells) + f" | {turns:.2f} |")
    if names:
        fig, ax = plt.subplots(figsize=(max(4, 1.5 * len(names) * len(runs) / 2), 3))
        width = 0.8 / len(runs)
        for i, (name, r) in enumerate(runs):
            xs = [j + i * width for j in range(len(names))]
            vals = [r["metrics"].get(n, {}).get("value", 0.0) for n in names]
            ax.bar(xs, vals, width=width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
        ax.legend(fontsize=7)
        fig.tight_layout()
        png = out.with_suffix(".png")
        fig.savefig(png, dpi=110)
        plt.close(fig)
        lines += ["", f"![comparison]({png.name})"]
    bfcl_runs = [(name, r) for name, r in runs if "bfcl" in r]
    if bfcl_runs:  # BFCL is scored over categories, which are usually separate runs: combine them
        from turngym.evals.bfcl_score import v4_summary

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


def credit_heatmap(rewards: dict[str, list[list[float]]], out: Path, max_rows: int = 32) -> None:
    """Per-turn credit maps: one panel per reward wrapper, rows are episodes, columns turns."""
    import numpy as np

    plt = _plt()
    names = list(rewards)
    width = max((len(r) for rs in rewards.values() for r in rs), default=1)
    fig, axes = plt.subplots(1, len(names), figsize=(2.2 * len(names) + 1, 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        rows = rewards[name][:max_rows]
        grid = np.full((len(rows), width), np.nan)
        for i, r in enumerate(rows):
            grid[i, : len(r)] = r
        lim = np.nanmax(np.abs(grid)) if np.isfinite(grid).any() else 1.0
        ax.imshow(grid, aspect="auto", cmap="coolwarm", vmin=-lim or -1, vmax=lim or 1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("turn")
    axes[0][0].set_ylabel("episode")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
