"""Support scoring: p(y | τ≤t), a model's belief in a reference answer y after a trajectory prefix.

p(y | τ≤t) = exp(mean log-probability of y's own tokens) in the pseudo-answer
``prefix + y + suffix`` appended to τ≤t, the pseudo-answer tokenised as one string and
y's tokens found by character offsets (official SIOP / IGPO). Scoring points for an
episode with assistant turns 1..T are τ_0 (the prompt), τ_t for t = 1..T-1, and τ_T, the
prefix ending with the final assistant turn.

``prefix="before_observation"`` (official SIOP) ends τ_t with assistant turn t;
``"after_observation"`` (official IGPO) ends it after turn t's tool output. τ_T ends with
the final assistant turn in both.

Token ids: ``tokens="ids"`` scores the exact ids the policy saw and refuses a scorer
whose tokenizer differs from the one that produced them (vocabulary and a probe
encoding); ``tokens="text"`` re-tokenises the episode's text with the scorer's tokenizer
(a scorer of another model family).

The local scorer (``method="tree"``) runs the longest prefix once and then every
(point, reference) continuation of the episode in one more forward, each continuation
attending to its own point's prefix through a tree-shaped attention mask (sliding-window
layers get a windowed copy of the mask). ``method="naive"`` runs one full forward per
(point, reference): the baseline, and the reference the tree path is tested against.
Inside ``sharing_prompt()`` (SIOP and IGPO open it around each group) the prompt a group's episodes share runs
once: each later episode's longest prefix runs on from its kept keys/values.
``prefix_cache_tokens`` > 0 keeps the longest prefix's keys/values and final hidden states
(up to that many tokens, least recently used dropped first), so rewards that score the same
episode with one scorer (SIOP and IGPO both end at τ_T) run that forward once.
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from turngym.envs.base import as_encodable_text
from turngym.episode import Episode, RewardNeeds

PREFIX_MODES = ("before_observation", "after_observation")
TOKEN_MODES = ("ids", "text")

OFFICIAL_PREFIX = "\nNow there's enough information to answer\n</think>\n<answer>\n"
OFFICIAL_SUFFIX = "\n</answer>"


@dataclass(frozen=True)
class PseudoAnswer:
    """The text a reference is scored in: ``prefix + reference + suffix`` (+ end-of-turn token).

    ``official`` is the SIOP / IGPO pseudo-answer; ``boxed`` a math cue (``\\boxed{y}``).
    """

    prefix: str = OFFICIAL_PREFIX
    suffix: str = OFFICIAL_SUFFIX
    end_of_turn: bool = True

    @classmethod
    def make(cls, spec: Any, needs: RewardNeeds | None = None) -> PseudoAnswer:
        """``auto`` takes the cue the env declares in ``needs`` (``boxed`` for \\boxed{} answers,
        ``official`` for answer tags); without ``needs`` it is only validated (as ``official``)."""
        if isinstance(spec, PseudoAnswer):
            return spec
        if isinstance(spec, dict):
            return cls(**spec)
        if spec == "official":
            return cls()
        if spec == "boxed":
            return cls(prefix="\nNow there's enough information to answer\n</think>\nThe final answer is \\boxed{",
                       suffix="}")
        if spec == "auto":
            return cls.make("boxed" if needs is not None and needs.answer_cue == "boxed" else "official")
        raise ValueError(f"pseudo_answer must be 'official', 'boxed', 'auto' or {{prefix, suffix, end_of_turn}}; got {spec!r}")

    @classmethod
    def for_episode(cls, spec: Any, episode: Episode) -> PseudoAnswer:
        """The pseudo-answer for one episode: ``auto`` reads the cue its env declared."""
        if spec != "auto":
            return cls.make(spec)
        return cls.make(spec, episode.needs("Pass pseudo_answer='official' or 'boxed' instead of 'auto'."))


@dataclass(frozen=True)
class Continuation:
    """Token ids appended to a scoring point; ``ids[start:end]`` are the scored (reference) tokens."""

    ids: tuple[int, ...]
    start: int
    end: int


def end_of_turn_text(tokenizer: Any) -> str:
    """The token that closes an assistant turn: from the chat template, else the EOS token."""
    if getattr(tokenizer, "chat_template", None):
        from turngym.agents.tokenization import ConversationTokenizer

        close = ConversationTokenizer(tokenizer).assistant_close.strip()
        if close:
            return close
    return getattr(tokenizer, "eos_token", None) or ""


def continuation(tokenizer: Any, pseudo: PseudoAnswer, reference: str, end_of_turn: str = "") -> Continuation:
    """The pseudo-answer for ``reference`` tokenised as one string; the reference's tokens by offsets."""
    prefix, reference = as_encodable_text(pseudo.prefix), as_encodable_text(reference)  # tokenizers refuse lone surrogates
    text = prefix + reference + as_encodable_text(pseudo.suffix + (end_of_turn if pseudo.end_of_turn else ""))
    a, b = len(prefix), len(prefix) + len(reference)
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, TypeError, ValueError) as exc:
        raise ValueError(f"support scoring needs a tokenizer with offset mappings (a fast tokenizer): {exc}") from None
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    inside = [i for i, (s, e) in enumerate(offsets) if e > a and s < b and e > s]
    if not inside:
        raise ValueError(f"the reference {reference!r} tokenised to nothing")
    return Continuation(tuple(ids), inside[0], inside[-1] + 1)


