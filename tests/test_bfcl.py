"""BFCL-v0 against bfcl-eval's own evaluator: replays, mutated answers, hostile output, isolation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import turngym  # noqa: F401
from bfcl_cases import END_TURN, gt_calls, multi_turn_mutations, render_single, render_steps, single_turn_outputs
from turngym.envs.bfcl.calls import calls_from_strings, decode_native, render_prompting, unsafe_arithmetic
from turngym.envs.bfcl.data import MULTI_TURN, RELEVANCE, SINGLE_TURN_AST, BFCLDataError, language_of
from turngym.envs.bfcl.env import BFCLEnv
from turngym.envs.bfcl.reference import official_multi_turn, official_single_turn
from turngym.envs.bfcl.upstream import bfcl


def play_multi_turn(env: BFCLEnv, index: int, steps_per_turn, tool_format: str):
    """Play the steps; returns the outcome and the raw texts of each user turn as the env split them."""
    env.reset(options={"index": index})
    info = {}
    texts = [t for steps in steps_per_turn
             for t in render_steps(steps, tool_format, {v: k for k, v in env.context.name_map.items()})]
    for text in texts:
        _, _, term, trunc, info = env.step(text)
        if term or trunc:
            break
    assert env.episode.done
    reached = max(t.metrics["bfcl_user_turn"] for t in env.episode.turns) + 1
    raw: list[list[str]] = [[] for _ in range(reached)]  # bfcl-eval records only the turns it reached
    for t in env.episode.turns:
        raw[t.metrics["bfcl_user_turn"]].append(t.action)
    return info["outcome"], raw


def replay_ground_truth(env: BFCLEnv, index: int) -> dict:
    """Play entry ``index``'s ground truth (one step per user turn, then a reply without calls)."""
    env.reset(options={"index": index})
    info: dict = {}
    for turn in env.data.answers[env.context.entry["id"]]:
        if turn:
            env.step(render_prompting(calls_from_strings(turn, env.session.parameters)))
        _, _, _, _, info = env.step(END_TURN)
    return info


def multi_turn_parity(category: str, tool_format: str, indices) -> dict[str, int]:
    env = BFCLEnv(category=category, tool_format=tool_format)
    counts = {"valid": 0, "invalid": 0}
    for i in indices:
        env.reset(options={"index": i})
        entry_id = env.context.entry["id"]
        gt = env.data.answers[entry_id]
        params, methods = env.session.parameters, sorted(env.session.methods)
        for name, steps in multi_turn_mutations(gt, params, methods, seed=i).items():
            outcome, raw = play_multi_turn(env, i, steps, tool_format)
            ref = official_multi_turn(category, raw, env.data.checker_entries[i], gt, tool_format, env.context.name_map)
            assert outcome["bfcl_valid"] == ref["valid"], (entry_id, name, outcome, ref.get("error"))
            if name == "correct":
                assert outcome["bfcl_valid"], (entry_id, name, outcome)
            counts["valid" if ref["valid"] else "invalid"] += 1
    env.close()
    return counts


# ------------------------------------------------------------------ contract


@pytest.mark.parametrize("category,tool_format", [("multi_turn_base", "prompting"), ("simple_python", "native"),
                                                  ("live_irrelevance", "prompting")])
def test_bfcl_env_passes_gymnasium_checker(category, tool_format):
    env = gymnasium.make("turngym/BFCL-v0", category=category, tool_format=tool_format)
    check_env(env.unwrapped, skip_render_check=False)


def test_unavailable_categories_are_refused_with_the_reason():
    with pytest.raises(BFCLDataError, match="live web search"):
        BFCLEnv(category="web_search_base")
    with pytest.raises(BFCLDataError, match="unknown BFCL category"):
        BFCLEnv(category="simple")
    with pytest.raises(ValueError, match="tool_format"):
        BFCLEnv(category="simple_python", tool_format="xml")


def test_local_data_folder_missing_files_is_a_clear_error(tmp_path):
    with pytest.raises(BFCLDataError, match="not found"):
        BFCLEnv(category="simple_python", data_dir=str(tmp_path))


