"""The finite history tree of SearchQA macro-actions and its reader/scorer precompute (``credit_learning_reader.py``).

At each of ``max_turns`` turns the policy picks a macro-action: ``Q`` searches the question, ``S`` searches an
entity read off the passages retrieved so far (the first capitalised name in the latest passage that the question
does not hold: the follow-up a multi-hop question needs), ``D`` searches a distractor (another item's question, whose
passage holds no gold answer), ``A`` answers. Every search runs in the real ``turngym/SearchQA-v0`` (BM25 over the
embedded index); a search at the last turn is cut by the turn limit (no answer). The answer is written by a frozen
pretrained reader (the embedded Qwen2.5-Coder-0.5B-Instruct) from the question and the passages so far, *sampled*
at the rollout temperature, ``k`` samples per distinct set of passages; SIOP's and IGPO's support scorer is the same
frozen model (``HFSupportScorer``), scoring every point of every leaf episode against every answer the reader wrote
for the item and its first gold answer. Everything the model computes is kept in a content-keyed cache (reader
answers by a hash of the reader prompt, log-probabilities by a hash of the scoring point's token ids and the
reference), appended line by line (a rerun resumes), so training from it needs no model.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MACROS = ("Q", "S", "D", "A")
SEARCHES = ("Q", "S", "D")
READER_MODEL = "qwen2.5-coder-0.5b-instruct"
READER_TEMPLATE = ("Answer the question with a short answer (a few words), using the passages if they help.\n\n"
                   "Passages:\n{passages}\n\nQuestion: {question}")
_STOP = {"The", "A", "An", "In", "On", "It", "He", "She", "His", "Her", "They", "This", "That", "As", "At", "By",
         "For", "From", "Of", "After", "Before", "During", "With", "Doc", "Title", "Its", "Their", "When", "Where",
         "Who", "What", "Which", "While", "There", "These", "Those", "However", "Although", "But", "And", "Or"}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def ids_key(ids: Sequence[int]) -> str:
    return sha(",".join(map(str, ids)))


@dataclass(frozen=True)
class EnvConfig:
    """The SearchQA-v0 settings every history is played under (one passage, cut short: prompts stay short)."""

    topk: int = 1
    tool_response_chars: int = 200
    max_turns: int = 3

    def kwargs(self, dataset: str) -> dict[str, Any]:
        return {"dataset": dataset, "topk": self.topk, "tool_response_chars": self.tool_response_chars,
                "tool_response_truncate_side": "left", "max_turns": self.max_turns}


@dataclass(frozen=True)
class Item:
    dataset: str  # the env's dataset argument: a bundled name or a .jsonl path
    index: int
    question: str
    golds: tuple[str, ...]
    distractor: str
    split: str  # "train" or "heldout"
    kind: str  # "multi-hop" or "single-hop" (the dataset's)

    @property
    def key(self) -> str:
        return f"{Path(self.dataset).stem}:{self.index}"


@dataclass
class MemoRetriever:
    """The env's retriever with each (query, k) searched once: the tree replays the same searches many times."""

    retriever: Any
    memo: dict[tuple[str, int], Any] = field(default_factory=dict)

    def search(self, query: str, k: int) -> Any:
        if (query, k) not in self.memo:
            self.memo[(query, k)] = self.retriever.search(query, k)
        return self.memo[(query, k)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.retriever, name)


_RETRIEVER: list[Any] = []


def make_env(dataset: str, ecfg: EnvConfig) -> Any:
    """SearchQA-v0 on the default index, its searches memoised (one index opened per process)."""
    import gymnasium

    import turngym  # noqa: F401  (registers the envs)
    from turngym.corpora.service import make_retriever

    if not _RETRIEVER:
        _RETRIEVER.append(MemoRetriever(make_retriever(None)))
    return gymnasium.make("turngym/SearchQA-v0", retriever=_RETRIEVER[0], **ecfg.kwargs(dataset))