def scoring_points(episode: Episode, tokenizer: Any, mode: str = "before_observation", tokens: str = "ids") -> list[list[int]]:
    """Token ids of τ_0..τ_T (each a prefix of the next); an episode with T turns gives T + 1."""
    if mode not in PREFIX_MODES:
        raise ValueError(f"prefix must be one of {PREFIX_MODES}, got {mode!r}")
    if tokens not in TOKEN_MODES:
        raise ValueError(f"tokens must be one of {TOKEN_MODES}, got {tokens!r}")
    have_ids = episode.prompt_ids is not None and all(t.action_ids is not None for t in episode.turns)
    if tokens == "ids" and not have_ids:
        raise ValueError(f"episode {episode.id} carries no token ids (a text-only backend?), so it cannot be scored "
                         "on the ids the policy saw; score it with tokens='text' (re-tokenised with the scorer's "
                         "own tokenizer)")
    if tokens == "text":  # re-tokenise the rendered text piece by piece with this tokenizer
        from turngym.agents.tokenization import ConversationTokenizer

        ct = ConversationTokenizer(tokenizer)
        prompt_ids = ct.prompt_ids(episode.prompt, tools=episode.tools)
        acts = [ct.encode(t.action) for t in episode.turns]
        episode = dataclasses.replace(
            episode, prompt_ids=prompt_ids,
            turns=[dataclasses.replace(t, action_ids=a, action_logprobs=None, prefill_ids=None,  # a prefill is in t.action
                                       observation_ids=ct.observation_ids(t.observation, t.observation_role, a)
                                       if t.observation else [])
                   for t, a in zip(episode.turns, acts, strict=True)])
    layout = episode.token_layout()
    last = len(episode.turns) - 1
    ends = [layout.prompt_end] + [  # τ_T always ends with the final assistant turn
        layout.action_ends[i] if mode == "before_observation" or i == last else layout.turn_ends[i]
        for i in range(len(episode.turns))]
    return [layout.ids[:end] for end in ends]


