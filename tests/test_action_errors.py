"""No single model output aborts an episode: every env turns an error in an action into an error
observation, records what raised on the turn, and the next step works; the episode still writes."""

import json
import sys

import gymnasium
import pytest

import turngym  # noqa: F401
from turngym.agents.policy import PolicyBase
from turngym.envs.base import ActionResult
from turngym.envs.calculator import CalculatorEnv
from turngym.episode import EpisodeWriter
from turngym.episode.reader import read_episodes

HUGE = "9" * 4400  # past Python's 4,300-digit int/str conversion limit
SURROGATE_REPLY = "I will answer \ud800 now \udfff"


def write_and_read(tmp_path, env):
    path = tmp_path / "episodes.jsonl"
    with EpisodeWriter(path) as w:
        w.write(env.unwrapped.episode)
    report = read_episodes(path, strict=True)
    assert report.episodes == [env.unwrapped.episode]
    return report.episodes[0]


# ----------------------------------------------------------------- the generic guard, on a named fake


class FakeBrokenCalculator(CalculatorEnv):
    """A fake (test only): the real calculator, whose tool raises on chosen actions like a buggy backend."""

    def act(self, action: str) -> ActionResult:
        if "json-garbage" in action:
            json.loads("\x00\x00\x00")  # the JSONDecodeError a desynchronised worker protocol raised
        if "huge-metric" in action:
            return ActionResult(observation="ok", metrics={"value": int(HUGE[:4000]) ** 2})  # cannot be JSON
        return super().act(action)

    def grade(self, episode):
        if "grade-bomb" in (episode.final_answer or ""):
            raise KeyError("grader exploded")
        return super().grade(episode)


def test_error_in_act_becomes_error_observation_and_next_step_works(tmp_path):
    env = FakeBrokenCalculator(max_turns=4)
    env.reset(seed=0, options={"index": 3})
    obs, reward, term, trunc, info = env.step("<calc>json-garbage</calc>")
    assert not term and not trunc and "JSONDecodeError" in obs
    err = info["turn"]["metrics"]["env_error"]
    assert err["type"] == "JSONDecodeError" and err["message"] and "test_action_errors.py" in err["where"]
    assert info["turn"]["parse_error"].startswith("JSONDecodeError")
    obs, *_ = env.step("<calc>2 * 3</calc>")
    assert obs == "\n<result>6</result>\n"
    ep = write_and_read(tmp_path, env)
    assert ep.turns[0].metrics["env_error"]["type"] == "JSONDecodeError"


def test_result_that_cannot_be_written_is_an_error_not_a_lost_episode(tmp_path):
    env = FakeBrokenCalculator(max_turns=4)
    env.reset(seed=0, options={"index": 3})
    obs, *_, info = env.step("huge-metric")
    assert info["turn"]["metrics"]["env_error"]["type"] == "ValueError" and "4300" in obs
    write_and_read(tmp_path, env)


def test_grading_error_gives_a_failing_verdict_with_the_error(tmp_path):
    env = FakeBrokenCalculator(max_turns=4)
    env.reset(seed=0, options={"index": 3})
    _, _, term, _, info = env.step("<answer>grade-bomb</answer>")
    assert term and info["outcome"]["correct"] is False
    assert info["outcome"]["grading_error"]["type"] == "KeyError"
    write_and_read(tmp_path, env)


def test_info_carries_no_gold_answers_but_the_episode_does():
    env = gymnasium.make("turngym/SearchQA-v0", dataset="nq")
    obs, info = env.reset(seed=0, options={"index": 0})
    golds = env.unwrapped.episode.task["answers"]
    assert golds and "answers" not in info["task"] and not any(g in json.dumps(info) for g in golds if len(g) > 3)
    env = gymnasium.make("turngym/MathCode-v0", dataset="math500")
    obs, info = env.reset(seed=0, options={"index": 0})
    assert set(info["task"]) & {"answers", "solution", "answer"} == set()
    assert env.unwrapped.episode.task["answers"]


