"""``turngym view``: one self-contained HTML file to read saved episodes next to the credit each reward gave them.

The page needs no network and no server (it opens from disk): the episodes, the per-turn
rewards and advantages, and the token pieces are embedded as one JSON block that vanilla
JavaScript renders a page at a time, so 10,000 episodes open and filter in seconds.

Where the data comes from:
- episodes: a turngym episodes JSONL file (``Episode.group`` groups them by query);
- per-turn rewards: ``scores.jsonl`` in an ablation folder (``turngym ablate`` writes it) or any
  file in that format (``turngym.training.scores``); advantages as stored there, or computed per
  group when a record names its estimator;
- token view: the episode's own ids, decoded with the tokenizer of the model named in
  ``Episode.meta["model"]`` when it loads offline and its fingerprint matches the one recorded
  with the ids (``Episode.meta["tokenizer"]``), else shown as ids (the page says why);
- answer clusters: the group's final answers clustered by the env family's key-based offline
  equivalence (normalised text for QA and math, canonical calls for BFCL); A is the largest.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from turngym._version import __version__
from turngym.episode import Episode
from turngym.episode.reader import read_episodes
from turngym.training.scores import ScoreRecord, beyond_rewards, read_scores

TRUNCATION_MARKERS = ("[output truncated]",)  # what the envs append when they cut a tool output
OUTCOME_KEYS = ("correct", "em", "bfcl_valid")


class ViewerError(ValueError):
    """Inputs the viewer cannot show (no episodes, scores for unknown episodes, wrong lengths)."""


def write_viewer(episodes_path: str | Path, out_path: str | Path, *, ablation_dir: str | Path | None = None,
                 scores_path: str | Path | None = None, compare_path: str | Path | None = None,
                 compare_scores_path: str | Path | None = None) -> Path:
    """Write the HTML viewer for ``episodes_path`` to ``out_path``, with the per-turn rewards of an
    ablation folder and/or a scores file. ``compare_path``: a second run's episodes (another model or
    checkpoint on the same items), shown side by side item by item, with its own scores file if given.
    Returns the written path."""
    episodes, records, notes = _read_run(episodes_path, ablation_dir, scores_path)
    compare, source = None, Path(episodes_path).name
    if compare_path is not None:
        source = _run_label(episodes_path, compare_path)
        b_eps, b_records, b_notes = _read_run(compare_path, None, compare_scores_path)
        compare = Run(_run_label(compare_path, episodes_path), b_eps, b_records)
        notes += [f"{compare.name}: {n}" for n in b_notes]
    elif compare_scores_path is not None:
        raise ViewerError("--compare-scores needs --compare (the second run's episodes)")
    return render_viewer(episodes, out_path, records, source=source, notes=notes, compare=compare)


@dataclass(frozen=True)
class Run:
    """A second run shown side by side: its label, episodes and per-turn scores."""

    name: str
    episodes: Sequence[Episode]
    records: Sequence[ScoreRecord] = ()


def _run_label(path: str | Path, other: str | Path) -> str:
    """A short name for a run file: its folder name when the two files share a name (two runs' episodes.jsonl)."""
    p, q = Path(path), Path(other)
    return p.parent.name or p.name if p.name == q.name else p.name


def _read_run(episodes_path: str | Path, ablation_dir: str | Path | None,
              scores_path: str | Path | None) -> tuple[list[Episode], list[ScoreRecord], list[str]]:
    report = read_episodes(episodes_path)
    if not report.episodes:
        raise ViewerError(f"no valid episodes in {episodes_path}")
    records: list[ScoreRecord] = []
    if ablation_dir is not None:
        scores_file = Path(ablation_dir) / "scores.jsonl"
        if not scores_file.is_file():
            raise FileNotFoundError(f"{ablation_dir} has no scores.jsonl: rerun `turngym ablate --out {ablation_dir}` "
                                    "(it saves per-turn rewards there), or pass --scores")
        records += read_scores(scores_file)
    if scores_path is not None:
        records += read_scores(scores_path)
    notes = [report.skipped()] if report.errors else []
    notes += report.notes()
    return report.episodes, records, notes


def render_viewer(episodes: Sequence[Episode], out_path: str | Path, records: Sequence[ScoreRecord] = (),
                  source: str = "", notes: Sequence[str] = (), compare: Run | None = None) -> Path:
    """The page for episodes already in memory (``ablate`` and ``eval`` call this after scoring)."""
    payload = build_payload(episodes, records, source, notes, compare)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render_html(payload), encoding="utf-8")
    tmp.replace(out)
    return out