def check_tokenizer(episode: Episode, tokenizer: Any, fingerprint: dict[str, Any]) -> None:
    """Refuse to score ``episode``'s ids with a tokenizer other than the one that produced them."""
    recorded = episode.meta.get("tokenizer")
    if recorded is None:
        raise ValueError(f"episode {episode.id} does not record which tokenizer produced its token ids, so "
                         "they cannot be checked against the scorer's; score with tokens='text' "
                         "(re-tokenises the episode's text with the scorer's tokenizer)")
    diffs = [k for k in ("vocab_size", "vocab_sha256", "probe") if recorded.get(k) != fingerprint.get(k)]
    if diffs:
        raise ValueError(f"the scorer's tokenizer differs from the one that produced episode {episode.id}'s token ids "
                         f"({', '.join(diffs)} differ: vocab_size {recorded.get('vocab_size')} vs "
                         f"{fingerprint.get('vocab_size')}); use a scorer of the same model family, or tokens='text' "
                         "to re-tokenise the episode's text for this scorer")


class SupportScorer(Protocol):
    tokenizer: Any

    def mean_logprobs(self, points: Sequence[Sequence[int]], continuations: Sequence[Continuation]) -> list[list[float]]:
        """``[point][continuation]``: mean log p of ``ids[start:end]`` after ``point + ids[:start]``."""
        ...

    def sharing_prompt(self) -> AbstractContextManager[None]:
        """A scope (one group's episodes, one set of weights) within which episodes scored one after another may
        reuse the work on the opening they share (their prompt); nothing is kept after it. Optional: a scorer
        without it is used without such a scope (:func:`prompt_sharing_scope`)."""
        ...


def prompt_sharing_scope(scorer: Any) -> AbstractContextManager[Any]:
    """``scorer``'s prompt-sharing scope; a scorer written without one (before it existed) gets an empty scope."""
    method = getattr(scorer, "sharing_prompt", None)
    return nullcontext() if method is None else method()


def _validate(points: Sequence[Sequence[int]], conts: Sequence[Continuation]) -> None:
    if any(len(p) == 0 for p in points):
        raise ValueError("a scoring point is empty (the prompt tokenised to nothing)")
    for a, b in zip(points, points[1:], strict=False):
        if list(b[: len(a)]) != list(a):
            raise ValueError("scoring points must be nested prefixes")
    for c in conts:
        if not 0 <= c.start < c.end <= len(c.ids):
            raise ValueError(f"bad continuation span [{c.start}, {c.end}) of {len(c.ids)} ids")