def passage_of(observation: str) -> str:
    """The passage text inside an observation (the env's ``<information>`` block)."""
    m = re.search(r"<information>(.*?)(</information>|$)", observation, re.S)
    return (m.group(1) if m else observation).strip()


def follow_up_entity(question: str, passage: str) -> str:
    """The ``S`` query: the first capitalised name (two words or more, else one) in ``passage`` that the question
    and the passage's title do not hold; the title when there is none. Reads only what was retrieved."""
    title = re.search(r'Title:\s*"?([^")\n]*)', passage)
    title_text = title.group(1).strip() if title else ""
    body = passage[title.end():] if title else passage
    q = question.lower()
    spans = re.findall(r"\b[A-Z][\w'\-]*(?:\s+(?:of\s+|the\s+|de\s+)?[A-Z][\w'\-]*)*", body)
    spans = [s.strip() for s in spans if s.strip() not in _STOP]
    fresh = [s for s in spans if s.lower() not in q and s.lower() not in title_text.lower()
             and title_text.lower() not in s.lower()]
    for pool in ([s for s in fresh if " " in s], fresh):
        if pool:
            return pool[0]
    return title_text or question


# ------------------------------------------------------------------ the tree


@dataclass
class Node:
    """A decision point: the searches made so far (macros), their queries, observations and retrieval hits."""

    path: tuple[str, ...]
    queries: tuple[str, ...]
    observations: tuple[str, ...]
    hits: tuple[bool, ...]  # the env's per-turn truth (retrieval_hit): the passage holds a gold answer

    @property
    def depth(self) -> int:
        return len(self.path)

    def legal(self, max_turns: int) -> tuple[str, ...]:
        return ("Q", "D", "A") if not self.path else MACROS

    def passages(self) -> tuple[str, ...]:
        """The distinct passages so far, in a fixed order (the reader reads a set: Q then D reads as D then Q)."""
        return tuple(sorted({passage_of(o) for o in self.observations}))


def retrieval_hit(turn: Any) -> bool:
    """The env's per-turn truth: the search retrieved a passage holding a gold answer."""
    v = turn.truth.get("retrieval_hit")
    return bool(getattr(v, "value", v))


def search_text(query: str) -> str:
    return f"<search> {query} </search>"


def answer_text(answer: str) -> str:
    return f"<answer> {answer} </answer>"


def query_for(item: Item, node: Node, macro: str) -> str:
    if macro == "Q":
        return item.question
    if macro == "D":
        return item.distractor
    return follow_up_entity(item.question, passage_of(node.observations[-1]))


def grow_tree(item: Item, env: Any, max_turns: int) -> list[Node]:
    """Every decision node of ``item`` (breadth first), its searches played through the real env."""
    nodes = [Node((), (), (), ())]
    i = 0
    while i < len(nodes):
        node = nodes[i]
        i += 1
        if node.depth >= max_turns - 1:
            continue  # a search here is cut by the turn limit: a leaf, not a node
        for macro in node.legal(max_turns):
            if macro == "A":
                continue
            q = query_for(item, node, macro)
            env.reset(options={"index": item.index})
            for prev in node.queries:
                env.step(search_text(prev))
            env.step(search_text(q))
            turn = env.unwrapped.episode.turns[-1]
            nodes.append(Node(node.path + (macro,), node.queries + (q,), node.observations + (turn.observation or "",),
                              node.hits + (retrieval_hit(turn),)))
    return nodes


# ------------------------------------------------------------------ the reader


def reader_prompt(tok: Any, question: str, passages: Sequence[str]) -> str:
    body = "\n".join(passages) if passages else "(none)"
    msgs = [{"role": "user", "content": READER_TEMPLATE.format(passages=body, question=question)}]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def clean_answer(text: str) -> str:
    """The reader's answer: its first line, without answer tags, quotes and a final full stop (at most 80 chars)."""
    text = re.sub(r"</?answer>", "", text).strip().split("\n")[0].strip()
    text = re.sub(r"^(answer|the answer is)\s*:\s*", "", text, flags=re.I).strip().strip('"').strip()
    return text.rstrip(".").strip()[:80] or "unknown"  # an empty reply reads as an abstention


