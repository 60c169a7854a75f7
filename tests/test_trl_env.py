"""turngym envs through TRL's ``GRPOTrainer(environment_factory=...)``: stock TRL 1.16 trains on them
with real tool calls, each rollout is a turngym Episode, and the instance keeps TRL's contract
(trl/trainer/grpo_trainer.py: ``reset(**row)`` → text, public methods → tools with typed schemas,
``get_reward()`` → float)."""

import inspect
import os

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.utils import get_json_schema  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.chat_template_utils import qwen2_5_chat_template  # noqa: E402

from turngym.agents.tiny import tiny_model_dir  # noqa: E402
from turngym.integrations.trl import UntypedToolsError, environment_factory, episode_reward_func  # noqa: E402


def tool_methods(instance):
    """The tools TRL exposes for an instance: public functions of its class but reset/get_reward (as TRL lists them)."""
    return [getattr(instance, name) for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


def call(expression=None, answer=None):
    name, args = ("calculator", {"expression": expression}) if expression else ("answer", {"answer": answer})
    tool_call = {"type": "function", "function": {"name": name, "arguments": args}}
    return {"role": "assistant", "content": "", "tool_calls": [tool_call]}


@pytest.fixture(scope="module")
def tool_calling_model(tmp_path_factory):
    """The tiny random model, given Qwen2.5's tool-calling chat template (which TRL knows how to parse) and
    fitted on one right Calculator conversation (calculator call, then answer call), so that it emits real
    tool calls: a random model never writes a well-formed <tool_call> block."""
    out = tmp_path_factory.mktemp("tiny-tools")
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir(chat=True)))
    tok.chat_template = qwen2_5_chat_template
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir(chat=True)))
    env = environment_factory("Calculator-v0")()
    question = env.reset(index=0)
    tools = tool_methods(env)
    convo = [{"role": "user", "content": question}, call(expression="84 * 63 + 51")]
    after_tool = convo + [{"role": "tool", "name": "calculator", "content": "<result>5343</result>"}]
    full = after_tool + [call(answer="5343")]
    ids = tok.apply_chat_template(full, tools=tools, tokenize=True, return_dict=False)
    mask = [0] * len(ids)
    for upto, reply in ((convo[:1], convo), (after_tool, full)):  # train on the two assistant replies only
        start = len(tok.apply_chat_template(upto, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False))
        end = len(tok.apply_chat_template(reply, tools=tools, tokenize=True, return_dict=False))
        mask[start:end] = [1] * (end - start)
    x = torch.tensor([ids])
    labels = torch.where(torch.tensor([mask]) == 1, x, torch.full_like(x, -100))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(input_ids=x, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.01, loss.item()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def test_stock_trl_trains_two_steps_with_tool_calls_on_turngym_episodes(tmp_path, tool_calling_model):
    finished = []
    factory = environment_factory("Calculator-v0", on_episode=finished.append)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=400, max_steps=2, logging_steps=1, report_to="none", use_cpu=True,
                      learning_rate=1e-3, save_strategy="no", seed=0, temperature=0.5)
    tok = AutoTokenizer.from_pretrained(tool_calling_model)
    model = AutoModelForCausalLM.from_pretrained(tool_calling_model)
    trainer = GRPOTrainer(model=model, processing_class=tok, args=args, environment_factory=factory,
                          reward_funcs=[episode_reward_func("toolcall_dense")],
                          train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * 4,
                                                           "index": [0] * 4}))
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [r for r in trainer.state.log_history if "rewards/CalculatorToolEnv/mean" in r]
    assert len(logs) == 2
    assert all(r["tools/call_frequency"] > 0 for r in logs)  # TRL ran the env's tool methods
    # every rollout is a turngym episode of item 0, its turns the tool calls TRL made, graded by the env
    assert len(finished) == 4 and all(ep.task["index"] == 0 for ep in finished)
    answered = [ep for ep in finished if ep.terminated]
    assert answered, [ep.meta["trl"] for ep in finished]
    for ep in answered:
        assert ep.turns[-1].tool_calls[0]["name"] == "answer"
        assert ep.outcome["correct"] == (ep.final_answer.strip() == "5343")
    for ep in finished:  # one turn per tool call, in the env's own protocol (the calculator is its <calc> tag)
        names = {"calculator": "calc", "answer": "answer"}
        assert [names[c["name"]] for c in ep.meta["trl"]["tool_calls"]] == [t.tool_calls[0]["name"] for t in ep.turns]
        assert ep.turns[0].action == "<calc>84 * 63 + 51</calc>" and ep.turns[0].truth["tool_ok"].value is True
    rewards = [r["rewards/CalculatorToolEnv/mean"] for r in logs]
    expected = [sum(ep.outcome.get("correct", False) for ep in finished[2 * i:2 * i + 2]) / 2 for i in range(2)]
    assert rewards == pytest.approx(expected) and expected[0] > 0


