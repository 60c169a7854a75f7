"""toolcall_dense reads tool success from the metric each env declares (``RewardNeeds.tool_ok_metrics``),
and a checker's verdict and which steps are replies to a user from what the env declares
(``checker_metric`` / ``checker_outcome``, ``user_turn_metric``), not from metric names it guesses;
funrl reads no tool metric at all.

The reference below is the reward's code from before the declarations (it read ``tool_ok`` / ``exec_ok``,
SearchQA's ``action`` / ``retrieval_error`` and BFCL's ``bfcl_checked`` / ``bfcl_turn_valid`` /
``bfcl_user_turn`` / ``bfcl_valid``), kept here only to show the scores did not move: every env plays
scripted episodes that reach each outcome of a tool call (ran, failed, no call, malformed) and of
BFCL's checker (passed, failed, a plain reply), and both versions score them.
"""

from __future__ import annotations

import pytest

import turngym  # noqa: F401
from turngym.corpora.lucene import Hit, RetrieverError
from turngym.episode import Episode, MissingRewardNeeds, RewardNeeds, Turn, reward_view
from turngym.rewards.base import get_reward
from turngym.rewards.funrl import turn_components

# ------------------------------------------------------------------ the reference: the code before the declaration


def before_executed(turn: Turn) -> bool | None:
    m = turn.metrics
    for key in ("tool_ok", "exec_ok"):
        if m.get(key) is not None:
            return bool(m[key])
    if m.get("action") == "search":
        return turn.parse_error is None and "retrieval_error" not in m
    return None


def before_components(episode: Episode, turn: Turn) -> dict[str, float]:
    attempt = turn.action.strip().startswith("[") or "<tool_call>" in turn.action
    bfcl_reply = "bfcl_user_turn" in turn.metrics and not turn.tool_calls and not attempt
    parts = {"well_formed": float(turn.parse_error is None or bfcl_reply)}
    if turn.tool_calls:
        ok = before_executed(turn)
        if ok is not None:
            parts["executed"] = float(ok)
    if turn.metrics.get("bfcl_checked"):
        parts["checker"] = float(bool(turn.metrics.get("bfcl_turn_valid")))
    elif "bfcl_valid" in episode.outcome and "bfcl_user_turn" not in turn.metrics and turn.index == len(episode.turns) - 1:
        parts["checker"] = float(bool(episode.outcome["bfcl_valid"]))
    return parts


def before_funrl_format(episode: Episode) -> float:
    return float(bool(episode.turns) and all(before_components(episode, t)["well_formed"] for t in episode.turns))


# ------------------------------------------------------------------ episodes of every env that runs tools


class FakeRetrieverForTest:
    """A fake retriever (inside this test): one fixed passage, or a retrieval error for a query naming it."""

    def search(self, query: str, k: int) -> list[Hit]:
        if "FAIL" in query:
            raise RetrieverError("index unavailable")
        return [Hit(docid="p1", score=1.0, title="Paris", text="Paris is the capital of France.")][:k]


def play(env, actions, **reset) -> Episode:
    raw = env.unwrapped
    raw.reset(seed=0, options=reset or {"index": 0})
    for a in actions:
        *_, term, trunc, _ = raw.step(a)
        if term or trunc:
            break
    if not raw.episode.done:
        raw.end_episode("test")
    return raw.episode


def calculator_episodes():
    from turngym.envs.calculator import CalculatorEnv

    env = CalculatorEnv(max_turns=5)
    return [play(env, ["<calc>2*3</calc>", "<calc>1/0</calc>", "no tag", "<answer>6</answer>"]),
            play(env, ["<calc>(</calc>", "<answer>7</answer>"], index=1)]


def mathcode_episodes():
    from turngym.envs.math_code import MathCodeEnv
    from turngym.sandbox import SandboxLimits, SandboxPool

    pool = SandboxPool(size=1, limits=SandboxLimits(wall_s=3, cpu_s=3), preload=("math",))
    try:
        env = MathCodeEnv(dataset="gsm8k", sandbox=pool, max_turns=4)
        return [play(env, ["```python\nprint(16 - 3 - 4)\n```", "```python\nundefined_name\n```", "\\boxed{18}"])]
    finally:
        pool.close()