@dataclass(frozen=True)
class Sampling:
    """The reader's sampling: the rollout's temperature (1.0, the trainer's default), nucleus off."""

    k: int = 3
    temperature: float = 1.0
    max_new_tokens: int = 12
    seed: int = 0


def sample_answers(model: Any, tok: Any, prompts: Sequence[str], sampling: Sampling, seed: int) -> list[list[str]]:
    """``k`` answers per prompt: one prefill of the left-padded batch, its keys/values repeated ``k`` times, then
    token-by-token sampling at ``sampling.temperature`` (every row until an end token or the token limit)."""
    import torch

    k = sampling.k
    enc = tok(list(prompts), padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ends = {t for t in (tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id) if t is not None}
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        cache.batch_repeat_interleave(k)
        logits = out.logits[:, -1].repeat_interleave(k, 0)
        mask = mask.repeat_interleave(k, 0)
        last = pos[:, -1].repeat_interleave(k, 0)
        done = torch.zeros(len(mask), dtype=torch.bool)
        rows: list[list[int]] = [[] for _ in range(len(mask))]
        for _ in range(sampling.max_new_tokens):
            probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
            for r, t in enumerate(nxt.tolist()):
                if not done[r]:
                    if t in ends:
                        done[r] = True
                    else:
                        rows[r].append(t)
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones(len(mask), 1, dtype=mask.dtype)], dim=1)
            last = last + 1
            out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=last[:, None],
                        past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]
    texts = [clean_answer(tok.decode(r, skip_special_tokens=True)) for r in rows]
    return [texts[i * k:(i + 1) * k] for i in range(len(prompts))]


# ------------------------------------------------------------------ episodes (leaves) as the rollout runner builds them


@dataclass
class Leaf:
    """One way an episode ends: the node's searches, then an answer (``answer`` set) or a search cut by the turn
    limit (``cut`` names its macro)."""

    node: int
    answer: str | None
    cut: str | None = None


def play_leaf(item: Item, node: Node, leaf: Leaf, env: Any, conv: Any, fingerprint: dict[str, Any],
              cut_query: str | None = None) -> Any:
    """The leaf's episode played through the real env, with the token ids the rollout runner records."""
    env.reset(options={"index": item.index})
    for q in node.queries:
        env.step(search_text(q))
    env.step(answer_text(leaf.answer) if leaf.answer is not None else search_text(cut_query or item.question))
    ep = dataclasses.replace(env.unwrapped.episode)
    ep.turns = [dataclasses.replace(t) for t in ep.turns]
    add_ids(ep, conv, fingerprint, env.unwrapped.observation_role)
    return ep


def add_ids(ep: Any, conv: Any, fingerprint: dict[str, Any], role: str | None) -> None:
    ep.add_run_record(prompt_ids=conv.prompt_ids(ep.prompt, tools=ep.tools), meta={"tokenizer": fingerprint})
    last = len(ep.turns) - 1
    for i, t in enumerate(ep.turns):
        a = conv.encode(t.action)
        obs = None if (i == last and (ep.terminated or ep.truncated)) else conv.observation_ids(
            t.observation or "", t.observation_role or role, a)
        ep.add_run_record(i, action_ids=a, observation_ids=obs)


# ------------------------------------------------------------------ the cache