def test_the_instance_keeps_trls_contract_and_records_the_episode():
    """Driven as TRL's _tool_call_loop drives it: reset(**row), tools called by name with keyword arguments,
    an error raised by a tool becomes the tool's result, then get_reward()."""
    factory = environment_factory("Calculator-v0", max_turns=3)
    env = factory()
    schemas = [get_json_schema(m)["function"] for m in tool_methods(env)]
    assert [s["name"] for s in schemas] == ["answer", "calculator"]
    assert schemas[1]["parameters"]["properties"]["expression"]["type"] == "string"
    assert env.reset(prompt=[{"role": "user", "content": ""}], index=0) == "What is 84 * 63 + 51?"
    tools = {m.__name__: m for m in tool_methods(env)}
    assert tools["calculator"](expression="84 * 63") == "<result>5292</result>"
    assert tools["calculator"](expression="import os") .startswith("<error>")
    assert "ended" in tools["answer"](answer="5292")
    with pytest.raises(RuntimeError, match="episode has ended"):
        tools["calculator"](expression="1+1")
    assert env.get_reward() == 0.0  # 5292 is wrong
    ep = env.episode
    assert [t.truth["tool_ok"].value for t in ep.turns[:2]] == [True, False]
    assert ep.outcome == {"correct": False} and ep.terminated
    # an instance is reused across batches: reset starts a new episode; an unanswered one is graded at get_reward
    env.reset(index=1)
    assert env.episode is not ep and env.get_reward() == 0.0 and env.episode.truncated


def test_turngym_rewards_score_the_rollouts_per_turn():
    envs = [environment_factory("Calculator-v0")() for _ in range(2)]
    for env, answer in zip(envs, ("5343", "1"), strict=True):
        env.reset(index=0)
        env.calculator(expression="84 * 63 + 51")
        env.answer(answer=answer)
    totals = episode_reward_func("outcome")(environments=envs, prompts=None, completions=None)
    assert totals == [1.0, 0.0]


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="unknown env 'turngym/Nope-v0'; turngym envs: .*Calculator-v0"):
        environment_factory("Nope-v0")
    with pytest.raises(UntypedToolsError, match="DelayedEffect-v0 declares no tools"):
        environment_factory("DelayedEffect-v0")
    with pytest.raises(UntypedToolsError, match="BFCL-v0 cannot be a TRL environment_factory env: its functions differ"):
        environment_factory("BFCL-v0")
    with pytest.raises(ValueError, match="force the start of replies"):
        environment_factory("SearchQA-v0", force_first_search=True, retriever=object())


def test_digits_plays_through_its_declared_reply_tool():
    env = environment_factory("Digits-v0")()
    env.reset(index=0)
    env.reply(text="12")
    env.reply(text="3a")
    assert env.episode.done and [t.action for t in env.episode.turns] == ["12", "3a"]
    assert env.episode.outcome["correct"] == pytest.approx(0.75)


def test_mathcode_runs_python_in_the_episodes_sandbox():
    env = environment_factory("MathCode-v0", dataset="gsm8k")()
    env.reset(index=0)
    assert env.run_python(code="x = 6 * 7\nprint(x)") == "```output\n42\n```"
    assert env.run_python(code="print(x + 1)") == "```output\n43\n```"  # the interpreter keeps its state
    env.answer(answer="18")  # gsm8k item 0's answer, graded by math-verify
    assert env.episode.terminated and env.episode.turns[0].metrics["exec_ok"] is True
    assert env.get_reward() == 1.0 and env.episode.final_answer == "18"


def test_searchqa_search_tool_is_the_envs_search(lucene_index):
    import gymnasium

    from turngym.corpora.lucene import LuceneRetriever

    retriever = LuceneRetriever(lucene_index([
        {"id": "p1", "title": "Paris", "text": "Paris is the capital and most populous city of France."},
        {"id": "p2", "title": "Berlin", "text": "Berlin is the capital of Germany."}]))
    task = {"question": "Where is the capital of France?", "answers": ["Paris"]}
    env = environment_factory("SearchQA-v0", dataset="nq", retriever=retriever)()
    assert env.reset(task=task) == task["question"]
    seen = env.search(query="capital of France")
    direct = gymnasium.make("turngym/SearchQA-v0", dataset="nq", retriever=retriever)
    direct.reset(options={"task": task})
    assert seen == direct.step("<search>capital of France</search>")[0].strip() and "Paris is the capital" in seen
    env.answer(answer="Paris")
    assert env.get_reward() == 1.0 and [t.tool_calls[0]["name"] for t in env.episode.turns][-1] == "answer"
