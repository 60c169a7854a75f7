import json
import math
import signal
import subprocess
import sys
import time

import pytest

from turngym.episode import SCHEMA_VERSION, Episode, EpisodeFileError, EpisodeWriter, Turn
from turngym.episode.reader import read_episodes, written_ids


def make_episode(i: int, text: str = "héllo ✓ 世界 🚀") -> Episode:
    return Episode(
        id=f"ep-{i}", env_id="turngym/Calculator-v0", task={"question": text, "answers": ["1", None]},
        prompt=[{"role": "user", "content": text}],
        turns=[Turn(index=0, action=f"<calc>{i}</calc>", tool_calls=[{"name": "calc", "arguments": {"text": str(i)}}],
                    observation="\n<result>1</result>\n", reward=0.5, metrics={"nested": {"a": [1, 2.5, None]}},
                    latency_ms={"tool": 1.25}, action_ids=[1, 2, 3], action_logprobs=[-0.1, -2.0, -0.0],
                    observation_ids=[4, 5]),
               Turn(index=1, action="", parse_error="no call", observation=None)],
        final_answer=None, outcome={"correct": False, "f1": 0.25}, terminated=False, truncated=True,
        seed=123, group="g-1", meta={"model": "m"}, prompt_ids=[9, 8, 7])


def test_round_trip_is_lossless(tmp_path):
    eps = [make_episode(0), make_episode(1, text="\u0000\n\t\"quote\" \\ back"),
           Episode(id="empty", env_id="x")]
    path = tmp_path / "e.jsonl"
    with EpisodeWriter(path) as w:
        w.write_all(eps)
    back = read_episodes(path)
    assert back.errors == []
    assert back.episodes == eps
    line = json.loads(path.read_text().splitlines()[0])
    assert line["schema_version"] == SCHEMA_VERSION


def test_nan_reward_round_trips():
    ep = make_episode(0)
    ep.turns[0].reward = float("nan")
    back = Episode.from_json(ep.to_json())
    assert math.isnan(back.turns[0].reward)


def test_corrupt_line_is_reported_by_number_and_rest_kept(tmp_path):
    path = tmp_path / "e.jsonl"
    with EpisodeWriter(path) as w:
        w.write(make_episode(0))
    with path.open("a") as fh:
        fh.write('{"id": "broken", \n')
        fh.write('{"not": "an episode"}\n')
    with EpisodeWriter(path) as w:
        w.write(make_episode(3))
    report = read_episodes(path)
    assert [e.id for e in report.episodes] == ["ep-0", "ep-3"]
    assert [e.line_no for e in report.errors] == [2, 3]
    assert "lacks required field" in str(report.errors[1])
    with pytest.raises(EpisodeFileError, match=r":2:"):
        read_episodes(path, strict=True)


def test_newer_schema_is_refused_with_a_clear_message():
    d = make_episode(0).to_dict()
    d["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match="newer"):
        Episode.from_dict(d)


def test_torn_tail_is_moved_aside_not_lost(tmp_path):
    path = tmp_path / "e.jsonl"
    with EpisodeWriter(path) as w:
        w.write(make_episode(0))
    torn = make_episode(1).to_json()[:57].encode()
    with path.open("ab") as fh:
        fh.write(torn)
    assert len(read_episodes(path).errors) == 1  # the reader sees the torn line as corrupt
    with EpisodeWriter(path) as w:
        assert w.recovered_tail == torn
        w.write(make_episode(2))
    report = read_episodes(path)
    assert report.errors == [] and [e.id for e in report.episodes] == ["ep-0", "ep-2"]
    assert (tmp_path / "e.jsonl.torn").read_bytes().startswith(torn)


WRITER_SCRIPT = """
import sys
from turngym.episode import EpisodeWriter, Episode, Turn
big = "x" * 200_000
with EpisodeWriter(sys.argv[1], fsync=False) as w:
    i = 0
    while True:
        w.write(Episode(id=f"ep-{i}", env_id="e", turns=[Turn(index=0, action=big)]))
        i += 1
"""


def test_writer_killed_mid_write_leaves_only_whole_lines(tmp_path):
    path = tmp_path / "e.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(path)])
    deadline = time.time() + 30
    while (not path.exists() or path.stat().st_size < 2_000_000) and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    report = read_episodes(path)
    assert len(report.episodes) >= 5
    assert len(report.errors) <= 1  # at most a torn tail
    assert [e.id for e in report.episodes] == [f"ep-{i}" for i in range(len(report.episodes))]
    with EpisodeWriter(path) as w:
        w.write(Episode(id="after", env_id="e"))
    again = read_episodes(path)
    assert again.errors == [] and again.episodes[-1].id == "after"
    assert "after" in written_ids(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="episodes file not found"):
        read_episodes(tmp_path / "nope.jsonl")
    assert written_ids(tmp_path / "nope.jsonl") == set()


def test_tools_and_per_turn_observation_roles_round_trip_and_old_records_still_load(tmp_path):
    from turngym.envs.bfcl.env import BFCLEnv

    env = BFCLEnv(category="multi_turn_base", tool_format="native")
    env.reset(options={"index": 0})
    env.step('<tool_call>{"name": "ls", "arguments": {}}</tool_call>')
    env.step("Done.")
    ep = env.episode
    assert ep.tools and [t.observation_role for t in ep.turns] == ["tool", "user"]
    with EpisodeWriter(tmp_path / "e.jsonl") as w:
        w.write(ep)
    assert read_episodes(tmp_path / "e.jsonl").episodes == [ep]
    old = ep.to_dict()
    old.pop("tools")
    for t in old["turns"]:
        t.pop("observation_role")
    back = Episode.from_dict(old)
    assert back.tools is None and all(t.observation_role is None for t in back.turns)