@dataclass
class Cache:
    """Content-keyed reader answers and support log-probabilities, appended line by line to ``path``."""

    path: Path
    answers: dict[str, list[str]] = field(default_factory=dict)  # sha(reader prompt) -> k answers
    support: dict[str, dict[str, float]] = field(default_factory=dict)  # ids_key(point) -> {reference: mean lp}
    meta: dict[str, Any] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)  # items whose answers and supports are all here
    costs: dict[str, dict[str, float]] = field(default_factory=dict)  # item -> seconds (reader, scorer)
    screened: dict[str, bool] = field(default_factory=dict)  # item -> the reader screen's verdict

    _offset: int = field(default=0, repr=False)  # how far the plain file was read (refresh reads on from there)

    @classmethod
    def open(cls, path: Path) -> Cache:
        c = cls(Path(path))
        if c.path.exists():
            if c.path.suffix == ".gz":
                with gzip.open(c.path, "rt", encoding="utf-8") as fh:
                    for line in fh:
                        if line.strip():
                            c._take(json.loads(line))
            else:
                c.refresh()
        return c

    def refresh(self) -> None:
        """Take the whole lines other processes appended since the last read (several processes share a work
        folder: one per split, or a second one working from the other end)."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        for line in data[:end].decode("utf-8").splitlines():
            if line.strip():
                self._take(json.loads(line))
        self._offset += end

    def _take(self, rec: dict[str, Any]) -> None:
        if rec["kind"] == "reader":
            self.answers[rec["key"]] = rec["answers"]
        elif rec["kind"] == "support":
            self.support.setdefault(rec["point"], {}).update(rec["lp"])
        elif rec["kind"] == "done":
            self.done.add(rec["item"])
            if "cost" in rec:
                self.costs[rec["item"]] = rec["cost"]
        elif rec["kind"] == "meta":
            self.meta.update(rec["meta"])
        elif rec["kind"] == "screen":
            self.screened[rec["item"]] = rec["ok"]

    def append(self, rec: dict[str, Any]) -> None:
        self._take(rec)
        with open(self.path, "ab") as fh:  # one write per line: lines of several processes never interleave
            fh.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))

    def write_compact(self, out: Path, meta: dict[str, Any]) -> str:
        """The whole cache as one gzip'd JSONL (meta first, keys sorted, no timestamps inside the gzip header);
        returns its sha256."""
        lines = [json.dumps({"kind": "meta", "meta": meta}, ensure_ascii=False, sort_keys=True)]
        lines += [json.dumps({"kind": "reader", "key": k, "answers": v}, ensure_ascii=False)
                  for k, v in sorted(self.answers.items())]
        lines += [json.dumps({"kind": "support", "point": p, "lp": {r: round(x, 5) for r, x in sorted(v.items())}},
                             ensure_ascii=False) for p, v in sorted(self.support.items())]
        lines += [json.dumps({"kind": "done", "item": k, **({"cost": self.costs[k]} if k in self.costs else {})})
                  for k in sorted(self.done)]
        data = ("\n".join(lines) + "\n").encode("utf-8")
        with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as fh:
            fh.write(data)
        return hashlib.sha256(Path(out).read_bytes()).hexdigest()


def load_checked(path: Path) -> Cache:
    """The committed cache, refused in one line when its sha256 is not the one recorded beside it."""
    side = Path(str(path) + ".sha256")
    if not side.exists():
        raise SystemExit(f"credit_learning_reader: {side} is missing: the cache's hash cannot be checked")
    want = side.read_text().split()[0]
    got = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    if got != want:
        raise SystemExit(f"credit_learning_reader: {path} has sha256 {got[:12]}…, not the recorded {want[:12]}…: "
                         "the cache was changed; rerun the precompute or restore it")
    return Cache.open(path)


# ------------------------------------------------------------------ items


def read_rows(dataset: str) -> list[dict[str, Any]]:
    from turngym.corpora.datasets import load_dataset

    return load_dataset(dataset).items


def pick_items(datasets: Sequence[tuple[str, str, int]], ecfg: EnvConfig, seed: int = 0,
               scan: int = 400, accept: Callable[[list[Item], Any], list[bool]] | None = None,
               accept_batch: int = 8) -> list[Item]:
    """``n`` items per dataset (``(dataset, kind, n)``), in file order among the first ``scan``, that the tree can
    solve: the question's search, or its follow-up, retrieves a passage holding a gold answer (checked on the
    index in use), and ``accept(items, env)`` keeps it (the reader screen, :class:`ReaderScreen`, asked
    ``accept_batch`` items at a time). Each gets a distractor: another item's question whose passage holds none.
    Items alternate train / held-out."""
    import numpy as np

    from turngym.grading.qa import normalize_answer

    out: list[Item] = []
    for dataset, kind, n in datasets:
        env = make_env(dataset, ecfg)
        base = env.unwrapped
        total = min(base.num_items(), scan)
        rng = np.random.default_rng(seed)
        kept: list[Item] = []
        batch: list[Item] = []

        for i in range(total):
            it = base.get_item(i)
            golds = tuple(str(a) for a in it.get("answers", []) if str(a).strip())
            if not golds or normalize_answer(golds[0]) in ("yes", "no"):
                continue
            probe = Item(dataset, i, it["question"], golds, "", "", kind)
            env.reset(options={"index": i})
            env.step(search_text(it["question"]))
            t1 = env.unwrapped.episode.turns[-1]
            hit = retrieval_hit(t1)
            if not hit:
                node = Node(("Q",), (it["question"],), (t1.observation or "",), (False,))
                env.step(search_text(query_for(probe, node, "S")))
                hit = retrieval_hit(env.unwrapped.episode.turns[-1])
            if not hit:
                continue
            distractor = None
            for j in rng.permutation(total):
                if int(j) == i:
                    continue
                other = base.get_item(int(j))["question"]
                env.reset(options={"index": i})
                env.step(search_text(other))
                if not retrieval_hit(env.unwrapped.episode.turns[-1]):
                    distractor = other
                    break
            if distractor is None:
                continue
            batch.append(dataclasses.replace(probe, distractor=distractor))
            if len(batch) >= accept_batch:  # the reader screens several items per call (one decode for all)
                kept += _screened(batch, env, accept)
                batch = []
                if len(kept) >= n:
                    break
        if batch and len(kept) < n:
            kept += _screened(batch, env, accept)
        chosen = min(n, len(kept))
        out += [dataclasses.replace(it, split="train" if j % 2 == 0 else "heldout") for j, it in enumerate(kept[:n])]
        env.close()
        if chosen < n:
            raise SystemExit(f"credit_learning_reader: only {chosen} of the first {total} items of {dataset} can be "
                             f"solved by the tree{' and the reader' if accept else ''} (wanted {n}); raise --scan")
    return out


def _screened(items: list[Item], env: Any, accept: Callable[[list[Item], Any], list[bool]] | None) -> list[Item]:
    return items if accept is None else [it for it, ok in zip(items, accept(items, env), strict=True) if ok]


# ------------------------------------------------------------------ the precompute


def interleave(items: Sequence[Item]) -> list[Item]:
    """Round robin over (split, kind): any prefix holds train and held-out items of every kind alike."""
    groups: dict[tuple[str, str], list[Item]] = {}
    for it in items:
        groups.setdefault((it.split, it.kind), []).append(it)
    out: list[Item] = []
    for i in range(max(len(g) for g in groups.values())):
        out += [g[i] for g in groups.values() if i < len(g)]
    return out


@dataclass
class ItemTree:
    item: Item
    nodes: list[Node]

    def reader_contexts(self) -> list[tuple[str, ...]]:
        return list(dict.fromkeys(n.passages() for n in self.nodes))


def batches(xs: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(xs), n):
        yield xs[i:i + n]


@dataclass
class Reader:
    """The frozen reader, loaded once (the screen and the precompute share it)."""

    model: Any
    tok: Any
    load_s: float

    @classmethod
    def load(cls, model_name: str = READER_MODEL, dtype: str = "auto") -> Reader:
        from turngym.agents.loading import load_hf_policy

        t = time.perf_counter()
        policy = load_hf_policy(model_name, dtype=dtype, device="cpu")
        return cls(policy.model, policy.tokenizer, time.perf_counter() - t)

    def sample(self, prompts: Sequence[str], sampling: Sampling, cache: Cache, item_key: str, batch: int = 8) -> None:
        """Sample ``prompts`` (``batch`` per call: one decode for all) and append their answers to ``cache``. A
        prompt's answers depend only on the prompt and the seed drawn from the first prompt of its call."""
        for b, chunk in enumerate(batches(list(prompts), batch)):
            got = sample_answers(self.model, self.tok, chunk, sampling, seed=sampling.seed + int(sha(chunk[0])[:6], 16) + b)
            for p, a in zip(chunk, got, strict=True):
                cache.append({"kind": "reader", "key": sha(p), "item": item_key, "answers": a})