def test_prompting_prompt_is_bfcl_system_prompt_and_native_gives_tools():
    env = BFCLEnv(category="multi_turn_base", tool_format="prompting")
    env.reset(options={"index": 0})
    assert env.episode.prompt[0]["role"] == "system" and "[func_name1(params_name1=params_value1" in \
        env.episode.prompt[0]["content"]
    assert env.episode.tools is None
    native = BFCLEnv(category="simple_python", tool_format="native")
    native.reset(options={"index": 0})
    assert native.episode.prompt[0]["role"] == "user"
    assert native.episode.tools and native.episode.tools[0]["type"] == "function"
    assert all("." not in t["function"]["name"] for t in native.episode.tools)


# ------------------------------------------------------------------ multi-turn


@pytest.mark.parametrize("category", MULTI_TURN)
def test_all_ground_truths_replayed_through_the_env_are_valid(category):
    env = BFCLEnv(category=category)
    for i in range(env.num_items()):
        info = replay_ground_truth(env, i)
        gt = env.data.answers[env.context.entry["id"]]
        assert env.episode.terminated and info["outcome"]["bfcl_valid"], (env.context.entry["id"], info["outcome"])
        checks = [t.metrics for t in env.episode.turns if "bfcl_checked" in t.metrics]
        assert len(checks) == len(gt)
        assert all(c["bfcl_turn_valid"] for c in checks if c["bfcl_checked"])


@pytest.mark.parametrize("category", MULTI_TURN)
@pytest.mark.parametrize("tool_format", ["prompting", "native"])
def test_multi_turn_verdicts_equal_bfcl_eval_on_every_entry(category, tool_format):
    counts = multi_turn_parity(category, tool_format, range(200))
    assert counts["valid"] >= 200 and counts["invalid"] >= 600, counts


def test_per_turn_checks_record_state_and_response():
    env = BFCLEnv(category="multi_turn_base")
    env.reset(options={"index": 0})
    gt = env.data.answers[env.context.entry["id"]]
    env.step(render_prompting(calls_from_strings(gt[0], env.session.parameters)[:-1]))  # drop the last call
    _, _, _, _, info = env.step(END_TURN)
    closing = env.episode.turns[-1].metrics
    assert closing["bfcl_checked"] and closing["bfcl_turn_valid"] is False
    assert closing["bfcl_error_type"] == "multi_turn:instance_state_mismatch"
    assert env.episode.turns[0].metrics["tool_ok"] is True
    assert info["turn"]["observation_role"] == "user"
    assert info["turn"]["observation"] == env.context.entry["question"][1][0]["content"]


def test_step_cap_force_quits_like_bfcl():
    env = BFCLEnv(category="multi_turn_base")
    env.reset(options={"index": 0})
    term = False
    steps = 0
    while not term and steps < 29:
        _, _, term, _, info = env.step("[pwd()]")
        steps += 1
    assert term and steps == 21  # bfcl-eval quits when the step count exceeds MAXIMUM_STEP_LIMIT (20)
    assert info["outcome"]["bfcl_valid"] is False
    assert info["outcome"]["error_type"] == "multi_turn:force_terminated"


def test_miss_func_turn_brings_the_held_out_functions_back():
    env = BFCLEnv(category="multi_turn_miss_func")
    env.reset(options={"index": 0})
    holdout = env.context.entry["missed_function"]
    turn = int(next(iter(holdout)))
    name = holdout[str(turn)][0]["name"]
    obs = ""
    for _ in range(turn):
        obs, *_ = env.step(END_TURN)
    assert name in obs and "I have updated some more functions" in obs


def test_episodes_of_the_same_entry_are_isolated_and_cleaned_up():
    a, b = BFCLEnv(category="multi_turn_base"), BFCLEnv(category="multi_turn_base")
    a.reset(options={"index": 0})
    b.reset(options={"index": 0})
    a.step("[mkdir(dir_name='only_in_a')]")
    obs_b, *_ = b.step("[ls()]")
    obs_a, *_ = a.step("[ls()]")
    assert "only_in_a" in obs_a and "only_in_a" not in obs_b
    key = a.session.key
    store = vars(bfcl()["multi_turn_utils"])
    assert any(n.startswith(key) for n in store)
    a.close()
    assert not any(n.startswith(key) for n in store)


