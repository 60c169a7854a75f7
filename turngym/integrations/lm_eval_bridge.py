"""lm-eval bridge: turngym's benchmarks as lm-eval tasks, played multi-turn by lm-eval's own backends.

- Tasks ``turngym_<dataset>`` (math500, aime24, aime25, gsm8k, nq, triviaqa, popqa, hotpotqa,
  2wikimultihopqa, musique, bamboogle, and ``bfcl_<category>`` for every BFCL-v0 category, in
  BFCL's prompting format) are YAML files over local JSONL docs, written by
  :func:`write_tasks` (``turngym lm-eval-tasks --out DIR``), so they run offline.
- The model ``turngym`` wraps any lm-eval backend (``backend=hf``, ``vllm``, ``local-completions``, ...)
  and plays each request as a full turngym episode: the backend's ``generate_until`` is called
  once per turn with the env's stop strings, tool results are appended, and the episode's
  outcome (graded by the env: math-verify, SQuAD EM/F1) is what lm-eval scores. Its reply is
  the episode's transcript (what the model wrote and what the tools answered) followed by a
  ``<turngym-result>`` JSON line, so lm-eval's logged samples show the model's text.
- Routes: lm-eval's Python API with the LM object (``lm_eval.simple_evaluate(model=TurnGymLM(...))``)
  or by name after :func:`make_turngym_lm_class`, and lm-eval's own command line as
  ``turngym lm-eval ...``. lm-eval 0.4 has no plugin discovery for models, so a bare ``lm_eval``
  process cannot know the name ``turngym``. A turngym task run under another model type
  (e.g. ``--model hf``) stops with an error saying so, instead of scoring 0.
- Task folders are portable: the YAML files name their JSONL docs relative to themselves.

What is comparable: the items and the grading are turngym's; single-turn lm-eval tasks
(e.g. ``gsm8k``) use other prompts, few-shot examples and answer extraction, and no tools,
so their numbers are not comparable with these. BFCL tasks use bfcl-eval's prompts, decoders and
checkers, so their accuracy is comparable with bfcl-eval's prompting-mode numbers per category. Within the bridge,
different lm-eval backends are comparable with each other and with ``turngym eval`` at temperature 0.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from turngym.agents.policy import Generation, GenerationRequest, PolicyBase, SamplingParams
from turngym.agents.tokenization import plain_prompt
from turngym.envs.bfcl.categories import CONVERSATION_CATEGORIES
from turngym.integrations.edges import reply_action


def _dataset_items(dataset: str) -> tuple[list[dict[str, Any]], str | None]:
    from turngym.corpora.datasets import load_dataset

    ds = load_dataset(dataset)
    return ds.items, ds.manifest.sha256


def _bfcl_items(category: str) -> tuple[list[dict[str, Any]], str | None]:
    from turngym.envs.bfcl.data import load_category

    data = load_category(category)
    items = [{"index": i, "id": e["id"], "answers": [""],
              "question": next((m["content"] for m in e["question"][0] if m["role"] == "user"), "")}
             for i, e in enumerate(data.entries)]
    return items, data.manifest.sha256


@dataclass(frozen=True)
class TaskFamily:
    """The bridge's tasks on one env, and how the bridge makes that env for a dataset."""

    env_id: str
    datasets: tuple[str, ...]
    items: Callable[[str], tuple[list[dict[str, Any]], str | None]]  # (items with index/id/question/answers, sha256)
    prefix: str = ""  # task name = "turngym_" + prefix + dataset
    dataset_arg: str = "dataset"
    bridge_turns: bool = True  # the bridge's max_turns and plain prompts; False: the env's own (BFCL: its
    # step cap, 20 per user turn, and its prompts)
    retrieves: bool = False  # takes the bridge's retriever

    def env_kwargs(self, dataset: str, max_turns: int | None = None, retriever: str | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {self.dataset_arg: dataset}
        if self.bridge_turns and max_turns is not None:
            kwargs.update(max_turns=max_turns, prompt_style="base")
        if self.retrieves and retriever:
            kwargs["retriever"] = retriever
        return kwargs


QA = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
BFCL_PREFIX = "bfcl_"
FAMILIES = (
    TaskFamily("turngym/MathCode-v0", ("math500", "aime24", "aime25", "gsm8k"), _dataset_items),
    TaskFamily("turngym/SearchQA-v0", QA, _dataset_items, retrieves=True),
    TaskFamily("turngym/BFCL-v0", CONVERSATION_CATEGORIES, _bfcl_items, prefix=BFCL_PREFIX, dataset_arg="category",
               bridge_turns=False),
)
FAMILY_OF_ENV = {f.env_id: f for f in FAMILIES}
FAMILY_OF_TASK = {f.prefix + d: f for f in FAMILIES for d in f.datasets}
ENV_FOR = {name: f.env_id for name, f in FAMILY_OF_TASK.items()}


def _declared_needs(family: TaskFamily, dataset: str) -> Any:
    """The env's declaration of its answers (``RewardNeeds``), from the env made as the bridge makes it."""
    import gymnasium

    import turngym  # noqa: F401 - registers the envs

    env = gymnasium.make(family.env_id, **family.env_kwargs(dataset))
    try:
        return env.unwrapped.reward_needs
    finally:
        env.close()


TASK_OPEN, TASK_CLOSE = "<turngym-task>", "</turngym-task>"
RESULT_OPEN, RESULT_CLOSE = "<turngym-result>", "</turngym-result>"


def write_tasks(out_dir: str | Path, datasets: Sequence[str] | None = None, limit: int | None = None) -> list[str]:
    """Write lm-eval task YAMLs and their JSONL docs; returns the task names."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for name in datasets or list(ENV_FOR):
        if name not in ENV_FOR:
            raise ValueError(f"no turngym lm-eval task for {name!r}; choose from {sorted(ENV_FOR)}")
        family = FAMILY_OF_TASK[name]
        dataset = name[len(family.prefix):]
        all_items, sha256 = family.items(dataset)
        items = all_items[:limit] if limit else all_items
        needs = _declared_needs(family, dataset)
        docs = out / f"turngym_{name}.jsonl"
        with docs.open("w") as fh:
            for it in items:
                ref = {"env": family.env_id, "dataset": dataset, "index": it["index"]}
                fh.write(json.dumps({"turngym_ref": json.dumps(ref), "id": it["id"], "question": it["question"],
                                     "answers": it["answers"], "bfcl": needs.answer_kind == "calls"},
                                    ensure_ascii=False) + "\n")
        metrics = ["em", "f1"] if needs.answer_kind == "qa_text" else ["acc"]  # text answers: EM and F1
        task = {
            "task": f"turngym_{name}",
            "tag": ["turngym"],
            "custom_dataset": "!function turngym_lm_eval_utils.load_docs",
            "dataset_kwargs": {"docs_file": docs.name},
            "test_split": "test",
            "output_type": "generate_until",
            "doc_to_text": "{{question}}\n" + TASK_OPEN + "{{turngym_ref}}" + TASK_CLOSE,
            "doc_to_target": "{{answers[0]}}",
            "generation_kwargs": {"until": [], "do_sample": False},
            "process_results": "!function turngym_lm_eval_utils.process_results",
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in metrics],
            "metadata": {"version": 1, "manifest_sha256": sha256},
        }
        text = yaml.safe_dump(task, sort_keys=False, allow_unicode=True)
        for fn in ("process_results", "load_docs"):
            text = text.replace(f"'!function turngym_lm_eval_utils.{fn}'", f"!function turngym_lm_eval_utils.{fn}")
        (out / f"turngym_{name}.yaml").write_text(text)
        names.append(task["task"])
    (out / "turngym_lm_eval_utils.py").write_text(
        '"""Written by turngym: docs beside this file; lm-eval scores the outcome the turngym env graded."""\n'
        "from pathlib import Path\n\n"
        "from turngym.integrations.lm_eval_bridge import process_results, read_docs  # noqa: F401\n\n\n"
        "def load_docs(docs_file, **_):\n"
        "    return read_docs(Path(__file__).with_name(docs_file))\n")
    return names


def read_docs(path: Path) -> dict[str, Any]:
    """A task's docs as lm-eval's ``custom_dataset`` expects them: ``{"test": Dataset}``."""
    import datasets

    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return {"test": datasets.Dataset.from_list(rows)}


def parse_reply(text: str) -> dict[str, Any]:
    """The result a ``turngym`` model reply ends with; a clear error for any other model's text."""
    start = text.rfind(RESULT_OPEN)
    end = text.rfind(RESULT_CLOSE)
    if start < 0 or end < start:
        raise ValueError("this is a turngym task: a multi-turn episode that only the 'turngym' lm-eval model can play; "
                         "run it with --model turngym --model_args backend=hf,pretrained=MODEL (or through "
                         "`turngym lm-eval`), not with a plain generation model")
    return json.loads(text[start + len(RESULT_OPEN):end])


def _reply(transcript: str, result: dict[str, Any]) -> str:
    return f"{transcript}\n{RESULT_OPEN}{json.dumps(result, ensure_ascii=False)}{RESULT_CLOSE}"


def _task_ref(context: str) -> dict[str, Any]:
    start = context.rfind(TASK_OPEN)
    end = context.rfind(TASK_CLOSE)
    if start < 0 or end < start:
        raise ValueError("request has no turngym task reference: the 'turngym' model plays only turngym tasks "
                         "(write them with `turngym lm-eval-tasks`)")
    return json.loads(context[start + len(TASK_OPEN):end])


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """Scores the outcome the env graded, read from the ``turngym`` model's reply."""
    outcome = parse_reply(results[0]).get("outcome") or {}
    if "correct" in outcome:
        return {"acc": float(outcome["correct"])}
    if "bfcl_valid" in outcome or doc.get("bfcl"):
        return {"acc": float(bool(outcome.get("bfcl_valid")))}
    return {"em": float(outcome.get("em", 0.0)), "f1": float(outcome.get("f1", 0.0))}


class LMEvalPolicy(PolicyBase):
    """A turngym Policy over an lm-eval LM's ``generate_until`` (text in, text out, no ids)."""

    tokenizer = None

    def __init__(self, lm: Any, name: str = "lm-eval"):
        self.lm, self.name = lm, name

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        from lm_eval.api.instance import Instance

        insts = []
        for i, req in enumerate(requests):
            context = req.prompt_text if req.prompt_text is not None else _render(req.messages or [])
            gen = {"until": list(sampling.stop) or ["<|__never__|>"],
                   "max_gen_toks": req.max_new_tokens or sampling.max_new_tokens,
                   "do_sample": sampling.temperature > 0}
            if sampling.temperature > 0:
                gen["temperature"] = sampling.temperature
            insts.append(Instance(request_type="generate_until", doc={}, arguments=(context, gen), idx=i))
        texts = self.lm.generate_until(insts)
        # lm-eval backends drop the stop string they stopped at and do not say why they stopped
        return [Generation(text=reply_action(t, None, sampling.stop)) for t in texts]


def _render(messages: list[dict[str, str]]) -> str:
    """Plain-text transcript: prompt contents, then the assistant's text so far (inline observations)."""
    if messages and messages[-1]["role"] == "assistant":
        return plain_prompt(messages[:-1]) + messages[-1]["content"]
    return plain_prompt(messages)


def _transcript(episode: Any) -> str:
    """What the model wrote, turn by turn, with the tool results it saw in between."""
    parts = []
    for turn in episode.turns:
        parts.append(turn.action)
        if turn.observation:
            parts.append(turn.observation)
    return "\n".join(parts)


def make_turngym_lm_class():
    """Build and register the ``turngym`` lm-eval model (lm-eval is imported only when used)."""
    from turngym.extras import require

    require("the lm-eval bridge")
    import lm_eval.models  # noqa: F401 - registers the built-in backends (hf, vllm, ...)
    from lm_eval.api.model import LM
    from lm_eval.api.registry import get_model, register_model

    class TurnGymLM(LM):
        def __init__(self, backend: str = "hf", max_turns: int = 4, max_new_tokens: int = 256, concurrency: int = 8,
                     retriever: str | None = None, **backend_args: Any):
            super().__init__()
            if isinstance(backend_args.get("pretrained"), str):  # turngym's names (e.g. 'default') and GGUF files
                from turngym.agents.loading import resolve_model_dir

                backend_args["pretrained"] = resolve_model_dir(backend_args["pretrained"])
            if backend == "hf" and "device" not in backend_args:  # lm-eval's hf backend assumes CUDA
                import torch

                backend_args["device"] = "cuda" if torch.cuda.is_available() else "cpu"
            self.backend = get_model(backend).create_from_arg_obj(backend_args)
            self.max_turns, self.max_new_tokens, self.concurrency = int(max_turns), int(max_new_tokens), int(concurrency)
            self.retriever = retriever
            self.policy = LMEvalPolicy(self.backend, name=f"lm-eval:{backend}")

        @classmethod
        def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> TurnGymLM:
            from lm_eval.utils import simple_parse_args_string

            args = simple_parse_args_string(arg_string)
            args.update({k: v for k, v in (additional_config or {}).items()
                         if v is not None and k not in ("batch_size", "max_batch_size", "device")})
            return cls(**args)

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            import gymnasium

            import turngym  # noqa: F401
            from turngym.agents.runner import RolloutRunner, RolloutTask

            refs = [_task_ref(r.args[0]) for r in requests]
            replies: list[str] = [""] * len(refs)
            by_env: dict[tuple[str, str], list[int]] = {}
            for i, ref in enumerate(refs):
                by_env.setdefault((ref["env"], ref["dataset"]), []).append(i)
            for (env_id, dataset), rows in by_env.items():
                if env_id not in FAMILY_OF_ENV:
                    raise ValueError(f"a turngym task names env {env_id!r}, which the bridge does not play; "
                                     f"it plays {sorted(FAMILY_OF_ENV)}")
                kwargs = FAMILY_OF_ENV[env_id].env_kwargs(dataset, self.max_turns, self.retriever)
                runner = RolloutRunner(self.policy, functools.partial(gymnasium.make, env_id, **kwargs),
                                       SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0),
                                       concurrency=self.concurrency)
                episodes = {e.task["index"]: e for e in runner.run([RolloutTask(index=refs[i]["index"]) for i in rows])}
                for i in rows:
                    ep = episodes[refs[i]["index"]]
                    replies[i] = _reply(_transcript(ep), {"final_answer": ep.final_answer, "outcome": ep.outcome,
                                                          "turns": len(ep.turns)})
            return replies

        def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
            raise NotImplementedError("turngym tasks are generative multi-turn episodes; use generate_until tasks")

        def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
            raise NotImplementedError("turngym tasks are generative multi-turn episodes; use generate_until tasks")

    try:
        register_model("turngym")(TurnGymLM)
    except (AssertionError, ValueError):  # already registered in this process
        pass
    return TurnGymLM


def main(argv: Sequence[str] | None = None) -> None:
    """``turngym lm-eval ...``: lm-eval's own command line with the ``turngym`` model registered."""
    import sys

    make_turngym_lm_class()
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval"] + list(argv if argv is not None else sys.argv[1:])
    cli_evaluate()
