"""Continuous batching and the stop-string checker, on tiny random transformers models.

The static path (one ``generate`` call per tick) is the reference: for greedy decoding the
continuous path must give the same episodes, and both must keep the token invariant."""

import dataclasses

import pytest

from turngym.agents.hf import TailStopStrings
from turngym.agents.policy import GenerationRequest, PolicyBase, SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.envs.base import ActionResult
from turngym.envs.calculator import CalculatorEnv


class UnevenCalculator(CalculatorEnv):
    """Calculator whose episodes end after 1, 2 or 3 turns (by item index): uneven lengths."""

    def act(self, action):
        result = super().act(action)
        if len(self.episode.turns) + 1 >= 1 + self.episode.task["index"] % 3:
            return ActionResult(observation=None, terminated=True, final_answer="0",
                                parse_error=result.parse_error, tool_calls=result.tool_calls, metrics=result.metrics)
        return result


def _comparable(ep):
    d = dataclasses.asdict(ep)
    d["meta"].pop("wall_ms", None)
    logprobs = []
    for t in d["turns"]:
        t.pop("latency_ms", None)
        logprobs.append(t.pop("action_logprobs"))
    return d, logprobs


class Recorder(PolicyBase):
    """Wraps a policy's ``stream``: records every request's ids as the model saw them."""

    supports_stream = True

    def __init__(self, policy):
        self.policy, self.seen, self.forwards = policy, [], 0
        self.name, self.tokenizer, self.max_context = policy.name, policy.tokenizer, policy.max_context

    def stream(self, feed, deliver, sampling, max_rows, prepare=None):
        def rec_feed(n):
            out = feed(n)
            self.seen.extend(list(r.prompt_ids) for _, r in out)
            return out

        def rec_deliver(key, gen):
            req = deliver(key, gen)
            if req is not None:
                self.seen.append(list(req.prompt_ids))
            return req

        self.forwards += self.policy.stream(rec_feed, rec_deliver, sampling, max_rows, prepare)


@pytest.mark.parametrize("stop", [(), ("\n\n",)])
def test_continuous_episodes_equal_the_static_ones_for_greedy_decoding(tiny_chat_policy, stop):
    def play(batching):
        policy = Recorder(tiny_chat_policy) if batching == "continuous" else tiny_chat_policy
        runner = RolloutRunner(policy, lambda: UnevenCalculator(max_turns=3),
                               SamplingParams(max_new_tokens=12, temperature=0, stop=stop), k=2, concurrency=3,
                               batching=batching)
        return policy, {e.id: e for e in runner.run(range(6))}

    _, static = play("static")
    rec, cont = play("continuous")
    assert static.keys() == cont.keys() and len(static) == 12
    assert sorted({len(e.turns) for e in static.values()}) == [1, 2, 3]  # uneven episodes
    for key in static:
        (a, lp_a), (b, lp_b) = _comparable(static[key]), _comparable(cont[key])
        assert a == b  # text, token ids, observations, outcome: identical
        for x, y in zip(lp_a, lp_b, strict=True):  # logprobs: same tokens, read in other shapes (float rounding)
            assert x == pytest.approx(y, abs=1e-5)
    for ep in cont.values():  # the token invariant: the ids of each request are the episode's own
        ids = ep.token_layout().ids
        prefix = list(ep.prompt_ids)
        for t in ep.turns:
            assert prefix in rec.seen
            prefix += t.action_ids + (t.observation_ids or [])
        assert prefix == ids


def test_greedy_samples_of_a_group_are_generated_once(tiny_chat_policy):
    class Counting(PolicyBase):
        def __init__(self, policy):
            self.policy, self.requests = policy, 0
            self.name, self.tokenizer, self.max_context = policy.name, policy.tokenizer, policy.max_context

        def generate(self, reqs, sampling):
            self.requests += len(reqs)
            return self.policy.generate(reqs, sampling)

    def static(k):
        pol = Counting(tiny_chat_policy)
        eps = RolloutRunner(pol, lambda: CalculatorEnv(max_turns=2), SamplingParams(max_new_tokens=6, temperature=0),
                            k=k, concurrency=4).run([0])
        return pol.requests, eps

    def continuous(k):
        rec = Recorder(tiny_chat_policy)
        eps = RolloutRunner(rec, lambda: CalculatorEnv(max_turns=2), SamplingParams(max_new_tokens=6, temperature=0),
                            k=k, concurrency=4, batching="continuous").run([0])
        return rec.forwards, eps

    for play in (static, continuous):
        one, [single] = play(1)
        four, group = play(4)
        assert four == one  # k=4 costs what k=1 costs
        assert all([t.action_ids for t in e.turns] == [t.action_ids for t in single.turns] for e in group)
        assert len({e.id for e in group}) == 4