@dataclass
class HFSupportScorer:
    """A local transformers causal LM (the live policy or a frozen copy)."""

    model: Any
    tokenizer: Any
    method: str = "tree"  # "tree": two forwards per episode; "naive": one per (point, reference)
    prefix_cache_tokens: int = 0  # tree: keep the longest prefixes' forwards (this many tokens in all) for reuse
    stats: dict[str, int] = field(default_factory=lambda: {"forwards": 0, "tokens": 0, "prefix_reused": 0,
                                                           "prompt_reused": 0})
    _prefixes: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False)
    _opening: SharedOpening | None = field(default=None, init=False, repr=False)
    _sharing: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.method not in ("tree", "naive"):
            raise ValueError(f"method must be 'tree' or 'naive', got {self.method!r}")

    @classmethod
    def load(cls, model: str, dtype: str = "float32", device: str | None = None, **kwargs: Any) -> HFSupportScorer:
        from turngym.agents.loading import load_hf_policy

        policy = load_hf_policy(model, dtype=dtype, device=device)
        return cls(policy.model, policy.tokenizer, **kwargs)

    @contextmanager
    def sharing_prompt(self) -> Iterator[None]:
        """Within it the tree scorer keeps the first episode's prompt (its keys/values and hidden states) and runs
        a later episode's longest prefix on from the part of it they share. SIOP and IGPO open it around one
        group: one set of weights, and the opening is dropped at the end (``prefix_cache_tokens`` is another store,
        which outlives it: a caller whose weights change clears that one)."""
        if self._sharing:  # nested: the outer scope owns the opening
            yield
            return
        self._sharing = True
        try:
            yield
        finally:
            self._sharing, self._opening = False, None

    def mean_logprobs(self, points, continuations):
        import torch

        if not points or not continuations:
            return [[] for _ in points]
        _validate(points, continuations)
        was_training = self.model.training
        self.model.eval()  # no dropout while scoring the live policy
        try:
            with torch.inference_mode():
                if self.method == "naive":
                    return self._naive(points, continuations)
                return self._tree(points, continuations)
        finally:
            self.model.train(was_training)

    # ------------------------------------------------------------------ naive

    def _naive(self, points, conts):
        import torch

        device = next(self.model.parameters()).device
        out = []
        for point in points:
            row = []
            for c in conts:
                seq = list(point) + list(c.ids[: c.end])
                keep = c.end - c.start + 1
                self.stats["forwards"] += 1
                self.stats["tokens"] += len(seq)
                logits = self.model(input_ids=torch.tensor([seq], device=device), use_cache=False,
                                    logits_to_keep=keep).logits[0, :-1]
                row.append(_mean_lp(logits, c.ids[c.start:c.end]))
            out.append(row)
        return out

    # ------------------------------------------------------------------ tree

    def _layer_kinds(self) -> tuple[list[str], int | None]:
        cfg = getattr(self.model, "config", None)
        cfg = getattr(cfg, "text_config", None) or cfg
        kinds = list(getattr(cfg, "layer_types", None) or [])
        unknown = set(kinds) - {"full_attention", "sliding_attention"}
        if unknown:
            raise ValueError(f"tree scoring supports full and sliding-window attention, not {sorted(unknown)}; "
                             "use method='naive'")
        window = getattr(cfg, "sliding_window", None) if "sliding_attention" in kinds else None
        return kinds, window

    def _mask(self, allowed: Any, positions_q: Any, positions_k: Any, window: int | None) -> Any:
        import torch

        impl = getattr(self.model.config, "_attn_implementation", "sdpa") or "sdpa"
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"tree scoring needs sdpa or eager attention, the model uses {impl!r}; use method='naive'")
        m = allowed
        if window is not None:
            m = m & ((positions_q[:, None] - positions_k[None, :]) < window)
        m = m[None, None]
        if impl == "eager":
            dtype = next(self.model.parameters()).dtype
            return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, torch.finfo(dtype).min)
        return m

    def _prefix_forward(self, main: list[int], device: Any, prompt: int) -> tuple[Any, Any]:
        """KV cache (full layers, so every point's prefix stays visible) and final hidden states of ``main``;
        from the store when kept there (the cache handed out is a copy: the branch forward extends it), else
        run on from the scope's kept opening where ``main`` starts with part of it (``prompt``: its first point's
        length, what an episode that shares nothing kept leaves as the opening)."""
        import torch
        from transformers import DynamicCache

        key = tuple(main)
        kept = self._prefixes.get(key)
        if kept is not None:
            self._prefixes.move_to_end(key)
            self.stats["prefix_reused"] += 1
            return _cache_head(kept[0], len(key)), kept[1]
        for longer in reversed(self._prefixes):  # a kept longer prefix holds this one (IGPO's τ_{T-1} in SIOP's τ_T)
            if len(longer) > len(key) and longer[: len(key)] == key:
                self._prefixes.move_to_end(longer)
                self.stats["prefix_reused"] += 1
                cache, hidden = self._prefixes[longer]
                return _cache_head(cache, len(key)), hidden[: len(key)]
        opening, start = self._opening, 0
        if opening is not None:
            start = opening.shared_with(main)
        if start:  # the group's opening is kept: run only what follows the part of it this episode shares
            self.stats["prompt_reused"] += 1
            cache = _cache_head(opening.cache, start)
        else:
            cache = DynamicCache()
        self.stats["forwards"] += 1
        self.stats["tokens"] += len(main) - start
        hidden = self.model.get_decoder()(input_ids=torch.tensor([main[start:]], device=device), cache=cache,
                                          position_ids=torch.arange(start, len(main), device=device)[None],
                                          use_cache=True).last_hidden_state[0]
        if start:
            hidden = torch.cat([opening.hidden[:start], hidden])
        elif self._sharing:  # an episode sharing nothing kept (the scope's first): its prompt is the opening now
            self._opening = SharedOpening(tuple(main[:prompt]), _cache_head(cache, prompt), hidden[:prompt].clone())
        if 0 < len(main) <= self.prefix_cache_tokens:
            self._prefixes[key] = (_cache_head(cache, len(main)), hidden)
            while sum(len(k) for k in self._prefixes) > self.prefix_cache_tokens:
                self._prefixes.popitem(last=False)
        return cache, hidden

    def clear_prefixes(self) -> None:
        self._prefixes.clear()

    def _logits(self, hidden: Any) -> Any:
        """The LM head on final hidden states, with the model's final logit soft-capping (Gemma) if it has one."""
        import torch

        logits = self.model.get_output_embeddings()(hidden)
        cfg = getattr(self.model.config, "text_config", None) or self.model.config
        cap = getattr(cfg, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits

    def _tree(self, points, conts):
        """The longest point runs once (KV kept for every layer); then all (point, continuation)
        inputs run in one forward, each attending to its point's prefix and to itself."""
        import torch

        device = next(self.model.parameters()).device
        kinds, window = self._layer_kinds()
        main = list(points[-1])
        n_main = len(main)
        # branch inputs: for (p, c), c.ids[:end-1] at positions len(p) ...; token c.ids[k] is
        # predicted by the output at position len(p) + k - 1 (the point's last token when k = 0).
        # The continuations' common first ids (the pseudo-answer's opening, the same for every reference)
        # are one shared segment per point that every continuation of that point attends to: read once,
        # not once per reference (they were most of the branch forward's tokens)
        inputs = [c.ids[:c.end - 1] for c in conts]
        shared = 0
        while all(len(ids) > shared for ids in inputs) and len({ids[shared] for ids in inputs}) == 1:
            shared += 1
        tokens, pos = [], []
        segs = []  # (point length, shared segment start, own segment start, own segment length) per (p, c)
        for pt in points:
            lp = len(pt)
            s0 = len(tokens)
            tokens += inputs[0][:shared]
            pos += range(lp, lp + shared)
            for ids in inputs:
                segs.append((lp, s0, len(tokens), len(ids) - shared))
                tokens += ids[shared:]
                pos += range(lp + shared, lp + len(ids))
        n_b = len(tokens)
        want = []  # (source, index, target): source 0 = main forward, 1 = branch forward
        for (lp, s0, own, _), c in zip(segs, [c for _ in points for c in conts], strict=True):
            for k in range(c.start, c.end):
                if k == 0:
                    want.append((0, lp - 1, c.ids[k]))
                else:
                    want.append((1, s0 + k - 1 if k - 1 < shared else own + k - 1 - shared, c.ids[k]))
        main_idx = sorted({i for s, i, _ in want if s == 0})
        cache, hidden = self._prefix_forward(main, device, len(points[0]))
        logp: dict[tuple[int, int], Any] = {}
        if main_idx:
            lp_main = torch.log_softmax(self._logits(hidden[main_idx]).float(), dim=-1)
            for j, i in enumerate(main_idx):
                logp[(0, i)] = lp_main[j]
        if n_b:
            pos_b = torch.tensor(pos, device=device)
            allowed = torch.zeros((n_b, n_main + n_b), dtype=torch.bool, device=device)
            longest = max(shared, *(n_own for *_, n_own in segs))
            causal = torch.tril(torch.ones((longest, longest), dtype=torch.bool, device=device))  # sliced per segment
            for lp, s0, own, n_own in segs:
                if own == s0 + shared:  # the point's first continuation: set its shared segment's rows once
                    allowed[s0:s0 + shared, :lp] = True
                    allowed[s0:s0 + shared, n_main + s0:n_main + s0 + shared] = causal[:shared, :shared]
                allowed[own:own + n_own, :lp] = True
                allowed[own:own + n_own, n_main + s0:n_main + s0 + shared] = True
                allowed[own:own + n_own, n_main + own:n_main + own + n_own] = causal[:n_own, :n_own]
            pos_k = torch.cat([torch.arange(n_main, device=device), pos_b])
            if "sliding_attention" in kinds:
                mask: Any = {"full_attention": self._mask(allowed, pos_b, pos_k, None),
                             "sliding_attention": self._mask(allowed, pos_b, pos_k, window)}
            else:
                mask = self._mask(allowed, pos_b, pos_k, None)
            branch_idx = sorted({i for s, i, _ in want if s == 1})
            self.stats["forwards"] += 1
            self.stats["tokens"] += n_b
            out_b = self.model(input_ids=torch.tensor([tokens], device=device), position_ids=pos_b[None],
                               attention_mask=mask, cache=cache, use_cache=True,
                               logits_to_keep=torch.tensor(branch_idx, device=device))
            lp_b = torch.log_softmax(out_b.logits[0].float(), dim=-1)
            for j, i in enumerate(branch_idx):
                logp[(1, i)] = lp_b[j]
        vals = [float(logp[(s, i)][t]) for s, i, t in want]
        out, w = [], 0
        for _ in points:
            row = []
            for c in conts:
                n = c.end - c.start
                row.append(sum(vals[w:w + n]) / n)
                w += n
            out.append(row)
        return out


@dataclass
class SharedOpening:
    """The opening of a sharing scope's episodes (``ids``) with its keys/values and final hidden states."""

    ids: tuple[int, ...]
    cache: Any
    hidden: Any

    def shared_with(self, main: Sequence[int]) -> int:
        """How many leading ids ``main`` shares with the opening (at most ``len(main) - 1``: a forward needs one)."""
        n = min(len(self.ids), len(main) - 1)
        i = 0
        while i < n and self.ids[i] == main[i]:
            i += 1
        return i


def _cache_head(cache: Any, n: int) -> Any:
    """A new cache of the first ``n`` positions of ``cache``: a forward extends the cache it is given, and the kept
    one must stay as it is (``DynamicCache`` copies the tensors it starts from, so only these positions are held)."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=[(layer.keys[:, :, :n], layer.values[:, :, :n]) for layer in cache.layers])


def _mean_lp(logits: Any, targets: Sequence[int]) -> float:
    import torch

    lp = torch.log_softmax(logits.float(), dim=-1)
    idx = torch.tensor(list(targets), device=lp.device)
    return float(lp[torch.arange(len(targets), device=lp.device), idx].mean())


@dataclass
class OpenAISupportScorer:
    """``prompt_logprobs`` as vLLM serves them through its OpenAI-compatible ``/completions``.

    All (point, continuation) prompts of an episode go in one request as token ids; the
    tokenizer must be the served model's (``tokenizer`` names it: a directory or hub id).
    """

    model: str
    base_url: str
    tokenizer: Any
    api_key: str | None = None
    timeout_s: float = 120.0
    retries: int = 3

    def sharing_prompt(self) -> AbstractContextManager[None]:
        """Nothing kept here: a vLLM server reuses a shared prompt itself (its prefix cache)."""
        return nullcontext()

    def mean_logprobs(self, points, continuations):
        from turngym.agents.openai_compat import OpenAICompatPolicy

        if not points or not continuations:
            return [[] for _ in points]
        _validate(points, continuations)
        client = OpenAICompatPolicy(model=self.model, base_url=self.base_url, api_key=self.api_key,
                                    timeout_s=self.timeout_s, retries=self.retries)
        prompts, spans = [], []
        for point in points:
            for c in continuations:
                prompts.append(list(point) + list(c.ids[: c.end]))
                spans.append((len(point) + c.start, list(c.ids[c.start:c.end])))
        data = client.post_json("/completions", {"model": self.model, "prompt": prompts, "max_tokens": 1,
                                             "temperature": 0.0, "prompt_logprobs": 0})
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts):
            raise RuntimeError(f"server returned {len(choices)} choices for {len(prompts)} prompts")
        flat = []
        for choice, (start, ref) in zip(choices, spans, strict=True):
            plp = choice.get("prompt_logprobs")
            if not plp:
                raise RuntimeError("the server gave no prompt_logprobs (a vLLM server serves them; others may not)")
            vals = [float(plp[start + k][str(tok)]["logprob"]) for k, tok in enumerate(ref)]
            flat.append(sum(vals) / len(vals))
        n = len(continuations)
        return [flat[i * n:(i + 1) * n] for i in range(len(points))]


@dataclass
class MemoSupportScorer:
    """A scorer that scores each (scoring point, continuations) once: benchmarks that score the same episodes
    under several configurations (which combine the same supports differently) pay for each support once."""

    scorer: SupportScorer
    memo: dict[tuple[tuple[int, ...], tuple[Continuation, ...]], list[float]] = field(default_factory=dict, repr=False)

    @property
    def tokenizer(self) -> Any:
        return self.scorer.tokenizer

    def sharing_prompt(self) -> AbstractContextManager[Any]:
        return prompt_sharing_scope(self.scorer)

    def mean_logprobs(self, points: Sequence[Sequence[int]], continuations: Sequence[Continuation]) -> list[list[float]]:
        keys = [(tuple(p), tuple(continuations)) for p in points]
        todo = [i for i, k in enumerate(keys) if k not in self.memo]
        if todo:
            rows = self.scorer.mean_logprobs([points[i] for i in todo], continuations)
            for i, row in zip(todo, rows, strict=True):
                self.memo[keys[i]] = row
        return [self.memo[k] for k in keys]


SCORER_KEYS = {"model", "base_url", "tokenizer", "api_key", "dtype", "device", "method", "prefix_cache_tokens"}


def make_scorer(spec: Any) -> SupportScorer:
    """A scorer from its configuration.

    - a scorer object: used as is;
    - a string: a local model (``default``, a directory, a ``.gguf`` file or a hub id), fp32;
    - a mapping: ``{model, dtype, device, method}`` for a local model, or
      ``{base_url, model, tokenizer, api_key}`` for an OpenAI-compatible (vLLM) server;
    - ``policy``: the live policy, bound by the trainer (``turngym train``).
    """
    if spec is None:
        raise ValueError("this reward needs a support scorer: scorer=<model path or id>, "
                         "{base_url, model, tokenizer} for a server, or a scorer object")
    if spec == "policy":
        raise ValueError("scorer 'policy' scores with the live policy: only the trainer can bind it "
                         "(outside training give a model, e.g. scorer='default')")
    if isinstance(spec, str):
        if spec.startswith("{"):
            return make_scorer(json.loads(spec))
        return HFSupportScorer.load(spec)
    if isinstance(spec, dict):
        unknown = set(spec) - SCORER_KEYS
        if unknown or "model" not in spec:
            raise ValueError(f"scorer mapping needs 'model' and takes only {sorted(SCORER_KEYS)}; got {sorted(spec)}")
        if spec.get("base_url"):
            from transformers import AutoTokenizer

            from turngym.agents.loading import resolve_model_dir

            tok_name = str(spec.get("tokenizer") or spec["model"])
            tok = AutoTokenizer.from_pretrained(resolve_model_dir(tok_name))
            return OpenAISupportScorer(model=str(spec["model"]), base_url=str(spec["base_url"]), tokenizer=tok,
                                       api_key=spec.get("api_key"))
        extra = {k: spec[k] for k in ("dtype", "device", "method", "prefix_cache_tokens") if k in spec}
        return HFSupportScorer.load(str(spec["model"]), **extra)
    return spec
