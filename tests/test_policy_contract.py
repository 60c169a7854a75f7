"""The declared Policy contract: every backend declares what it offers (stream, score), callers read the
declaration, and ``check_policy`` refuses a policy whose declaration and members disagree, in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from turngym.agents.checker import PolicyContractError, check_policy
from turngym.agents.hf import HFPolicy
from turngym.agents.openai_compat import OpenAICompatPolicy
from turngym.agents.policy import Generation, GenerationRequest, Policy, PolicyBase, PolicyError, SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.envs.calculator import CalculatorEnv


class Echo(PolicyBase):
    """A fake text backend (test only): answers every request with ``<answer>1</answer>``."""

    name, tokenizer = "echo", None

    def generate(self, requests, sampling):
        return [Generation(text="<answer>1</answer>") for _ in requests]


class ClaimsStream(Echo):
    """Lies: declares a stream it does not define."""

    supports_stream = True


class HidesStream(Echo):
    """Defines a stream it does not declare."""

    def stream(self, feed, deliver, sampling, max_rows, prepare=None):
        rows = list(feed(max_rows))
        while rows:
            key, _ = rows.pop(0)
            nxt = deliver(key, Generation(text="<answer>1</answer>"))
            rows += [(key, nxt)] if nxt is not None else []
            rows += feed(max_rows - len(rows))


class DropsReplies(Echo):
    """Declares a stream that delivers nothing."""

    supports_stream = True

    def stream(self, feed, deliver, sampling, max_rows, prepare=None):
        feed(max_rows)


class ClaimsScore(Echo):
    """Declares in-process scoring without a model."""

    supports_score = True


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_backends_declare_their_capabilities():
    assert HFPolicy.supports_stream and HFPolicy.supports_score
    assert OpenAICompatPolicy.supports_stream and not OpenAICompatPolicy.supports_score
    assert not PolicyBase.supports_stream and not PolicyBase.supports_score
    served = OpenAICompatPolicy(model="m", base_url="http://127.0.0.1:9/v1", server="openai", prompt_format="text")
    check_policy(served)  # static checks: no request is sent
    assert isinstance(served, Policy) and served.prompt_format == "text" and served.max_context is None


def test_integration_policies_declare_the_contract():
    from turngym.integrations.lm_eval_bridge import LMEvalPolicy
    from turngym.training.trainer import TRLGenerationPolicy

    check_policy(LMEvalPolicy(lm=None))
    config = SimpleNamespace(max_position_embeddings=64)
    trainer = SimpleNamespace(processing_class=object(), model=SimpleNamespace(config=config))
    trl = TRLGenerationPolicy(trainer)
    check_policy(trl)
    assert trl.max_context == 64 and not trl.supports_stream


def test_the_local_policy_honours_its_declaration_on_a_real_request(tiny_chat_policy):
    ids = tiny_chat_policy.tokenizer("What is 2 + 2?", add_special_tokens=False)["input_ids"]
    check_policy(tiny_chat_policy, request=GenerationRequest(prompt_ids=ids), sampling=SamplingParams(max_new_tokens=3))


@pytest.mark.parametrize("policy, says", [
    (ClaimsStream(), "declares supports_stream=True but defines no stream() method"),
    (HidesStream(), "defines stream() but declares supports_stream=False"),
    (ClaimsScore(), "declares supports_score=True but has no in-process model"),
])
def test_a_policy_that_lies_about_a_capability_is_refused(policy, says):
    with pytest.raises(PolicyContractError) as exc:
        check_policy(policy)
    assert says in one_line(exc)
    with pytest.raises(PolicyContractError) as exc:  # the runner reads the declaration, so it checks it first
        RolloutRunner(policy, CalculatorEnv)
    assert says in one_line(exc)


def test_a_stream_that_drops_replies_is_caught_when_exercised():
    check_policy(DropsReplies())  # the declaration and the members agree
    with pytest.raises(PolicyContractError) as exc:
        check_policy(DropsReplies(), request=GenerationRequest(messages=[{"role": "user", "content": "hi"}]))
    assert "delivered 0 replies for 1 request" in one_line(exc)


def test_an_undeclared_object_is_refused_naming_what_it_lacks():
    class Bare:
        name = "bare"

        def generate(self, requests, sampling):
            return []

    with pytest.raises(PolicyContractError) as exc:
        check_policy(Bare())
    text = one_line(exc)
    assert "tokenizer" in text and "supports_stream" in text and "name" not in text.split("declare")[1]


@pytest.mark.parametrize("member, value, says", [
    ("max_context", 0, "max_context must be None or a positive int"),
    ("prompt_format", "xml", "prompt_format must be one of"),
    ("name", "", "name must be a non-empty string"),
])
def test_bad_declared_values_are_refused(member, value, says):
    policy = Echo()
    setattr(policy, member, value)
    with pytest.raises(PolicyContractError, match=says):
        check_policy(policy)


def test_continuous_batching_reads_the_declaration():
    with pytest.raises(ValueError, match="needs a policy that streams"):
        RolloutRunner(Echo(), CalculatorEnv, batching="continuous")
    with pytest.raises(PolicyError, match="declares no stream"):
        Echo().stream(lambda free: [], lambda key, gen: None, SamplingParams(), 1)
    streamed = RolloutRunner(HidesStreamDeclared(), lambda: CalculatorEnv(max_turns=2), batching="continuous").run([0, 1])
    assert len(streamed) == 2 and all(e.turns[-1].action == "<answer>1</answer>" for e in streamed)


class HidesStreamDeclared(HidesStream):
    """The same stream, declared: the runner's continuous loop uses it."""

    supports_stream = True


def test_the_judge_reads_the_declaration():
    from turngym.rewards.scribe.llm import JSONLLM
    from turngym.rewards.scribe.reward import make_llm

    with pytest.raises(PolicyContractError, match="supports_score=True but has no in-process model"):
        JSONLLM(ClaimsScore())
    assert make_llm(Echo()).name == "echo"

    class OnlyGenerate:
        def generate(self, requests, sampling):
            return []

    with pytest.raises(TypeError, match="must be a JSONLLM, a policy or a model name"):
        make_llm(OnlyGenerate())


class FakeStreamWithoutPrepare(Echo):
    """A fake that declares a stream written before the contract's prepare=."""

    supports_stream = True

    def stream(self, feed, deliver, sampling, max_rows):
        feed(max_rows)


def test_a_stream_that_takes_no_prepare_is_refused():
    from turngym.agents.checker import PolicyContractError

    with pytest.raises(PolicyContractError, match="must take prepare="):
        check_policy(FakeStreamWithoutPrepare())