def test_a_finished_row_is_refilled_while_the_others_decode(tiny_chat_policy):
    tok = tiny_chat_policy.tokenizer
    prompt = tok("What is 2 + 2?", add_special_tokens=False)["input_ids"]
    queue = [("short-1", 2), ("long", 10), ("short-2", 2), ("short-3", 2)]
    fed, done = [], []

    def feed(n):
        out = []
        while queue and len(out) < n:
            key, cap = queue.pop(0)
            fed.append(key)
            out.append((key, GenerationRequest(prompt_ids=prompt + [100 + len(fed)], max_new_tokens=cap)))
        return out

    def deliver(key, gen):
        done.append((key, len(gen.token_ids)))
        return None

    tiny_chat_policy.stream(feed, deliver, SamplingParams(max_new_tokens=10, temperature=0), max_rows=2)
    assert [k for k, _ in done] == ["short-1", "short-2", "short-3", "long"]
    assert dict(done) == {"short-1": 2, "long": 10, "short-2": 2, "short-3": 2}


def test_stop_strings_cut_exactly_where_the_string_ends_and_the_checker_is_reused(tiny_chat_policy):
    tok = tiny_chat_policy.tokenizer
    prompt = tok("What is 12 * 34 + 5?", add_special_tokens=False)["input_ids"]
    free = tiny_chat_policy.generate([GenerationRequest(prompt_ids=prompt)], SamplingParams(max_new_tokens=16, temperature=0))[0]
    stop = free.text[3:5]  # a string the greedy output is known to contain
    assert stop
    first = tiny_chat_policy.stop_strings((stop,))
    [gen] = tiny_chat_policy.generate([GenerationRequest(prompt_ids=prompt)],
                                      SamplingParams(max_new_tokens=16, temperature=0, stop=(stop,)))
    assert gen.finish_reason == "stop" and gen.text.endswith(stop)
    assert gen.text == free.text[: free.text.index(stop) + len(stop)]
    assert gen.token_ids == free.token_ids[: len(gen.token_ids)]
    tiny_chat_policy.generate([GenerationRequest(prompt_ids=prompt)],
                              SamplingParams(max_new_tokens=4, temperature=0, stop=(stop,)))
    assert tiny_chat_policy.stop_strings((stop,)) is first  # built once, reused by later calls


def test_tail_stop_check_fires_at_the_token_where_a_full_decode_first_holds_the_string(gemma_tokenizer):
    """On real text (Gemma's 262k SentencePiece vocabulary, multi-byte characters): the tail
    check first fires at the same token as a check of the whole decoded text."""
    stops = ("</search>", "</answer>", "\n\nQuestion:", "日本")
    texts = ["Let me look. é ü <search>capital of France</search> more",
             "The answer is <answer> Paris </answer>",
             "ok\n\nQuestion: next one",
             "ä ö 東京 and 日本 too", "no stop string here at all </sear ch>"]
    checker = TailStopStrings(gemma_tokenizer, stops)
    for text in texts:
        ids = gemma_tokenizer(text, add_special_tokens=False)["input_ids"]
        full = next((n for n in range(1, len(ids) + 1)
                     if any(s in gemma_tokenizer.decode(ids[:n]) for s in stops)), None)
        tail = next((n for n in range(1, len(ids) + 1) if checker.hit(ids[:n])), None)
        assert tail == full, text
        assert (full is None) == (text == texts[-1])


def test_sliding_window_models_decode_the_same_in_both_modes(tmp_path):
    """Gemma 3's layer mix (sliding + full attention) with a window far below the context."""
    import torch
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    from turngym.agents.hf import HFPolicy
    from turngym.agents.tiny import tiny_model_dir

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir(chat=True)))
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=6,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=1024,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    policy = HFPolicy(model=Gemma3ForCausalLM(cfg).eval(), tokenizer=tok, name="tiny-gemma3")

    def play(batching):
        runner = RolloutRunner(policy, lambda: UnevenCalculator(max_turns=3),
                               SamplingParams(max_new_tokens=10, temperature=0), k=1, concurrency=2, batching=batching)
        return {e.id: _comparable(e)[0] for e in runner.run(range(5))}

    static, cont = play("static"), play("continuous")
    assert static == cont


def test_rollout_command_takes_continuous_batching(tmp_path):
    import subprocess
    import sys

    from turngym.agents.tiny import tiny_model_dir
    from turngym.episode.reader import read_episodes

    texts = {}
    for batching in ("static", "continuous"):
        out = tmp_path / f"{batching}.jsonl"
        proc = subprocess.run([sys.executable, "-m", "turngym.cli", "rollout", "--model", str(tiny_model_dir(chat=True)),
                               "--env", "Calculator-v0", "--limit", "3", "--k", "2", "--max-turns", "2",
                               "--max-new-tokens", "6", "--temperature", "0", "--batching", batching, "--out", str(out)],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        # keyed by the id within its run (each run prefixes its own id)
        texts[batching] = {e.id.split("|", 1)[1]: [t.action for t in e.turns] for e in read_episodes(out).episodes}
    assert len(texts["static"]) == 6 and texts["static"] == texts["continuous"]
