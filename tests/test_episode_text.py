"""The episode writer stores any string (lone surrogates included) and reads it back identically."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.episode import Episode, EpisodeWriter, Turn, escape_surrogates
from turngym.episode.reader import read_episodes

# every code point, surrogates (category Cs) included, with surrogates drawn often
ANY_CHAR = st.characters(codec=None, categories=None)
SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
ANY_TEXT = st.lists(st.one_of(ANY_CHAR, SURROGATE, st.sampled_from(["\\", '"', "\\u", "\n"])), max_size=40).map("".join)


def episode_with(text: str, key: str = "k") -> Episode:
    return Episode(id=f"ep-{text}", env_id="turngym/Test-v0", task={"question": text, key: [text]},
                   prompt=[{"role": "user", "content": text}],
                   turns=[Turn(index=0, action=text, tool_calls=[{"name": text, "arguments": {key: text}}],
                               parse_error=text, observation=text, metrics={text: text})],
                   final_answer=text, meta={"model": text})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=ANY_TEXT, key=ANY_TEXT)
def test_any_text_round_trips_identically(tmp_path, text, key):
    path = tmp_path / "e.jsonl"
    path.unlink(missing_ok=True)
    ep = episode_with(text, key)
    with EpisodeWriter(path, fsync=False) as w:
        w.write(ep)
    back = read_episodes(path, strict=True).episodes
    assert back == [ep]
    assert back[0].turns[0].action == text  # the same code points, not just an equal-looking string


def test_adjacent_surrogate_halves_stay_two_code_points(tmp_path):
    text = "a\ud83d\ude00b"  # two separate code points, not the emoji they would form in UTF-16
    path = tmp_path / "e.jsonl"
    with EpisodeWriter(path) as w:
        w.write(episode_with(text))
    [ep] = read_episodes(path, strict=True).episodes
    assert ep.final_answer == text and len(ep.final_answer) == 4


def test_lone_surrogates_are_json_escapes_in_valid_utf8(tmp_path):
    path = tmp_path / "e.jsonl"
    with EpisodeWriter(path) as w:
        w.write(episode_with("reply \ud800 and \udfff end"))
    raw = path.read_bytes()
    text = raw.decode("utf-8")  # strict: the line is valid UTF-8 for any other tool
    assert "\\ud800" in text and "\\udfff" in text
    assert json.loads(text.splitlines()[0])["final_answer"] == "reply \ud800 and \udfff end"


def test_escape_touches_only_surrogates():
    s = json.dumps({"a": "x\\ud800 \"q\" 世界 🚀"}, ensure_ascii=False)
    assert escape_surrogates(s) == s


def test_files_written_before_stay_readable_and_appendable(tmp_path):
    """A file written by the previous writer (plain UTF-8, ensure_ascii=False) is read and appended to."""
    path = tmp_path / "e.jsonl"
    old = episode_with("héllo ✓ 世界 🚀")
    path.write_bytes((json.dumps(old.to_dict(), ensure_ascii=False) + "\n").encode("utf-8"))
    with EpisodeWriter(path) as w:
        w.write(episode_with("new \udc80"))
    back = read_episodes(path, strict=True).episodes
    assert back[0] == old and back[1].final_answer == "new \udc80"