# ----------------------------------------------------------------- the probes, on the real envs


def test_bfcl_single_turn_literal_over_4300_digits(tmp_path):
    env = gymnasium.make("turngym/BFCL-v0", category="simple_python")
    env.reset(seed=0, options={"index": 0})
    # a hex literal decodes (no decimal limit) and then cannot be written out as a decimal
    obs, _, term, _, info = env.step(f"[calculate_triangle_area(base=0x{HUGE}, height=5)]")
    assert term and info["outcome"]["bfcl_valid"] is False
    assert info["outcome"]["error_type"] == "ast_decoder:decoder_failed"
    assert info["turn"]["metrics"]["env_error"]["type"] == "ValueError"
    write_and_read(tmp_path, env)
    env.reset(seed=0, options={"index": 0})  # the next episode works
    *_, info = env.step("[calculate_triangle_area(base=10, height=5)]")
    assert info["outcome"]["bfcl_valid"] is True


@pytest.mark.parametrize("fmt,action", [
    ("prompting", f"[calculate_triangle_area(base={HUGE}, height=5)]"),
    ("prompting", f"[calculate_triangle_area(base=-{HUGE}.5e{HUGE}, height=5)]"),
    ("native", f'<tool_call>{{"name": "calculate_triangle_area", "arguments": {{"base": {HUGE}}}}}</tool_call>'),
    ("prompting", SURROGATE_REPLY),
    ("native", SURROGATE_REPLY),
])
def test_bfcl_hostile_single_turn_outputs_end_the_entry_as_failed(tmp_path, fmt, action):
    env = gymnasium.make("turngym/BFCL-v0", category="simple_python", tool_format=fmt)
    env.reset(seed=0, options={"index": 0})
    _, _, term, _, info = env.step(action)
    assert term and info["outcome"]["bfcl_valid"] is False
    write_and_read(tmp_path, env)


def test_bfcl_multi_turn_hostile_outputs_continue(tmp_path):
    env = gymnasium.make("turngym/BFCL-v0", category="multi_turn_base")
    env.reset(seed=0, options={"index": 0})
    for action in [f"[ls(a=0x{HUGE})]", f"[cd(folder={HUGE})]", SURROGATE_REPLY, "[ls()]"]:
        obs, _, term, trunc, info = env.step(action)
        assert isinstance(obs, str)
    assert "document" in info["turn"]["observation"] or term  # the last, ordinary call ran
    write_and_read(tmp_path, env)


def test_search_qa_surrogate_reply_and_query(tmp_path):
    env = gymnasium.make("turngym/SearchQA-v0", dataset="nq")
    env.reset(seed=0, options={"index": 0})
    obs, _, term, _, info = env.step(SURROGATE_REPLY)
    assert not term and "invalid" in obs
    obs, _, term, _, info = env.step("<search>capital \ud800 of France</search>")
    assert not term and obs.startswith("\n\n<information>")
    obs, _, term, _, info = env.step("<search>capital of France</search>")
    assert "Doc 1" in obs
    _, _, term, _, info = env.step("<answer>Paris \udc80</answer>")
    assert term and info["outcome"]["em"] == 0.0
    ep = write_and_read(tmp_path, env)
    assert ep.final_answer == "Paris \udc80"


def test_math_code_surrogate_and_garbage_on_the_worker_channel(tmp_path):
    """A cell that writes a garbage frame on the worker's pipes: the step returns an error
    observation (whatever layer catches it) and the episode goes on and is written."""
    env = gymnasium.make("turngym/MathCode-v0", dataset="gsm8k")
    env.reset(seed=0, options={"index": 0})
    garbage = ("```python\nimport os, stat, struct\nfor fd in range(3, 64):\n    try:\n"
               "        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n            os.write(fd, struct.pack('>I', 3) + b'abc')\n"
               "    except OSError:\n        pass\n```")
    obs, _, term, trunc, info = env.step(garbage)
    assert isinstance(obs, str) and not term
    obs, _, term, _, info = env.step("```python\nprint('\ud800', 6 * 7)\n```")
    assert isinstance(obs, str) and not term
    _, _, term, _, info = env.step(f"{SURROGATE_REPLY} \\boxed{{18}}")
    assert term and info["outcome"]["correct"] is True
    write_and_read(tmp_path, env)