# --------------------------------------------------------------------------- payload


def build_payload(episodes: Sequence[Episode], records: Sequence[ScoreRecord], source: str,
                  notes: Sequence[str] = (), compare: Run | None = None) -> dict[str, Any]:
    from turngym.views.report import model_name

    first = list(episodes)
    run_of = [0] * len(first)
    if compare is not None:  # the second run's ids and groups get its label, so the two runs never collide
        if not compare.episodes:
            raise ViewerError(f"the run to compare, {compare.name}, has no episodes")
        second = [_relabelled(ep, compare.name) for ep in compare.episodes]
        records = list(records) + [dataclasses.replace(r, episode_id=f"{compare.name}:{r.episode_id}")
                                   for r in compare.records]
        episodes, run_of = first + second, run_of + [1] * len(second)
    index = {ep.id: i for i, ep in enumerate(episodes)}
    rewards, advantages = _scores(episodes, index, records)
    groups: dict[str, list[int]] = {}
    for i, ep in enumerate(episodes):
        groups.setdefault(ep.group_key, []).append(i)
    clusters = _clusters(episodes, groups)
    # the K episodes of a group (and every group of a dataset) share their prompt: each distinct prompt is stored once
    # and episodes point at it by number, which keeps a 10,000-episode page to tens of MB instead of hundreds
    prompts: dict[str, int] = {}
    prompt_ids: dict[tuple[int, ...], int] = {}
    queries: dict[str, int] = {}
    rows = []
    for i, ep in enumerate(episodes):
        train = ep.meta.get("train") if isinstance(ep.meta.get("train"), dict) else {}
        p_key = json.dumps(ep.prompt, sort_keys=True)
        p = prompts.setdefault(p_key, len(prompts))
        pi = prompt_ids.setdefault(tuple(ep.prompt_ids), len(prompt_ids)) if ep.prompt_ids is not None else -1
        truth = _truth_shown(ep)
        rows.append({
            "id": ep.id, "env": ep.env_id, "ds": str(ep.task.get("dataset", "")), "oc": _outcome_class(ep),
            "out": ep.outcome, "ans": ep.final_answer, "cl": clusters[i][0], "clk": clusters[i][1],
            "term": ep.terminated, "trunc": ep.truncated, "why": ep.meta.get("truncation"), "p": p, "pi": pi,
            "run": run_of[i], "oid": ep.meta.get("compare_id", ep.id), "step": train.get("step"),
            "qk": queries.setdefault(_query_key(ep), len(queries)),
            "t": [{"a": t.action, "tc": t.tool_calls, "pe": t.parse_error, "o": t.observation,
                   "ot": bool(t.observation and any(m in t.observation for m in TRUNCATION_MARKERS)),
                   "m": t.metrics, "gt": truth[j], "gk": {k: [v.value, v.source] for k, v in t.truth.items()},
                   "ai": t.action_ids, "oi": t.observation_ids,
                   "fi": t.prefill_ids}
                  for j, t in enumerate(ep.turns)],
        })
    vocab, tok_note = _vocab(episodes)
    estimators = sorted({e for w in advantages.values() for e in w})
    partial = {e: why for e in estimators if (why := beyond_rewards(e))}
    notes = list(notes) + [f"{e} advantages here come from the rewards alone: {why}" for e, why in partial.items()]
    return {
        "title": f"turngym episodes · {source}" if source else "turngym episodes",
        "runs": [source or "this run"] + ([compare.name] if compare is not None else []),
        "queries": list(queries),
        # each reward on its own colour scale: SIOP's log-ratios (up to ~8) would wash out a 0-1 reward on a shared one
        "wscale": {w: _limit(v for r in rows_ if r for v in r) for w, rows_ in rewards.items()},
        "ascale": {w: {e: _limit(v for r in rows_ if r for v in r) for e, rows_ in ests.items()}
                   for w, ests in advantages.items()},
        "run_metrics": run_metrics(episodes, run_of, rewards, 2 if compare is not None else 1),
        "source": source, "turngym": __version__, "notes": notes, "partial_estimators": sorted(partial),
        "models": sorted({model_name(str(ep.meta["model"])) for ep in episodes if ep.meta.get("model")}),
        "rewards": list(rewards), "estimators": estimators,
        "scale": _limit(v for w in rewards.values() for r in w if r for v in r),
        "adv_scale": _limit(v for w in advantages.values() for e in w.values() for r in e if r for v in r),
        "tokenizer": tok_note, "vocab": vocab,
        "prompts": [json.loads(k) for k in prompts], "prompt_ids": [list(k) for k in prompt_ids],
        "groups": [{"id": g, "q": str(episodes[m[0]].task.get("question", "")), "gold": _gold(episodes[m[0]]),
                    "eps": m} for g, m in groups.items()],
        "eps": rows, "r": rewards, "adv": advantages,
    }


