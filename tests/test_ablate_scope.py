"""ablate: a reward that needs a gold answer (igpo) is scored on the groups that carry one, and says so."""

import copy
import json

import pytest

from turngym.credit.ablate import ablate
from turngym.envs.calculator import CalculatorEnv
from turngym.rewards import get_reward
from turngym.rewards.support import HFSupportScorer


def _play(index: int, k: int, actions: list[str]):
    env = CalculatorEnv(max_turns=4)
    env.reset(seed=k, options={"index": index, "episode_id": f"calc|{index}#{k}", "group": f"calc|{index}"})
    for a in actions:
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    return copy.deepcopy(env.episode)


@pytest.fixture(scope="module")
def episodes():
    eps = []
    for index in (0, 1, 2):
        gold = CalculatorEnv().get_item(index)["answers"][0]
        for k in range(3):
            good = k != 1  # a tool turn that works (tool_ok) or one that fails
            eps.append(_play(index, k, ["<calc>2*3</calc>" if good else "<calc>2**</calc>",
                                        f"<answer>{gold if good else 0}</answer>"]))
    no_gold = []  # a group with no gold answer (as BFCL calls have none), labelled like the others
    for e in eps[:3]:
        e = copy.deepcopy(e)
        e.id, e.group, e.env_id = e.id + "-nogold", "nogold", "turngym/NoGold-v0"
        e.task = {**e.task, "answers": []}
        no_gold.append(e)
    return eps + no_gold


def test_igpo_is_scored_where_gold_exists_and_the_table_says_so(episodes, tiny_chat_policy, tmp_path):
    scorer = HFSupportScorer(tiny_chat_policy.model, tiny_chat_policy.tokenizer)
    by_name = {"outcome": get_reward("outcome"), "igpo": get_reward("igpo", scorer=scorer, tokens="text")}
    with pytest.raises(ValueError, match="needs a gold answer"):  # the reward itself still refuses such a group
        by_name["igpo"].score_group(episodes[-3:])
    s = ablate(episodes, by_name, tmp_path)
    assert not s["errors"]
    igpo, outcome = s["rewards"]["igpo"], s["rewards"]["outcome"]
    assert igpo["scope"] == {"envs": ["turngym/Calculator-v0"], "groups": 3, "left_out_envs": ["turngym/NoGold-v0"],
                             "left_out_groups": 1}
    assert igpo["credit_accuracy_advantage"]["n_turns"] == 9 and igpo["credit_accuracy_advantage"]["auc"] is not None
    assert outcome["credit_accuracy_advantage"]["n_turns"] == 12 and "scope" not in outcome
    md = (tmp_path / "ablation.md").read_text()
    assert "| 3 / 9 (6)*" in md and "left out: 1 groups of turngym/NoGold-v0" in md
    # the gold-only reward is in the rank correlation (over the turns it scored), the heatmap and the viewer
    assert s["correlation"]["igpo"]["outcome"] is not None and s["correlation"]["outcome"]["igpo"] is not None
    import json

    from turngym.training.scores import read_scores

    saved = json.loads((tmp_path / "ablation.json").read_text())
    assert saved["per_turn_rewards"]["igpo"][-3:] == [[None] * len(e.turns) for e in episodes[-3:]]
    assert all(x is not None for r in saved["per_turn_rewards"]["igpo"][:-3] for x in r)
    scored = {(r.reward, r.episode_id) for r in read_scores(tmp_path / "scores.jsonl")}
    assert ("igpo", episodes[0].id) in scored and ("igpo", episodes[-1].id) not in scored
    assert ("outcome", episodes[-1].id) in scored
    assert "igpo" in (tmp_path / "view.html").read_text()


def test_all_gold_keeps_igpo_in_the_main_table(episodes, tiny_chat_policy):
    scorer = HFSupportScorer(tiny_chat_policy.model, tiny_chat_policy.tokenizer)
    s = ablate(episodes[:-3], {"igpo": get_reward("igpo", scorer=scorer, tokens="text")})
    assert "gold_only" not in s and "scope" not in s["rewards"]["igpo"] and "igpo" in s["correlation"]


class FailingGoldReward:
    """A fake reward that needs gold and always fails: it must be tried once, on the gold groups only."""

    requires_gold = True

    def __init__(self):
        self.calls = 0

    def score_group(self, group):
        self.calls += 1
        raise RuntimeError("scorer broke")