def test_concurrent_replays_of_one_entry_stay_valid():
    results = []

    def replay():
        env = BFCLEnv(category="multi_turn_base")
        for _ in range(3):
            results.append(replay_ground_truth(env, 3)["outcome"]["bfcl_valid"])

    threads = [threading.Thread(target=replay) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 24


# ------------------------------------------------------------------ single-turn


def single_turn_parity(category: str, tool_format: str, limit: int | None) -> dict[bool, int]:
    env = BFCLEnv(category=category, tool_format=tool_format)
    counts = {True: 0, False: 0}
    n = env.num_items() if limit is None else min(env.num_items(), limit)
    for i in range(n):
        env.reset(options={"index": i})
        entry_id = env.context.entry["id"]
        calls = gt_calls(env.data.answers[entry_id])
        reverse = {v: k for k, v in env.context.name_map.items()}
        outputs = {name: render_single(c, tool_format, language_of(category), reverse)
                   for name, c in single_turn_outputs(calls, env.context.entry["function"]).items()}
        outputs["text_reply"] = "I would call a function here."
        for name, text in outputs.items():
            env.reset(options={"index": i})
            _, _, term, _, info = env.step(text)
            ref = official_single_turn(category, text, env.data.checker_entries[i], env.data.answers[entry_id],
                                       tool_format, env.context.name_map)
            assert term and info["outcome"]["bfcl_valid"] == ref["valid"], (entry_id, name, text, info["outcome"], ref)
            counts[ref["valid"]] += 1
    assert counts[True] >= n // 2 and counts[False] >= n, counts
    return counts


@pytest.mark.parametrize("category", SINGLE_TURN_AST)
@pytest.mark.parametrize("tool_format", ["prompting", "native"])
def test_single_turn_verdicts_equal_bfcl_eval_on_every_entry(category, tool_format):
    single_turn_parity(category, tool_format, limit=None)


@pytest.mark.parametrize("category", RELEVANCE)
@pytest.mark.parametrize("tool_format", ["prompting", "native"])
def test_relevance_verdicts_equal_bfcl_eval(category, tool_format):
    env = BFCLEnv(category=category, tool_format=tool_format)
    verdicts = []
    for i in range(min(env.num_items(), 15)):
        env.reset(options={"index": i})
        fn = env.context.entry["function"][0]["name"]
        shown = {v: k for k, v in env.context.name_map.items()}.get(fn, fn)
        for text in ("I cannot help with that request.", render_single([{fn: {}}], tool_format, "python", {fn: shown}),
                     "[]"):
            env.reset(options={"index": i})
            _, _, _, _, info = env.step(text)
            ref = official_single_turn(category, text, env.data.checker_entries[i], None, tool_format, env.context.name_map)
            assert info["outcome"]["bfcl_valid"] == ref["valid"], (env.context.entry["id"], text, info["outcome"], ref)
            verdicts.append(ref["valid"])
    assert True in verdicts and False in verdicts


# ------------------------------------------------------------------ hostile output


def test_decoder_refuses_code_bfcl_eval_would_evaluate(tmp_path):
    target = tmp_path / "pwned"
    payload = f"[calculate_area(base=__import__('os').system('touch {target}') + 1, height=2)]"
    assert unsafe_arithmetic(payload)
    env = BFCLEnv(category="simple_python")
    env.reset(options={"index": 0})
    _, _, term, _, info = env.step(payload)
    assert term and not target.exists()
    assert info["outcome"]["bfcl_valid"] is False and "refused" in info["turn"]["parse_error"]
    assert unsafe_arithmetic("[f(x=3 * 4 + 1, y='a' + 'b')]") is None
    assert unsafe_arithmetic("[f(x='a' * 10**10)]") and unsafe_arithmetic("[f(x=9**9**9)]")


def test_a_call_list_past_the_symbol_limit_is_refused_before_bfcl_eval_parses_it():
    """``f(a=1), `` to the action cap took bfcl-eval's decoder 2.3 s in one env.step; a chain of additions made
    the arithmetic check quadratic. Both are decided without reaching bfcl-eval now (times: benchmarks/hostile_actions.py)."""
    from turngym.envs.bfcl.calls import decode_prompting
    from turngym.envs.parsing import MAX_CALL_SYMBOLS, MAX_INPUT_CHARS

    env = BFCLEnv(category="simple_python")
    env.reset(options={"index": 0})
    _, _, term, _, info = env.step("f(a=1), " * (MAX_INPUT_CHARS // 8))
    assert term and info["outcome"]["bfcl_valid"] is False and "symbols" in info["turn"]["parse_error"]
    assert "symbols" in decode_prompting("[" + "f(a=1), " * (MAX_CALL_SYMBOLS // 4 + 1) + "]").error
    chain = "[f(a=" + "+".join(["1"] * 1500) + ")]"  # within the limit; deeper than the recursion limit
    assert decode_prompting(chain).error is not None or decode_prompting(chain).calls
    assert unsafe_arithmetic("[f(a=" + "+".join(["1"] * 300) + ", b=__import__('os'))]") is None  # no BinOp with a call
    assert unsafe_arithmetic("[f(a=" + "+".join(["1"] * 300) + "+__import__('os').getpid())]")


@pytest.mark.parametrize("action", [
    "[inspect.os.system(command='touch {t}')]",
    "[cd(folder={{'inspect.os.system': {{'command': 'touch {t}'}}}})]",
    "[open(file='{t}', mode='w')]",
    "[importlib.import_module(name='os')]",
])
def test_executor_refuses_calls_outside_the_task_functions(tmp_path, action):
    target = tmp_path / "pwned"
    env = BFCLEnv(category="multi_turn_base")
    env.reset(options={"index": 0})
    obs, _, term, _, info = env.step(action.format(t=target))
    assert not target.exists() and not term
    assert "Error during execution" in obs
    obs, *_ = env.step("[pwd()]")  # the episode goes on
    assert "current_working_directory" in obs


def test_malformed_native_calls_end_the_turn_with_a_clear_error():
    env = BFCLEnv(category="multi_turn_base", tool_format="native")
    env.reset(options={"index": 0})
    obs, _, term, _, info = env.step('<tool_call>{"name": "ls", "arguments": {</tool_call>')
    assert not term and "not valid JSON" in info["turn"]["parse_error"]
    assert decode_native("<tool_call>[1, 2]</tool_call>").error
    assert decode_native('<tool_call>{"name": "ls", "arguments": "{\\"a\\": 1}"}</tool_call>').calls == [{"ls": {"a": 1}}]


# ------------------------------------------------------------------ install


def test_bfcl_eval_writes_nothing_into_site_packages(tmp_path):
    import bfcl_eval

    site = Path(bfcl_eval.__file__).resolve().parents[1]
    before = {p.name for p in site.iterdir()}
    package_before = sorted(str(p) for p in Path(bfcl_eval.__file__).parent.rglob("*") if "__pycache__" not in str(p))
    code = textwrap.dedent("""
        import gymnasium, turngym
        env = gymnasium.make("turngym/BFCL-v0", category="multi_turn_base")
        env.reset(options={"index": 0}); env.step("[ls()]"); env.close()
        import sys; print("numpy", __import__("numpy").__version__)
    """)
    root = tmp_path / "bfclroot"
    env = {k: v for k, v in os.environ.items() if k != "BFCL_PROJECT_ROOT"}
    env["TURNGYM_BFCL_ROOT"] = str(root)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1].startswith("2."), "bfcl-eval must not pull numpy 1.x"
    assert {p.name for p in site.iterdir()} == before
    assert sorted(str(p) for p in Path(bfcl_eval.__file__).parent.rglob("*") if "__pycache__" not in str(p)) == \
        package_before
    assert (root / "result").is_dir() and (root / ".file_locks").is_dir()


# ------------------------------------------------------------------ with the rollout runner

TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these tools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_native_tool_calling_through_the_runner_keeps_the_token_invariant(tiny_chat_policy):
    """A fake scripted policy plays one entry's ground truth as Hermes calls through the runner."""
    import copy

    from bfcl_cases import render_native
    from conftest import FakeScriptedPolicy
    from turngym.agents.policy import SamplingParams
    from turngym.agents.runner import RolloutRunner, RolloutTask

    tok = copy.deepcopy(tiny_chat_policy.tokenizer)
    tok.chat_template = TOOLS_TEMPLATE
    probe = BFCLEnv(category="multi_turn_base", tool_format="native")
    probe.reset(options={"index": 1})
    gt = probe.data.answers[probe.context.entry["id"]]
    script = []
    for turn in gt:
        if turn:
            script.append(render_native(calls_from_strings(turn, probe.session.parameters)))
        script.append(END_TURN)
    probe.close()
    policy = FakeScriptedPolicy(tokenizer=tok, script=script)
    runner = RolloutRunner(policy, lambda: BFCLEnv(category="multi_turn_base", tool_format="native"),
                           SamplingParams(max_new_tokens=64), concurrency=1)
    [ep] = runner.run([RolloutTask(index=1)])
    assert ep.outcome["bfcl_valid"], ep.outcome
    assert ep.tools and "cd" in tok.decode(ep.prompt_ids)  # the tool schemas are in the prompt
    roles = [t.observation_role for t in ep.turns if t.observation is not None]
    assert "tool" in roles and "user" in roles
    # every generate call saw exactly prompt + a_1 + o_1 + ... (ids, never re-tokenised)
    ids = list(ep.prompt_ids)
    for call, turn in zip(policy.calls, ep.turns, strict=True):
        assert call == ids
        ids += turn.action_ids + (turn.observation_ids or [])
    tool_obs = next(t for t in ep.turns if t.observation_role == "tool")
    assert "<|im_start|>tool\n" in tok.decode(tool_obs.observation_ids)


def test_an_episode_cut_before_any_action_is_invalid_not_graded_on_stale_state():
    env = BFCLEnv(category="simple_python")
    env.reset(options={"index": 0})
    calls = gt_calls(env.data.answers[env.context.entry["id"]])
    _, _, _, _, info = env.step(render_single(calls, "prompting", "python"))
    assert info["outcome"]["bfcl_valid"]
    env.reset(options={"index": 0})
    env.end_episode("context_length")  # e.g. the prompt alone filled the model's context
    assert env.episode.outcome["bfcl_valid"] is False
    mt = BFCLEnv(category="multi_turn_base")
    mt.reset(options={"index": 0})
    mt.end_episode("context_length")
    assert mt.episode.outcome["error_type"] == "multi_turn:force_terminated" and mt.session is None


def test_final_answers_are_canonical_calls_so_verifier_free_rewards_can_vote():
    from turngym.rewards import get_reward

    env = BFCLEnv(category="simple_python")
    eps = []
    for text in ("[calculate_triangle_area(base=10, height=5)]", "[calculate_triangle_area(height=5, base=10)]",
                 "I cannot do that."):
        env.reset(options={"index": 0}, seed=0)
        env.step(text)
        eps.append(env.episode)
    assert eps[0].final_answer == eps[1].final_answer != eps[2].final_answer == "[]"
    assert get_reward("ttrl").score_group(eps).rewards == [[1.0], [1.0], [0.0]]
    mt = BFCLEnv(category="multi_turn_base")
    replay_ground_truth(mt, 0)
    calls = json.loads(mt.episode.final_answer)
    assert len(calls) == len(mt.context.entry["question"]) and calls[0][0] == "cd(folder='document')"


# ------------------------------------------------------------------ memory


def test_memory_questions_need_their_prerequisite_conversations_first(tmp_path):
    env = BFCLEnv(category="memory_kv", memory_dir=str(tmp_path))
    with pytest.raises(BFCLDataError, match="play the memory_kv_prereq items first"):
        env.reset(options={"index": 0})
    assert BFCLEnv(category="memory_kv_prereq").num_items() == 37 and env.num_items() == 155


@pytest.mark.parametrize("backend", ["memory_kv", "memory_rec_sum"])
def test_memory_prerequisites_write_snapshots_questions_read_them_and_verdicts_equal_bfcl_eval(tmp_path, backend):
    from turngym.envs.bfcl.reference import official_agentic

    pre = BFCLEnv(category=f"{backend}_prereq", memory_dir=str(tmp_path))
    ids = pre.data.manifest.item_ids
    chain = [i for i, x in enumerate(ids) if "-customer-" in x]
    store = ("[core_memory_add(key='first_name', value='Michael')]" if backend == "memory_kv"
             else "[memory_append(text='first name: Michael')]")
    for n, i in enumerate(chain):
        pre.reset(options={"index": i})
        if n == 1:  # the previous conversation's memory is in this one's prompt (bfcl-eval's core-memory dump)
            assert "Michael" in pre.episode.prompt[0]["content"]
        if n == 0:
            obs, *_ = pre.step(store)
            assert "error" not in obs.lower(), obs
        while not pre.episode.done:
            pre.step("Noted, thank you.")
        assert pre.episode.outcome == {"category": f"{backend}_prereq", "prereq": True}
    q = BFCLEnv(category=backend, memory_dir=str(tmp_path))
    idx = q.data.manifest.item_ids.index(f"{backend}_0-customer-0")
    for steps, expected in ((["{'answer': 'Michael', 'context': 'memory'}"], True),
                            (["[core_memory_list_keys()]" if backend == "memory_kv" else "[memory_retrieve()]",
                              "{'answer': 'I do not know', 'context': 'I do not know'}"], False),
                            (["[bogus_call()]"], False)):
        q.reset(options={"index": idx})
        assert "Michael" in q.episode.prompt[0]["content"]
        info = {}
        for text in steps:
            _, _, term, _, info = q.step(text)
        if not term:  # a reply that is all calls: the episode is cut here, with no final message
            q.end_episode("test")
            info = {"outcome": q.episode.outcome}
        ref = official_agentic(backend, steps, q.data.checker_entries[idx], q.context.ground_truth)
        assert info["outcome"]["bfcl_valid"] == ref["valid"] == expected, (steps, info["outcome"], ref)


def test_memory_prerequisites_out_of_order_are_refused(tmp_path):
    pre = BFCLEnv(category="memory_kv_prereq", memory_dir=str(tmp_path))
    ids = pre.data.manifest.item_ids
    second = next(i for i, x in enumerate(ids) if x.endswith("-customer-1"))
    with pytest.raises(BFCLDataError, match="no memory snapshot for scenario 'customer'"):
        pre.reset(options={"index": second})


def test_observations_are_capped_and_the_checker_keeps_the_full_results():
    """A 100,000-character call comes back in the result text; the agent is shown at most the cap."""
    from turngym.envs.bfcl.env import MAX_OBSERVATION_CHARS

    env = BFCLEnv(category="multi_turn_base")
    env.reset(options={"index": 0})
    obs, *_ = env.step(f"[echo(content='{'y' * 100_000}', file_name='big.txt')]")
    turn = env.episode.turns[-1]
    assert 100_000 > len(obs) <= MAX_OBSERVATION_CHARS + 60 and "more characters]" in obs
    assert turn.metrics["observation_truncated"] is True
    uncut = BFCLEnv(category="multi_turn_base", max_observation_chars=None)
    uncut.reset(options={"index": 0})
    obs, *_ = uncut.step(f"[echo(content='{'y' * 100_000}', file_name='big.txt')]")
    assert len(obs) > 100_000
    with pytest.raises(ValueError, match="max_observation_chars"):
        BFCLEnv(category="multi_turn_base", max_observation_chars=0)