def searchqa_episodes():
    from turngym.envs.search_qa import SearchQAEnv

    env = SearchQAEnv(dataset="nq", retriever=FakeRetrieverForTest(), max_turns=6)
    task = {"task": {"question": "What is the capital of France?", "answers": ["Paris"]}}
    return [play(env, ["<search>capital of France</search>", "<search> </search>", "<search>FAIL now</search>",
                       "no tag at all", "<answer>Paris</answer>"], **task),
            play(env, ["<search>capital</search>"] * 6, **task)]


def bfcl_episodes():
    from turngym.envs.bfcl.env import BFCLEnv

    multi = BFCLEnv(category="multi_turn_base")
    single = BFCLEnv(category="simple_python")
    return [play(multi, ["[cd(folder='document'), mkdir(dir_name='temp'), mv(source='final_report.pdf', destination='temp')]",
                         "[cd(folder='nowhere_at_all')]", "All done.", "[ls("]),
            play(single, ["[calculate_triangle_area(base=10, height=5)]"]),
            play(single, ["not a call"])]


def imported_searchqa_episodes(tmp_path):
    import json

    from turngym.episode.reader import read_episodes
    from turngym.importers import import_messages

    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query": "capital of France"}'}}
    record = {"question": "What is the capital of France?", "answers": ["Paris"], "step_labels": [1, 1], "messages": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "Paris is the capital of France."},
        {"role": "assistant", "content": "<answer>Paris</answer>"}]}
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(record) + "\n")
    import_messages(src, tmp_path / "out.jsonl", env="SearchQA-v0")
    return read_episodes(tmp_path / "out.jsonl").episodes


@pytest.fixture(scope="module")
def episodes():
    return {"calculator": calculator_episodes(), "mathcode": mathcode_episodes(),
            "searchqa": searchqa_episodes(), "bfcl": bfcl_episodes()}


def test_every_env_scores_as_before_and_reads_its_declared_metric(episodes):
    dense, funrl = get_reward("toolcall_dense"), get_reward("funrl")
    seen = set()
    for env, eps in episodes.items():
        for ep, view in zip(eps, reward_view(eps), strict=True):
            before = [before_components(ep, t) for t in ep.turns]
            assert [turn_components(view, t) for t in view.turns] == before, env
            assert dense.score_episode(view) == [sum(p.values()) / len(p) for p in before], env
            assert funrl.components(view)["format"] == before_funrl_format(ep), env
            seen |= {(env, p.get("executed")) for p in before}
            seen |= {(env, "checker", p["checker"]) for p in before if "checker" in p}
            seen |= {(env, "reply") for t, p in zip(ep.turns, before, strict=True)
                     if t.parse_error is not None and p["well_formed"] == 1.0}
            declared = ep.reward_needs.tool_ok_metrics
            assert all(set(t.metrics) & set(declared) for t, p in zip(ep.turns, before, strict=True) if "executed" in p)
    # the episodes reach a tool that ran and one that failed in every env that runs tools
    for env in episodes:
        assert {(env, 1.0), (env, 0.0)} <= seen, (env, seen)
    # BFCL's checker passes and fails, and a plain reply that did not parse as a call is well-formed
    assert {("bfcl", "checker", 1.0), ("bfcl", "checker", 0.0), ("bfcl", "reply")} <= seen, seen
    assert not any(s[1] == "checker" for s in seen if s[0] != "bfcl")


def test_imported_episodes_score_as_before(tmp_path):
    [ep] = imported_searchqa_episodes(tmp_path)
    before = [before_components(ep, t) for t in ep.turns]
    assert before[0] == {"well_formed": 1.0, "executed": 1.0}
    assert [turn_components(ep, t) for t in ep.turns] == before


