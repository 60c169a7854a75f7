"""MathCode-v0: tool-integrated math reasoning with a Python interpreter (ToRL / SimpleTIR style).

The agent writes ```python blocks (or ``<code>`` tags); each runs, in order, in a
stateful sandboxed interpreter owned by the episode, and the output comes back in a
```output block appended to the agent's text. A ``\\boxed{}`` answer ends the episode
(the last box counts) and is graded with math-verify.

``sandbox`` names the backend that runs the cells (``"local"``: the warm bubblewrap pool;
``"sandboxfusion:URL"``: a SandboxFusion server; see docs/sandbox.md) or is a
:class:`~turngym.sandbox.base.CodeSandbox` object; the env depends only on that protocol.
"""

from __future__ import annotations

from typing import Any

from turngym.corpora.datasets import Dataset, load_dataset
from turngym.envs.base import ActionResult, TextEnv
from turngym.envs.parsing import parse_code_blocks
from turngym.envs.tools import EnvTool, ToolParam
from turngym.episode import RewardNeeds
from turngym.grading.math_answers import default_grader, extract_boxed, grade_answer
from turngym.sandbox.base import CodeSandbox, CodeSession, SandboxLimits
from turngym.sandbox.registry import parse_spec, shared_sandbox

CHAT_SYSTEM = (
    "Solve the math problem step by step. You may run Python: write code in a ```python block and "
    "stop; its output will be shown in an ```output block. Variables persist between blocks. "
    "Put the final answer in \\boxed{}."
)
BASE_TEMPLATE = (
    "Solve the following problem step by step. You can write Python code in ```python ... ``` blocks; "
    "the output of the code will be given in ```output ... ``` blocks. Put the final answer within \\boxed{{}}.\n\n"
    "Problem: {question}\n\nSolution:"
)