@dataclass
class ReaderScreen:
    """``pick_items``' ``accept``: the reader, reading the first passage set of the item's tree that holds a gold
    answer, writes a gold answer exactly in at least one of its ``k`` samples. An item the reader can never answer
    teaches no arm anything (the last study's 3 training items). Its answers are a context of the tree, so the
    precompute reuses them; each verdict is cached (``kind: screen``)."""

    reader: Reader
    ecfg: EnvConfig
    sampling: Sampling
    cache: Cache
    log: Any
    seen: int = 0
    kept: int = 0

    def __call__(self, items: list[Item], env: Any) -> list[bool]:
        from turngym.grading.qa import exact_match

        todo = [it for it in items if it.key not in self.cache.screened]
        contexts = {}
        for it in todo:
            nodes = grow_tree(it, env, self.ecfg.max_turns)
            contexts[it.key] = next(n.passages() for n in nodes if any(n.hits))
        prompts = {it.key: reader_prompt(self.reader.tok, it.question, contexts[it.key]) for it in todo}
        self.reader.sample([p for p in dict.fromkeys(prompts.values()) if sha(p) not in self.cache.answers],
                           self.sampling, self.cache, "screen")
        for it in todo:
            ok = any(exact_match(a, it.golds) > 0 for a in self.cache.answers[sha(prompts[it.key])])
            self.cache.append({"kind": "screen", "item": it.key, "ok": ok})
        verdicts = [self.cache.screened[it.key] for it in items]
        self.seen += len(items)
        self.kept += sum(verdicts)
        self.log(f"screen: {self.kept} of {self.seen} items kept (the reader answers them exactly)")
        return verdicts


