"""Tiny random causal LMs for tests and benchmarks: a config plus a tokenizer trained here.

Nothing is downloaded: the BPE tokenizer is trained on a few sentences in-process, the
weights are a seeded random init. ``chat=True`` gives a ChatML chat template,
``chat=False`` a plain (base-model) tokenizer.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from turngym.cache import cache_root

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "You solve arithmetic problems. To compute, write <calc>expression</calc> and wait for the result.",
    "When you know the answer, write <answer>number</answer>.",
    "What is 12 * 34 + 5? <calc>12 * 34 + 5</calc> <result>413</result> <answer>413</answer>",
    "Solve the problem. ```python\nprint(1 + 1)\n``` ```output\n2\n``` The answer is \\boxed{2}.",
    "<search>capital of France</search> <information>Doc 1(Title: Paris) Paris is the capital.</information>",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } < > ! ? , . : ;",
    "user assistant system tool observation error result question answer",
]


def build_tiny_model(out_dir: str | os.PathLike, chat: bool = True, seed: int = 0,
                     hidden_size: int = 64, num_layers: int = 2, vocab_size: int = 512) -> Path:
    """Write a tiny random model + tokenizer to ``out_dir`` and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>" if chat else "<|endoftext|>",
                                   pad_token="<pad>", bos_token=None, unk_token=None)
    if chat:
        fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id, bos_token_id=None, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.generation_config.pad_token_id = fast.pad_token_id
    model.save_pretrained(out)
    return out


def tiny_model_dir(chat: bool = True, seed: int = 0, **kwargs: int) -> Path:
    """A cached tiny model directory (built once per machine for each setting)."""
    key = hashlib.sha256(repr((chat, seed, sorted(kwargs.items()), _CORPUS)).encode()).hexdigest()[:12]
    root = cache_root() / "tiny"
    target = root / f"tiny-{'chat' if chat else 'plain'}-{key}"
    if (target / "config.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".build-"))
    build_tiny_model(tmp, chat=chat, seed=seed, **kwargs)
    try:
        tmp.rename(target)
    except OSError:  # another process finished first; its copy is identical
        pass
    return target