# ----------------------------------------------------------------- a whole run with a surrogate-emitting model


class FakeEchoCalculator(CalculatorEnv):
    """A fake (test only): the calculator, but its observation quotes the agent's text back."""

    def act(self, action: str) -> ActionResult:
        result = super().act(action)
        if result.observation is not None:
            result.observation = f"you wrote: {action}\n{result.observation}"
        return result


class FakeSurrogatePolicy(PolicyBase):
    """A fake policy (test only) like a server whose JSON reply held a lone surrogate escape."""

    name = "fake-surrogate"
    max_context = None

    def __init__(self, tokenizer):
        self.tokenizer, self.n = tokenizer, 0

    def generate(self, requests, sampling):
        from turngym.agents.policy import Generation

        out = []
        for _ in requests:
            self.n += 1
            text = "<calc>1 + 1</calc> \ud800" if self.n % 2 else "<answer>2</answer> \udc80"
            ids = self.tokenizer(text.encode("utf-8", "replace").decode(), add_special_tokens=False)["input_ids"]
            out.append(Generation(text=text, token_ids=ids, logprobs=[0.0] * len(ids)))
        return out


def test_a_run_whose_model_emits_lone_surrogates_completes_and_is_written(tmp_path, tiny_chat_policy):
    from turngym.agents.policy import SamplingParams
    from turngym.agents.runner import RolloutRunner

    policy = FakeSurrogatePolicy(tiny_chat_policy.tokenizer)
    runner = RolloutRunner(policy, lambda: FakeEchoCalculator(max_turns=3), SamplingParams(max_new_tokens=8), k=2,
                           concurrency=2)
    path = tmp_path / "episodes.jsonl"
    finished = runner.run([0, 1], path)
    back = read_episodes(path, strict=True).episodes
    assert len(finished) == 4 and back == finished
    calc = [t for e in back for t in e.turns if t.action.startswith("<calc>")]
    assert calc and all(t.action.endswith("\ud800") and "\ufffd" in t.observation and t.observation_ids
                        for t in calc if t.observation is not None)
    assert any(t.observation is not None for t in calc)


def test_plain_json_vouches_only_for_what_json_writes():
    """The turn check skips the encoder for data ``plain_json`` vouches for: every such value must dump, and
    what it cannot vouch for (an int past the digit limit, a subclass, a non-str key) goes to the encoder."""
    import enum
    import math

    from turngym.episode import plain_json

    class Colour(enum.IntEnum):
        RED = 1

    vouched = ["x", "\ud800", True, None, math.nan, -math.inf, 10 ** 3000, -(10 ** 3000), [1, (2.5, {"k": [None]})],
               {"doc_ids": ["1", "2"], "n": 3}]
    for value in vouched:
        assert plain_json(value), value
        json.dumps(value)
    for value in [10 ** 4300, {"v": [10 ** 4300]}, {1: "x"}, Colour.RED, [b"bytes"], {"s": {1, 2}}, object()]:
        assert not plain_json(value), value
    with pytest.raises(ValueError):
        json.dumps(10 ** 4300)  # past the limit: the encoder raises, so a turn holding it is refused
    limit = sys.get_int_max_str_digits()
    try:  # a lower limit set by the user: what is past it is not vouched for
        sys.set_int_max_str_digits(1000)
        assert not plain_json(10 ** 2000)
        with pytest.raises(ValueError):
            json.dumps(10 ** 2000)
    finally:
        sys.set_int_max_str_digits(limit)