def precompute(items: Sequence[Item], ecfg: EnvConfig, sampling: Sampling, cache: Cache, log: Any,
               reader_batch: int = 6, reader: Reader | None = None, reverse: bool = False) -> dict[str, float]:
    """Reader answers for every item's contexts, then the support log-probabilities of every train item's leaf
    episodes (both cuts) against the item's answers and first gold answer. Skips what ``cache`` holds."""
    from turngym.agents.tokenization import ConversationTokenizer, tokenizer_fingerprint
    from turngym.grading.qa import normalize_answer
    from turngym.rewards.support import HFSupportScorer, PseudoAnswer, continuation, end_of_turn_text, scoring_points

    reader = reader or Reader.load()
    model, tok = reader.model, reader.tok
    cost = {"load_s": reader.load_s}
    trees = []
    t = time.perf_counter()
    envs: dict[str, Any] = {}
    order = interleave(items)
    for it in reversed(order) if reverse else order:  # reverse: a second process works from the other end
        env = envs.setdefault(it.dataset, make_env(it.dataset, ecfg))
        trees.append(ItemTree(it, grow_tree(it, env, ecfg.max_turns)))
    cost["tree_s"] = time.perf_counter() - t
    conv = ConversationTokenizer(tok)
    fp = tokenizer_fingerprint(tok)
    scorer = HFSupportScorer(model, tok, method="tree")
    pseudo, eot = PseudoAnswer.make("official"), end_of_turn_text(tok)
    cost["reader_s"] = cost["scorer_s"] = 0.0
    n_calls = n_pairs = 0
    for tr in trees:  # item by item (train and held out, both kinds interleaved): a stopped run leaves whole items
        cache.refresh()  # another process on this work folder may have done it
        if tr.item.key in cache.done:
            continue
        # the reader: k answers per distinct set of passages
        t = time.perf_counter()
        todo = list(dict.fromkeys(p for p in (reader_prompt(tok, tr.item.question, c) for c in tr.reader_contexts())
                                  if sha(p) not in cache.answers))
        reader.sample(todo, sampling, cache, tr.item.key, reader_batch)  # the prompts rendered once, above
        dt = time.perf_counter() - t
        cost["reader_s"] += dt
        msg = f"{tr.item.key} ({tr.item.split}): reader {len(todo)} contexts in {dt:.1f} s"
        item_cost = {"reader_s": round(dt, 1), "reader_contexts": len(todo)}
        if tr.item.split == "train":
            # the scorer, per leaf episode: the pairs SIOP and IGPO can ask for there: every scoring point of the
            # leaf (both cuts) against the answers SIOP may cluster with the leaf's answer (those equal to it after
            # normalisation, the offline clustering) and the first gold answer (IGPO's reference)
            t = time.perf_counter()
            env = envs[tr.item.dataset]
            classes = answer_classes(tr, tok, cache)
            gold = tr.item.golds[0].strip()
            with scorer.sharing_prompt():
                for leaf_ep in leaf_episodes(tr, tok, cache, env, conv, fp, answers_only=True):
                    if len(leaf_ep.turns) < 2:
                        continue  # a one-turn episode gets its outcome term only: no support is scored
                    final = str(leaf_ep.final_answer or "").strip()
                    refs = [final, *classes.get(normalize_answer(final), []), gold]
                    refs = list(dict.fromkeys(r for r in refs if r))
                    points = {ids_key(p): p for mode in ("before_observation", "after_observation")
                              for p in scoring_points(leaf_ep, tok, mode)}
                    need = sorted((p for k, p in points.items()
                                   if not all(r in cache.support.get(k, {}) for r in refs)), key=len)
                    if not need:
                        continue
                    rows = scorer.mean_logprobs(need, [continuation(tok, pseudo, r, eot) for r in refs])
                    n_calls += 1
                    n_pairs += len(need) * len(refs)
                    for p, row in zip(need, rows, strict=True):
                        cache.append({"kind": "support", "point": ids_key(p),
                                      "lp": {r: float(x) for r, x in zip(refs, row, strict=True)}})
            dt = time.perf_counter() - t
            cost["scorer_s"] += dt
            msg += f", scorer in {dt:.1f} s ({n_calls} calls, {n_pairs} pairs so far)"
            item_cost["scorer_s"] = round(dt, 1)
        cache.append({"kind": "done", "item": tr.item.key, "cost": item_cost})
        log(msg)
    cost["scorer_calls"] = n_calls
    for env in envs.values():
        env.close()
    return cost


