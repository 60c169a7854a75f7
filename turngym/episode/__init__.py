"""Turn-structured episodes: the one record every turngym stage exchanges, and its files.

The record (:mod:`.record`, :mod:`.needs`, :mod:`.groups`), what a reader may see of it (:mod:`.views`), its
JSON text (:mod:`.encoding`), its store (:mod:`.store`), its reader (:mod:`.reader`) and the upgrades of older
records (:mod:`.migrations`). Every public name is exported here too: ``from turngym.episode import Episode``.
"""

from turngym.episode.encoding import (
    decode_line,
    encode_line,
    escape_surrogates,
    json_copy,
    plain_json,
    utf8_encodable,
)
from turngym.episode.groups import EpisodeGroup, group_episodes, group_needs
from turngym.episode.migrations import MIGRATIONS, EnvDeclarations, Migration, record_version
from turngym.episode.needs import (
    ANSWER_CUES,
    ANSWER_KINDS,
    DEFAULT_REWARD_NEEDS,
    LATER_NEEDS,
    MissingRewardNeeds,
    RewardNeeds,
)
from turngym.episode.reader import (
    EpisodeFileError,
    ReadReport,
    load_episodes,
    read_episodes,
    read_records,
    written_ids,
)
from turngym.episode.record import MAX_ACTION_CHARS, RUN_META_KEYS, SCHEMA_VERSION, Episode, TokenLayout, Turn
from turngym.episode.store import BatchedWrites, EpisodeWriter
from turngym.episode.views import played_content, reward_view, turn_labels

__all__ = [
    "ANSWER_CUES", "ANSWER_KINDS", "DEFAULT_REWARD_NEEDS", "LATER_NEEDS", "MAX_ACTION_CHARS", "MIGRATIONS",
    "RUN_META_KEYS", "SCHEMA_VERSION", "BatchedWrites", "EnvDeclarations", "Episode", "EpisodeFileError",
    "EpisodeGroup", "EpisodeWriter", "Migration", "MissingRewardNeeds", "ReadReport", "RewardNeeds", "TokenLayout",
    "Turn", "decode_line", "encode_line", "escape_surrogates", "group_episodes", "group_needs", "json_copy",
    "load_episodes", "played_content", "read_episodes", "read_records", "reward_view", "turn_labels",
    "plain_json", "record_version", "utf8_encodable", "written_ids",
]
