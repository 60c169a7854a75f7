"""Token ids for prompts and observations, so an episode's ids are exactly what the model saw.

The rollout runner conditions every turn on ``prompt_ids + a_1 + o_1 + ... + o_{t-1}``
(ids, never re-tokenised text). This module decides the ids of the prompt and of each
observation: with a chat template, an observation sent as a message is the template's
own text between the assistant's turn and the next generation prompt (found by
rendering a two-message probe conversation), preceded by whatever closing of the
assistant turn the model did not generate itself; without one, observations are
appended as plain text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from turngym.envs.base import as_encodable_text

_PROBE_USER = "PROBE_USER_7f3a"
_PROBE_ASSISTANT = "PROBE_ASSISTANT_7f3a"


def plain_prompt(messages: Sequence[dict[str, str]]) -> str:
    """Base-model rendering: the contents joined by blank lines (no role markers)."""
    return "\n\n".join(m["content"] for m in messages)


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot render what the env asks for (tools, roles)."""


@dataclass
class ConversationTokenizer:
    tokenizer: Any
    use_chat_template: bool | None = None
    _deltas: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.use_chat_template is None:
            self.use_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        elif self.use_chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        # the text the chat template writes after an assistant message ("" without a template)
        self.assistant_close = self._probe_assistant_close() if self.use_chat_template else ""

    # ---------------------------------------------------------------- prompts

    def prompt_text(self, messages: Sequence[dict[str, str]], tools: list[dict[str, Any]] | None = None) -> str:
        if self.use_chat_template:
            return self.tokenizer.apply_chat_template(list(messages), tools=tools or None, add_generation_prompt=True,
                                                      tokenize=False)
        if tools:
            raise ChatTemplateError("native tool calling needs a tokenizer with a chat template that renders tools=; "
                             "this one has none (use tool_format='prompting')")
        return self._special_prefix() + plain_prompt(messages)

    def _special_prefix(self) -> str:
        """The special tokens (e.g. BOS) the tokenizer itself puts before a plain text."""
        bos_id = getattr(self.tokenizer, "bos_token_id", None)
        if bos_id is None:
            return ""
        probe = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        return self.tokenizer.bos_token if probe and probe[0] == bos_id else ""

    def prompt_ids(self, messages: Sequence[dict[str, str]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.encode(self.prompt_text(messages, tools))

    def encode(self, text: str) -> list[int]:
        # a lone surrogate (e.g. from a JSON reply) would make a fast tokenizer raise TypeError
        return list(self.tokenizer(as_encodable_text(text), add_special_tokens=False)["input_ids"])

    # ---------------------------------------------------------------- observations

    def observation_text(self, observation: str, role: str | None, action_ids: Sequence[int] | None = None) -> str:
        """The text inserted after an action so that the next turn starts right."""
        if role is None or not self.use_chat_template:
            return observation
        generated = self.tokenizer.decode(list(action_ids or []), skip_special_tokens=False)
        close = self.assistant_close
        k = max((k for k in range(len(close) + 1) if generated.endswith(close[:k])), default=0)
        return close[k:] + self._message_delta(observation, role)

    def observation_ids(self, observation: str, role: str | None, action_ids: Sequence[int] | None = None) -> list[int]:
        return self.encode(self.observation_text(observation, role, action_ids))

    def _probe_assistant_close(self) -> str:
        probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
        text = self.tokenizer.apply_chat_template(probe, tokenize=False)
        return text[text.rindex(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT):]

    def _message_delta(self, content: str, role: str) -> str:
        marker = "PROBE_OBS_7f3a"
        if role not in self._deltas:
            probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
            before = self.tokenizer.apply_chat_template(probe, tokenize=False)
            try:
                after = self.tokenizer.apply_chat_template(probe + [{"role": role, "content": marker}],
                                                          tokenize=False, add_generation_prompt=True)
            except Exception:  # noqa: BLE001 - templates that reject a 'tool' role get a user turn
                if role == "user":
                    raise
                after = self.tokenizer.apply_chat_template(probe + [{"role": "user", "content": marker}],
                                                          tokenize=False, add_generation_prompt=True)
            if not after.startswith(before):
                raise ValueError("this chat template re-renders earlier turns; multi-turn token ids would not be stable")
            self._deltas[role] = after[len(before):]
        return self._deltas[role].replace(marker, content, 1)


TOKENIZER_PROBE = "Probe: <answer>Paris, 1889</answer>\n\t12*34 = 408; ünïcödé 東京 — done."


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """What identifies a tokenizer's ids: vocabulary size, a digest of the vocabulary (sampled
    evenly, so it stays cheap for 262k-entry vocabularies) and the encoding of a probe text.
    Episodes record it so a scorer can refuse ids from a different tokenizer."""
    import hashlib

    size = len(tokenizer)
    step = max(1, size // 4096)
    sample = tokenizer.convert_ids_to_tokens(list(range(0, size, step)))
    digest = hashlib.sha256("\x00".join(map(str, sample)).encode()).hexdigest()[:16]
    probe = list(tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"])
    return {"vocab_size": size, "vocab_sha256": digest, "probe": probe}