def test_a_failing_gold_only_reward_is_not_rerun_on_every_group(episodes):
    bad = FailingGoldReward()
    s = ablate(episodes, {"outcome": get_reward("outcome"), "igpo": bad})
    assert bad.calls == 1 and "scorer broke" in s["errors"]["igpo"]
    assert s["rewards"]["outcome"]["credit_accuracy_advantage"]["n_groups"] == 4


def test_old_files_without_reward_needs_use_the_registered_envs_declaration(episodes, tmp_path):
    from turngym.credit.ablate import run_ablation
    from turngym.envs.calculator import CalculatorEnv

    path = tmp_path / "old.jsonl"
    # Calculator groups, as a file written before episodes declared reward_needs (labelled schema_version 1)
    path.write_text("".join(json.dumps({**e.to_dict(), "reward_needs": None, "schema_version": 1}) + "\n"
                            for e in episodes[:6]))
    s = run_ablation(path, ["outcome", "ttrl"], tmp_path / "out")
    assert not s["errors"] and s["rewards"]["ttrl"]["mean_turn_reward"] is not None
    assert CalculatorEnv.reward_needs is not None


def test_every_command_that_reads_saved_episodes_fills_old_files_the_same_way(episodes, tmp_path, capsys):
    from turngym.episode.reader import load_episodes
    from turngym.views.viewer import write_viewer

    path = tmp_path / "old.jsonl"
    path.write_text("".join(json.dumps({**e.to_dict(), "reward_needs": None, "schema_version": 1}) + "\n"
                            for e in episodes[:3] + episodes[-3:]))  # Calculator (registered), NoGold-v0 (not)
    report = load_episodes(path)
    assert [e.reward_needs is not None for e in report.episodes] == [True] * 3 + [False] * 3
    assert "note: 3 episode(s) written before episodes carried reward_needs (or all its fields)" in capsys.readouterr().out
    html = write_viewer(path, tmp_path / "view.html").read_text()
    assert "3 episode(s) written before episodes carried reward_needs" in html
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no valid episodes"):
        load_episodes(tmp_path / "empty.jsonl")


def test_a_reward_with_options_is_ablated_beside_the_plain_one_from_the_command_line(episodes, tmp_path):
    """Issue #37 item 9: `--rewards 'funrl,funrl[require_think=true]'` and `--reward-arg` name variants; the
    report and the scores file name each by its label, and the variant scores what its option says."""
    import json
    import subprocess
    import sys

    from turngym.episode import EpisodeWriter

    path = tmp_path / "episodes.jsonl"
    with EpisodeWriter(path) as w:
        for e in episodes[:9]:
            w.write(e)
    cli = [sys.executable, "-m", "turngym.cli", "ablate", "--episodes", str(path)]
    proc = subprocess.run(cli + ["--rewards", "funrl,funrl[require_think=true]", "--out", str(tmp_path / "a")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(line) for line in (tmp_path / "a" / "scores.jsonl").read_text().splitlines()]
    by = {}
    for r in recs:
        by.setdefault(r["reward"], []).append(sum(r["turn_rewards"]))
    assert set(by) == {"funrl", "funrl[require_think=true]"}
    assert max(by["funrl"]) == 1.0 and max(by["funrl[require_think=true]"]) == 0.0  # no <think>: never well-formed
    assert "funrl[require_think=true]" in (tmp_path / "a" / "ablation.md").read_text()
    # the same variant through --reward-arg, and an unknown option: one error line naming the reward's options
    proc = subprocess.run(cli + ["--rewards", "funrl", "--reward-arg", "funrl.require_think=true", "--out", str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert {json.loads(line)["reward"] for line in (tmp_path / "b" / "scores.jsonl").read_text().splitlines()} == {
        "funrl[require_think=true]"}
    for argv, expected in ((["--rewards", "funrl[require_thnk=true]"],
                            "reward 'funrl' takes no option 'require_thnk'; its options: metric, require_think"),
                           (["--rewards", "funrl", "--reward-arg", "siop.prefix=after_observation"],
                            "--reward-arg 'siop.prefix=after_observation': no reward 'siop' among ['funrl']"),
                           (["--rewards", "funrl[require_think"], "write options as name[key=value,key=value]")):
        proc = subprocess.run(cli + argv + ["--out", str(tmp_path / "c")], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == f"error: {expected}" or expected in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "c").exists()  # refused before anything was written