def test_the_reward_reads_the_declared_metric_not_the_truth_namespace(episodes):
    """Calculator records ``tool_ok`` both as the declared metric and as truth: without the metric the
    reward has no verdict, whatever the truth says; with another declared name it reads that name."""
    ep = episodes["calculator"][0]
    stripped = Episode.from_dict(ep.to_dict())
    for t in stripped.turns:
        t.metrics.pop("tool_ok", None)
    assert stripped.turns[0].truth["tool_ok"].value is True
    assert all("executed" not in turn_components(stripped, t) for t in stripped.turns)
    renamed = Episode.from_dict(ep.to_dict())
    renamed.reward_needs = RewardNeeds(answer_kind="qa_text", answer_cue="answer_tag", tool_ok_metrics=("calc_ran",))
    renamed.turns[0].metrics = {"calc_ran": False}
    assert turn_components(renamed, renamed.turns[0])["executed"] == 0.0


def test_a_turn_with_calls_and_no_declared_metric_is_an_error_not_a_guess():
    turn = Turn(index=0, action="<search>x</search>", tool_calls=[{"name": "search"}], metrics={"action": "search"})
    undeclared = Episode(id="u", env_id="turngym/SearchQA-v0", turns=[turn],
                         reward_needs=RewardNeeds(answer_kind="qa_text", answer_cue="answer_tag",
                                                  tool_error_metrics=("retrieval_error",)))
    with pytest.raises(ValueError, match="declares no per-turn metric"):
        get_reward("toolcall_dense").score_episode(undeclared)
    assert get_reward("funrl").components(undeclared)["format"] == 1.0  # funrl reads no tool metric
    old = Episode(id="o", env_id="turngym/SearchQA-v0", turns=[turn], reward_needs=None)
    with pytest.raises(MissingRewardNeeds, match="toolcall_dense"):
        get_reward("toolcall_dense").score_episode(old)
    no_calls = Episode(id="n", env_id="turngym/Digits-v0", turns=[Turn(index=0, action="123")],
                       reward_needs=RewardNeeds(answer_kind="none", answer_cue="answer_tag"))
    assert get_reward("toolcall_dense").score_episode(no_calls) == [1.0]


def test_the_checker_and_replies_are_read_from_the_declaration_not_from_bfcl_names(episodes):
    """Multi-turn BFCL declares its per-turn check and its user turns, single-turn its outcome verdict:
    renamed metrics are read under their declared names, and undeclared ones are not read at all."""
    multi, single = episodes["bfcl"][0], episodes["bfcl"][1]
    assert multi.reward_needs.checker_metric == "bfcl_turn_valid" and multi.reward_needs.user_turn_metric
    assert single.reward_needs.checker_outcome == "bfcl_valid"
    before = [turn_components(multi, t) for t in multi.turns]

    renamed = Episode.from_dict(multi.to_dict())
    renamed.reward_needs = RewardNeeds(answer_kind="calls", answer_cue="answer_tag", tool_ok_metrics=("tool_ok",),
                                       checker_metric="turn_check", user_turn_metric="asked")
    for t in renamed.turns:
        t.metrics = {{"bfcl_turn_valid": "turn_check", "bfcl_user_turn": "asked"}.get(k, k): v
                     for k, v in t.metrics.items()}
    assert [turn_components(renamed, t) for t in renamed.turns] == before

    silent = Episode.from_dict(multi.to_dict())
    silent.reward_needs = RewardNeeds(answer_kind="calls", answer_cue="answer_tag", tool_ok_metrics=("tool_ok",))
    parts = [turn_components(silent, t) for t in silent.turns]
    assert all("checker" not in p for p in parts)
    replies = [i for i, (t, p) in enumerate(zip(multi.turns, before, strict=True))
               if t.parse_error is not None and p["well_formed"] == 1.0]
    assert replies and all(parts[i]["well_formed"] == 0.0 for i in replies)  # undeclared: a malformed call

    wrong = episodes["bfcl"][2]  # a single-turn entry answered with no call: the checker fails it
    one = Episode.from_dict(wrong.to_dict())
    assert turn_components(one, one.turns[-1])["checker"] == 0.0
    one.reward_needs = RewardNeeds(answer_kind="calls", answer_cue="answer_tag", tool_ok_metrics=("tool_ok",))
    assert "checker" not in turn_components(one, one.turns[-1])