class MathCodeEnv(TextEnv):
    prompt_styles = ("chat", "base")
    env_name = "turngym/MathCode-v0"
    observation_role = None
    stop = ("```output",)
    reward_needs = RewardNeeds(answer_kind="math", answer_cue="boxed", tool_ok_metrics=("exec_ok",))
    truth_keys = ("feeds_answer",)  # the cell ran and printed the final answer (set at grading)

    def __init__(self, dataset: str = "math500", split: str | None = None, max_turns: int = 4,
                 prompt_style: str = "chat", max_output_chars: int = 2000,
                 sandbox: str | CodeSandbox = "local", limits: SandboxLimits | None = None,
                 grading_timeout_s: float = 5.0, max_code_blocks: int = 16, render_mode: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if prompt_style not in self.prompt_styles:
            raise ValueError(f"prompt_style must be 'chat' or 'base', got {prompt_style!r}")
        self.data: Dataset = load_dataset(dataset, split)
        self.dataset_name = self.data.manifest.dataset
        self.prompt_style = prompt_style
        self.max_output_chars = int(max_output_chars)
        self.limits = limits or SandboxLimits()
        if isinstance(sandbox, str):
            parse_spec(sandbox)  # a wrong name is an error now, not at the first cell
        self._sandbox_spec = sandbox  # a backend name (see turngym.sandbox.registry) or a sandbox object
        self.grading_timeout_s = grading_timeout_s
        if max_code_blocks < 1:
            raise ValueError(f"max_code_blocks must be >= 1, got {max_code_blocks}")
        self.max_code_blocks = int(max_code_blocks)  # cells run per action: an action of 10,000 blocks runs 16
        self._session: CodeSession | None = None
        self.check_remote_sandbox()
        default_grader().warm()  # a grader process is ready before the first answer (in the background)

    def check_remote_sandbox(self) -> None:
        """A remote backend (SandboxFusion) answers a test cell now, or the env is not built: one line
        naming the server and the reason, not a run whose every cell is an error observation."""
        sandbox = self._sandbox_spec
        if isinstance(sandbox, str):
            if parse_spec(sandbox)[0] == "local":  # the local pool starts its workers on first use
                return
            sandbox = shared_sandbox(sandbox, self.limits)
        check = getattr(sandbox, "check_ready", None)
        if check is not None:
            check()

    def check_ready(self) -> None:
        self.check_remote_sandbox()

    @property
    def manifest(self):
        return self.data.manifest

    def num_items(self) -> int:
        return len(self.data)

    def get_item(self, index: int) -> dict[str, Any]:
        return dict(self.data[index])

    def declared_tools(self) -> tuple[EnvTool, ...]:
        return (EnvTool("run_python", "Run Python code in a sandboxed interpreter; variables persist between calls. "
                        "Returns what it printed.", (ToolParam("code", str, "The Python code to run."),),
                        lambda args: f"```python\n{args['code']}\n```"),
                EnvTool("answer", "Give the final answer to the problem; this ends the episode.",
                        (ToolParam("answer", str, "The final answer, as a LaTeX expression (what would go inside "
                                                  "\\boxed{})."),),
                        lambda args: f"\\boxed{{{args['answer']}}}", ends_episode=True))

    def make_prompt(self, task: dict[str, Any]) -> list[dict[str, str]]:
        if self.prompt_style == "base":
            return [{"role": "user", "content": BASE_TEMPLATE.format(question=task["question"])}]
        return [{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": task["question"]}]

    def on_reset(self, task: dict[str, Any]) -> None:
        self._session = None  # started lazily: episodes that never run code cost no worker

    def _sandbox(self) -> CodeSession:
        if self._session is None:
            spec = self._sandbox_spec
            sandbox = shared_sandbox(spec, self.limits) if isinstance(spec, str) else spec
            self._session = sandbox.session()
        if self.episode is not None:
            self.episode.meta["sandbox"] = self._session.describe()  # which backend and isolation level ran
        return self._session

    def on_close_episode(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def act(self, action: str) -> ActionResult:
        boxed = extract_boxed(action)
        if boxed is not None:
            return ActionResult(observation=None, terminated=True, final_answer=boxed,
                                metrics={"code_blocks": 0, "boxed": True})
        parsed = parse_code_blocks(action)
        if parsed.error:
            msg = f"{parsed.error}. Write code in a ```python block, or give the final answer in \\boxed{{}}."
            return ActionResult(observation=f"\n```output\n{msg}\n```\n", parse_error=parsed.error,
                                metrics={"code_blocks": 0, "boxed": False})
        outputs, statuses = [], []
        tool_ms = 0.0
        session = self._sandbox()
        ran = parsed.calls[: self.max_code_blocks]
        skipped = len(parsed.calls) - len(ran)
        for call in ran:
            res = session.run(call["arguments"]["code"], self.limits)
            statuses.append(res.status)
            tool_ms += res.elapsed_s * 1000.0
            outputs.append(res.render(self.max_output_chars))
        if skipped > 0:
            outputs.append(f"[only the first {self.max_code_blocks} code blocks of a reply run; {skipped} more were not run]")
        text = "\n".join(o for o in outputs if o) or "(no output)"
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + "\n... [output truncated]"
        lead = "\n" if action.rstrip().endswith("```output") else "\n```output\n"
        return ActionResult(
            observation=f"{lead}{text}\n```\n", tool_calls=ran,
            metrics={"code_blocks": len(ran), "exec_status": statuses,
                     "exec_ok": all(s == "ok" for s in statuses), "output": text[:500], "boxed": False},
            tool_ms=tool_ms,
        )

    def grade(self, episode) -> dict[str, Any]:
        verdict = grade_answer(episode.final_answer, list(episode.task.get("answers", [])), self.grading_timeout_s)
        answer = (episode.final_answer or "").strip()
        for turn in episode.turns:  # per-turn truth: ran cleanly and its output holds the answer
            if turn.metrics.get("code_blocks"):
                out = str(turn.metrics.get("output", ""))
                self.set_truth(turn, "feeds_answer", bool(turn.metrics.get("exec_ok") and answer and answer in out))
        return {"correct": verdict.correct, "graded": verdict.graded, "grading": verdict.reason,
                "answered": episode.final_answer is not None}