def answer_classes(tr: ItemTree, tok: Any, cache: Cache) -> dict[str, list[str]]:
    """The reader's distinct answers for the item (stripped, as SIOP's references are) by their normalised form:
    the answers SIOP's offline clustering can put in one cluster."""
    from turngym.grading.qa import normalize_answer

    out: dict[str, list[str]] = {}
    for ctx in tr.reader_contexts():
        for a in cache.answers[sha(reader_prompt(tok, tr.item.question, ctx))]:
            group = out.setdefault(normalize_answer(a), [])
            if a.strip() not in group:
                group.append(a.strip())
    return out


def node_answers(tr: ItemTree, node: Node, tok: Any, cache: Cache) -> list[str]:
    return cache.answers[sha(reader_prompt(tok, tr.item.question, node.passages()))]


def leaf_episodes(tr: ItemTree, tok: Any, cache: Cache, env: Any, conv: Any, fp: dict[str, Any],
                  answers_only: bool = False) -> Iterator[Any]:
    """Every leaf episode of the item: each node answered with each distinct reader answer, and (unless
    ``answers_only``) each search at the last turn, cut by the turn limit."""
    for h, node in enumerate(tr.nodes):
        for a in dict.fromkeys(node_answers(tr, node, tok, cache)):
            yield play_leaf(tr.item, node, Leaf(h, a), env, conv, fp)
        if not answers_only and node.depth == env.unwrapped.max_turns - 1:
            for m in node.legal(env.unwrapped.max_turns):
                if m != "A":
                    yield play_leaf(tr.item, node, Leaf(h, None, m), env, conv, fp, query_for(tr.item, node, m))