def test_the_checker_is_never_read_from_the_truth_namespace(episodes):
    """BFCL copies bfcl_turn_valid into the turn's truth; rewards see episodes without truth, and even with
    it, a turn whose declared metric is gone has no checker verdict."""
    multi = episodes["bfcl"][0]
    assert any("bfcl_turn_valid" in t.truth for t in multi.turns)
    [view] = reward_view([multi])
    assert all(not t.truth for t in view.turns)
    stripped = Episode.from_dict(multi.to_dict())
    for t in stripped.turns:
        t.metrics.pop("bfcl_turn_valid", None)
    assert any("bfcl_turn_valid" in t.truth for t in stripped.turns)
    assert all("checker" not in turn_components(stripped, t) for t in stripped.turns)


def test_an_episode_written_before_the_checker_declaration_is_refused_not_rescored(episodes):
    multi = episodes["bfcl"][0]
    new = Episode.from_json(multi.to_json())
    assert new.reward_needs == multi.reward_needs and not new.reward_needs.predates
    assert "predates" not in multi.to_dict()["reward_needs"]
    old = multi.to_dict()
    for key in ("checker_metric", "checker_outcome", "user_turn_metric"):
        old["reward_needs"].pop(key)
    read = Episode.from_dict(old)
    assert set(read.reward_needs.predates) == {"checker_metric", "checker_outcome", "user_turn_metric"}
    assert Episode.from_json(read.to_json()).reward_needs.predates == read.reward_needs.predates  # kept on rewrite
    with pytest.raises(MissingRewardNeeds, match="before envs declared checker_metric, checker_outcome.*play it again"):
        get_reward("toolcall_dense").score_episode(read)
    with pytest.raises(MissingRewardNeeds, match="user_turn_metric"):
        get_reward("funrl").components(read)  # it has a step that did not parse: reply or malformed call?
    parsed = Episode.from_dict({**old, "turns": [t for t in old["turns"] if t["parse_error"] is None]})
    assert get_reward("funrl").components(parsed)["format"] == 1.0  # turns that parsed need no declaration


def test_a_declaration_names_one_checker():
    with pytest.raises(ValueError, match="not both"):
        RewardNeeds(answer_kind="calls", answer_cue="answer_tag", checker_metric="a", checker_outcome="b")
    with pytest.raises(ValueError, match="user_turn_metric must be a metric name"):
        RewardNeeds(answer_kind="calls", answer_cue="answer_tag", user_turn_metric="")


def test_commands_reading_old_bfcl_files_fill_the_declaration_of_each_episodes_category(episodes, tmp_path):
    """ablate, view and scribe read saved episodes through load_episodes: an old BFCL file gets its
    category's declaration (multi-turn or single-turn) and scores as the reward did before."""
    import json

    from turngym.episode.reader import load_episodes

    dense = get_reward("toolcall_dense")
    lines = []
    for ep in episodes["bfcl"]:
        d = {**ep.to_dict(), "schema_version": 1}  # the label every file had before version 4
        for key in ("checker_metric", "checker_outcome", "user_turn_metric"):
            d["reward_needs"].pop(key)
        lines.append(json.dumps(d))
        lines.append(json.dumps({**ep.to_dict(), "id": ep.id + "-older", "reward_needs": None, "schema_version": 1}))
    unknown = {**episodes["bfcl"][0].to_dict(), "id": "adhoc", "task": {"id": "x", "dataset": "not_a_category"},
               "schema_version": 1}
    unknown["reward_needs"].pop("checker_metric")
    lines.append(json.dumps(unknown))
    path = tmp_path / "old.jsonl"
    path.write_text("\n".join(lines) + "\n")
    *read, adhoc = load_episodes(path).episodes
    for ep, again in zip([e for e in episodes["bfcl"] for _ in (0, 1)], read, strict=True):
        assert again.reward_needs == ep.reward_needs and not again.reward_needs.predates
        assert dense.score_episode(again) == [sum(p.values()) / len(p) for p in
                                              (before_components(ep, t) for t in ep.turns)]
    with pytest.raises(MissingRewardNeeds, match="checker_metric"):
        dense.score_episode(adhoc)  # a category BFCL cannot name: still refused, never guessed