def _relabelled(ep: Episode, label: str) -> Episode:
    """The second run's episode with its id and group prefixed by the run's label (its own id kept in meta)."""
    out = copy.copy(ep)
    out.id, out.group = f"{label}:{ep.id}", f"{label}:{ep.group_key}"
    out.meta = {**ep.meta, "compare_id": ep.id}
    return out


def _query_key(ep: Episode) -> str:
    """What makes two episodes the same item across runs and training steps: the env and the task played
    (``meta["task_key"]`` from the rollout runner, less the ``@slot`` a trainer's batch position adds; the
    question for episodes without one)."""
    key = str(ep.meta.get("task_key") or "")
    base, _, slot = key.rpartition("@")
    key = base if base and slot.isdigit() else key
    return f"{ep.env_id}|{key}" if key else f"{ep.env_id}|q:{ep.task.get('question', ep.group_key)}"


def run_metrics(episodes: Sequence[Episode], run_of: Sequence[int], rewards: dict[str, list[list[float] | None]],
                n_runs: int) -> list[dict[str, Any]]:
    """Per run: the eval metrics (with their intervals), turns per episode, each reward's mean turn reward,
    and per training step (saved rollouts) the outcome and turn reward means."""
    from turngym.grading.metrics import outcome_metrics

    out = []
    for run in range(n_runs):
        members = [i for i, r in enumerate(run_of) if r == run]
        eps = [episodes[i] for i in members]
        k = max((len(v) for v in _by(eps, lambda e: e.group_key).values()), default=1)
        means = {}
        for w, rows in rewards.items():
            vals = [x for i in members if rows[i] for x in rows[i] if math.isfinite(x)]
            if vals:
                means[w] = {"mean": sum(vals) / len(vals), "turns": len(vals)}
        steps = []
        by_step = _by([e for e in eps if isinstance(e.meta.get("train"), dict)], lambda e: e.meta["train"].get("step"))
        for step, s_eps in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            graded = [v for v in (_outcome_value(e) for e in s_eps) if v is not None]
            r = [x for e in s_eps for x in e.meta["train"].get("turn_rewards", [])]
            steps.append({"step": step, "episodes": len(s_eps), "outcome": sum(graded) / len(graded) if graded else None,
                          "turn_reward": sum(r) / len(r) if r else None})
        out.append({"episodes": len(eps), "metrics": outcome_metrics(eps, k) if eps else {},
                    "turns_per_episode": sum(len(e.turns) for e in eps) / max(1, len(eps)),
                    "rewards": means, "steps": steps})
    return out


def _by(items: Sequence[Any], key: Any) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for x in items:
        out.setdefault(key(x), []).append(x)
    return out


def _outcome_value(ep: Episode) -> float | None:
    key = next((k for k in OUTCOME_KEYS if k in ep.outcome), None)
    try:
        v = float(ep.outcome[key]) if key else None
    except (TypeError, ValueError):
        return None
    return v if v is not None and math.isfinite(v) else None


def _truth_shown(ep: Episode) -> list[float | None]:
    """The ✓ / ✗ chip: the turn's label when its episode carries one binary truth key, else none (every
    key and value, with its source, is listed on the turn)."""
    from turngym.episode import turn_labels
    from turngym.truth import TruthError

    try:
        return [None if x is None else float(x) for x in turn_labels(ep)]
    except TruthError:  # several keys, or non-binary values: no single chip
        return [None] * len(ep.turns)


def _scores(episodes: Sequence[Episode], index: dict[str, int], records: Sequence[ScoreRecord]):
    """Per reward, one per-turn reward list per episode (None: not scored), and advantages per estimator."""
    from turngym.training.advantages import advantages_per_group

    rewards: dict[str, list[list[float] | None]] = {}
    advantages: dict[str, dict[str, list[list[float] | None]]] = {}
    wanted: dict[str, set[str]] = {}
    for rec in records:
        if rec.episode_id not in index:
            runs = sorted({str(e.meta["run"].get("id")) for e in episodes if isinstance(e.meta.get("run"), dict)})
            where = f" (the episodes are of run {', '.join(runs)}: are the scores of another run?)" if runs else ""
            raise ViewerError(f"scores for reward {rec.reward!r} name episode {rec.episode_id!r}, "
                              f"which is not in the episodes file{where}")
        i = index[rec.episode_id]
        n = len(episodes[i].turns)
        if len(rec.turn_rewards) != n:
            raise ViewerError(f"reward {rec.reward!r} gives {len(rec.turn_rewards)} turn rewards for episode "
                              f"{rec.episode_id!r}, which has {n} turns")
        rewards.setdefault(rec.reward, [None] * len(episodes))[i] = rec.turn_rewards
        for est, values in rec.advantages.items():
            if len(values) != n:
                raise ViewerError(f"{est} advantages of reward {rec.reward!r} for {rec.episode_id!r}: "
                                  f"{len(values)} values for {n} turns")
            advantages.setdefault(rec.reward, {}).setdefault(est, [None] * len(episodes))[i] = values
        if rec.estimator and rec.estimator not in rec.advantages:
            wanted.setdefault(rec.reward, set()).add(rec.estimator)
    for name, ests in wanted.items():  # advantages computed per group over the episodes the reward scored
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(rewards[name]):
            if r is not None:
                groups.setdefault(episodes[i].group_key, []).append(i)
        for est in sorted(ests):
            column = advantages.setdefault(name, {}).setdefault(est, [None] * len(episodes))
            for i, a in enumerate(advantages_per_group(rewards[name], list(groups.values()), est)):
                if a is not None:
                    column[i] = a
    return rewards, advantages


def _limit(values: Any) -> float:
    """The half-width of a symmetric scale around 0: the largest |value| (1 when all are 0)."""
    m = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    return float(m) if m > 0 else 1.0


def _outcome_class(ep: Episode) -> str:
    key = next((k for k in OUTCOME_KEYS if k in ep.outcome), None)
    if key is None:
        return "unscored"
    try:
        v = float(ep.outcome[key])
    except (TypeError, ValueError):
        return "unscored"
    return "correct" if v == 1.0 else "incorrect" if v == 0.0 else "partial"


def _gold(ep: Episode) -> str:
    for key in ("answers", "answer", "ground_truth"):
        if ep.task.get(key) not in (None, [], ""):
            v = ep.task[key]
            text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
            return text if len(text) <= 600 else text[:600] + " … [cut]"
    return ""


def _clusters(episodes: Sequence[Episode], groups: dict[str, list[int]]) -> list[tuple[str, str]]:
    """(cluster letter, kind) per episode: kind ``largest``, ``other`` or ``none`` (no answer).

    Answers are clustered by a key-based equivalence for the answer kind the env declares
    (calls: canonical JSON; otherwise SQuAD-normalised text). Math uses normalised text too:
    math-verify equivalence costs ~20 ms per episode, minutes for 10,000. Episodes from files
    written before episodes declared their answer kind are shown by normalised text.
    """
    from turngym.grading.calls import canonical_calls
    from turngym.rewards.equivalence import NormalizedMatch

    out: list[tuple[str, str]] = [("", "none")] * len(episodes)
    text_key = NormalizedMatch().key
    for members in groups.values():
        needs = episodes[members[0]].reward_needs
        keyer = canonical_calls if needs is not None and needs.answer_kind == "calls" else text_key
        keys = [keyer(str(episodes[i].final_answer).strip())
                if episodes[i].final_answer is not None and str(episodes[i].final_answer).strip() else None
                for i in members]
        sizes: dict[str, int] = {}
        for k in keys:
            if k is not None:
                sizes[k] = sizes.get(k, 0) + 1
        first = {k: n for n, k in reversed(list(enumerate(keys)))}
        rank = {k: r for r, k in enumerate(sorted(sizes, key=lambda k: (-sizes[k], first[k])))}
        for i, k in zip(members, keys, strict=True):
            if k is not None:
                out[i] = (_letter(rank[k]), "largest" if rank[k] == 0 else "other")
    return out


def _letter(r: int) -> str:
    return chr(ord("A") + r) if r < 26 else f"#{r + 1}"


FINGERPRINT_KEYS = ("vocab_size", "vocab_sha256", "probe")  # turngym.agents.tokenization.tokenizer_fingerprint


def _vocab(episodes: Sequence[Episode]) -> tuple[dict[str, str], dict[str, Any]]:
    """Text of every token id the episodes use, with the tokenizer of the model they name, when its
    fingerprint matches the one the episodes recorded with their ids (``meta["tokenizer"]``)."""
    from turngym.agents.tokenization import tokenizer_fingerprint

    with_ids = [ep for ep in episodes if ep.prompt_ids is not None or any(t.action_ids for t in ep.turns)]
    if not with_ids:
        return {}, {"status": "none", "note": "no token ids were recorded in these episodes"}
    model = str(with_ids[0].meta.get("model") or "")
    recorded = {json.dumps(ep.meta["tokenizer"], sort_keys=True): ep.meta["tokenizer"]
                for ep in with_ids if isinstance(ep.meta.get("tokenizer"), dict)}
    if len(recorded) > 1:
        return {}, {"status": "ids", "note": f"token ids shown as numbers: the episodes were tokenised by "
                                             f"{len(recorded)} different tokenizers (meta['tokenizer'] differs)"}
    ids = set()
    for ep in with_ids:
        ids.update(ep.prompt_ids or [])
        for t in ep.turns:
            ids.update(t.prefill_ids or [])
            ids.update(t.action_ids or [])
            ids.update(t.observation_ids or [])
    tok, reason = _load_tokenizer(model)
    if tok is None:
        return {}, {"status": "ids", "note": f"token ids shown as numbers: {reason}"}
    if recorded:
        theirs, ours = next(iter(recorded.values())), tokenizer_fingerprint(tok)
        diffs = [k for k in FINGERPRINT_KEYS if theirs.get(k) != ours.get(k)]
        if diffs:
            return {}, {"status": "ids", "note": f"token ids shown as numbers: the tokenizer of {model!r} that loads "
                                                 f"here is not the one that produced the ids ({', '.join(diffs)} differ: "
                                                 f"vocab_size {theirs.get('vocab_size')} recorded vs "
                                                 f"{ours.get('vocab_size')} here), so decoding would show wrong text"}
        checked = "; its fingerprint matches the one recorded with the ids"
    else:
        checked = "; not checked: the episodes record no tokenizer fingerprint (meta['tokenizer'])"
    return ({str(i): tok.decode([i]) for i in sorted(ids)},
            {"status": "decoded", "note": f"decoded with the tokenizer of {model!r}{checked}"})


def _load_tokenizer(model: str) -> tuple[Any, str]:
    if not model or model == "?":
        return None, "the episodes do not name their model"
    try:
        from transformers import AutoTokenizer

        from turngym.agents.loading import resolve_model_dir

        return AutoTokenizer.from_pretrained(resolve_model_dir(model), local_files_only=True), ""
    except Exception as exc:  # noqa: BLE001 - any failure to load means "show ids", and the page says why
        return None, f"the tokenizer of {model!r} does not load offline ({type(exc).__name__}: {str(exc)[:160]})"


# --------------------------------------------------------------------------- HTML


def _finite(x: Any) -> Any:
    """JSON without NaN/inf (the browser's JSON.parse rejects them): non-finite numbers become strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def embed_json(payload: Any) -> str:
    """JSON safe inside a <script> element: '<', '>' and '&' escaped, lone surrogates as \\u escapes."""
    try:
        text = json.dumps(payload, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    except ValueError:
        text = json.dumps(_finite(payload), ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _asset(name: str) -> str:
    return resources.files("turngym.views").joinpath("templates", name).read_text(encoding="utf-8")


def render_html(payload: dict[str, Any]) -> str:
    title = payload["title"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (_asset("viewer.html")
            .replace("/*TITLE*/", title)
            .replace("/*CSS*/", _asset("viewer.css"))
            .replace("/*JS*/", _asset("viewer.js"))
            .replace("/*DATA*/", embed_json(payload)))
