"""The reward contract (:class:`GroupReward`) and registry.

A reward scores a *group* (the K episodes of one query) and returns one list of
per-turn rewards per episode, in the same order, one value per turn, plus diagnostics
(clusters, q, support per turn) that reports keep.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turngym.episode import Episode
from turngym.registry import Registry, resolve


@dataclass
class GroupScores:
    rewards: list[list[float]]
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def totals(self) -> list[float]:
        return [sum(r) for r in self.rewards]


class GroupReward:
    """The base every reward subclasses: scores a group, declares what it needs, and says so at definition.

    A subclass sets ``name`` (an instance field) and implements :meth:`score_group`. Its class
    attributes are the contract the harness, ablate and the trainer read instead of probing:

    * ``estimator``: the advantage estimator it recommends in training (a run may override it); every
      concrete reward declares one, checked when the class is defined, and it is an unbiased one
      (``EstimatorSpec.unbiased``; tests/test_recipes.py checks every registered reward);
    * ``official_estimator``: the estimator its official code pairs it with, where it has official code
      (None: none). Where that one is biased, a recipe that reproduces the official launcher names it;
    * ``needs_scorer``: it scores support with a language model (siop, igpo): ablate and the main job
      hand it one shared scorer (``scorer=``, ``tokens=``), the trainer binds the live policy through
      :meth:`bind_scorer` when :meth:`scores_with_policy`;
    * ``needs_judge``: an LLM judges its steps (scribe, prm): built with ``llm=`` (one judge shared);
    * ``learns_library``: it takes a ``library=`` and, given none, :meth:`fit` builds one from episodes;
    * ``requires_gold``: every episode it scores needs a gold answer (ablate scores it on those only);
    * ``scores_single_episodes``: :meth:`score_episode` is meaningful alone (no group baseline), so it
      can reward a single env step by step.

    The hooks below are no-ops by default; a reward overrides the ones it uses. A class meant only to
    be subclassed passes ``abstract=True`` (``class Base(GroupReward, abstract=True)``).
    """

    name: str
    estimator: ClassVar[str]
    official_estimator: ClassVar[str | None] = None
    needs_scorer: ClassVar[bool] = False
    needs_judge: ClassVar[bool] = False
    learns_library: ClassVar[bool] = False
    requires_gold: ClassVar[bool] = False
    scores_single_episodes: ClassVar[bool] = False

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not abstract and not any(isinstance(vars(c).get("estimator"), str) for c in cls.__mro__):
            raise TypeError(f"reward {cls.__name__} declares no paired estimator: set the class attribute "
                            "'estimator' (e.g. estimator: ClassVar[str] = 'grpo'), or pass abstract=True")

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        raise NotImplementedError

    def score_episode(self, episode: Episode) -> list[float]:
        """One episode's per-turn rewards alone; only rewards with ``scores_single_episodes`` give them."""
        raise TypeError(f"reward {self.name!r} scores groups only; it has no per-episode reward")

    def scores_with_policy(self) -> bool:
        """True when the trainer must :meth:`bind_scorer` the live policy (official IGPO's ``scorer: policy``)."""
        return False

    def bind_scorer(self, scorer: Any) -> None:
        """Score with this scorer object (the live policy, or one model shared by several rewards)."""
        raise TypeError(f"reward {self.name!r} scores no support; it takes no scorer")

    def fit(self, episodes: Sequence[Episode]) -> Any:
        """Learn what scoring needs from these episodes (SCRIBE: its skill library); default: nothing to learn."""
        return None

    def vote_pool(self) -> int | None:
        """Rollouts per query that vote (TTRL's ``n_votes``): the trainer plays that many; None: the group only."""
        return None

    def observe(self, step: int, episodes: Sequence[Episode] | None = None) -> None:
        """Trainer hook, once per training step (SCRIBE refreshes its library here)."""

    def training_metrics(self) -> dict[str, float]:
        """Trainer hook, once per step: figures to log (drained, so each group counts once)."""
        return {}

    def costs(self) -> dict[str, Any]:
        """What scoring cost, for reports (LLM-judged rewards: call counts and library size)."""
        return {}


# Name -> "module:attribute" of the reward's factory, imported when first built: building a light
# reward (``outcome``) imports no model code, and this module imports no reward.
REWARDS = Registry("reward", {
    "outcome": "turngym.rewards.outcome:OutcomeReward",
    "ttrl": "turngym.rewards.outcome:TTRLReward",
    "empo": "turngym.rewards.outcome:EMPOReward",
    "siop": "turngym.rewards.siop:SIOPReward",
    "igpo": "turngym.rewards.siop:IGPOReward",
    "igpo_siop": "turngym.rewards.siop:IGPOSIOPReward",
    "scribe": "turngym.rewards.scribe.reward:ScribeReward",
    "prm": "turngym.rewards.prm:PRMReward",
    "funrl": "turngym.rewards.funrl:FunRLReward",
    "toolcall_dense": "turngym.rewards.funrl:ToolCallDenseReward",
    "composite": "turngym.rewards.composite:CompositeReward",
    "env": "turngym.rewards.env_reward:EnvReward",
})
JOINED = "turngym.rewards.composite:composite_from_name"  # builds an ``a+b`` name


def split_label(label: str) -> tuple[str, dict[str, Any]]:
    """A reward label: a registered name, optionally with options, ``siop[prefix=after_observation,eta=2]``.
    Returns the name and the options, each value read as a YAML scalar (``2`` an int, ``true`` a bool)."""
    import yaml

    label = label.strip()
    if "[" not in label:
        return label, {}
    name, _, rest = label.partition("[")
    if not rest.endswith("]") or "[" in rest[:-1] or not name:
        raise ValueError(f"reward {label!r}: write options as name[key=value,key=value]")
    if "+" in name:
        raise ValueError(f"reward {label!r}: a composite takes no options in its label; give its parts' options in "
                         "a config file (reward: {name: a+b, a: {...}})")
    options: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in rest[:-1].split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"reward {label!r}: option {item!r} is not key=value")
        options[key.strip()] = yaml.safe_load(value.strip()) if value.strip() else ""
    return name.strip(), options


def reward_options(name: str) -> dict[str, Any]:
    """The options the reward registered as ``name`` takes (its dataclass fields but ``name``) with their defaults
    (``None`` where a field has no plain default)."""
    cls = reward_class(name)
    if not dataclasses.is_dataclass(cls):
        return {}
    return {f.name: (f.default if f.default is not dataclasses.MISSING else None)
            for f in dataclasses.fields(cls) if f.init and f.name != "name"}


def reward_label(name: str, options: dict[str, Any]) -> str:
    """The one spelling of a reward with options: its name, then the options sorted by key."""
    import yaml

    if not options:
        return name
    text = ",".join(f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                    for k, v in sorted(options.items()))
    return f"{name}[{text}]"


def _typed(name: str, key: str, value: Any, default: Any) -> Any:
    """``value`` as the type of the option's default (a float option given ``1e-8`` gets 1e-8, not the string YAML
    1.1 reads); one error naming the option where it cannot be."""
    if isinstance(value, str) and any(c in value for c in ",[]"):
        raise ValueError(f"reward {name!r}: option {key}={value!r} holds ',', '[' or ']', which a label cannot carry; "
                         "give it in a config file")
    want = type(default)
    try:
        if default is None or isinstance(value, want) and not (want is int and isinstance(value, bool)):
            return value
        if want is float and not isinstance(value, bool):
            return float(value)
        if want is int and not isinstance(value, bool) and float(value) == int(float(value)):
            return int(float(value))
    except (TypeError, ValueError):
        pass
    article = "an" if want.__name__[0] in "aeiou" else "a"
    raise ValueError(f"reward {name!r}: option {key} takes {article} {want.__name__} (default {default!r}), got {value!r}")


def parse_label(label: str) -> tuple[str, dict[str, Any]]:
    """``label``'s reward name and options, each option known to the reward and of its default's type."""
    name, options = split_label(label)
    if "+" in name:
        reward_class(name)
        return name, {}
    known = reward_options(name)
    if unknown := [k for k in options if k not in known]:
        raise ValueError(f"reward {name!r} takes no option {', '.join(map(repr, unknown))}; its options: "
                         + (", ".join(sorted(known)) or "none"))
    return name, {k: _typed(name, k, v, known[k]) for k, v in options.items()}


def check_label(label: str) -> str:
    """``label`` in its one spelling, its options checked against the reward's (one error naming them)."""
    return reward_label(*parse_label(label))


def apply_reward_args(labels: Sequence[str], reward_args: Sequence[str]) -> list[str]:
    """Each ``NAME.KEY=VALUE`` of ``reward_args`` set on every label whose reward is ``NAME`` (``--reward-arg
    siop.prefix=after_observation``); a NAME among none of the labels is refused. Labels come back checked."""
    parsed = [split_label(label) for label in labels]
    for arg in reward_args:
        target, eq, value = arg.partition("=")
        name, dot, key = target.partition(".")
        if not eq or not dot or not name or not key:
            raise ValueError(f"--reward-arg {arg!r}: write NAME.KEY=VALUE, e.g. siop.prefix=after_observation")
        hits = [opts for n, opts in parsed if n == name]
        if not hits:
            raise ValueError(f"--reward-arg {arg!r}: no reward {name!r} among {[n for n, _ in parsed]}")
        for opts in hits:
            opts.update(split_label(f"{name}[{key}={value}]")[1])
    return [check_label(reward_label(n, o)) for n, o in parsed]


def reward_class(name: str) -> type[GroupReward]:
    """The class registered as ``name`` (``a+b`` composites: ``CompositeReward``; a label with options: its
    name's), for its declared contract."""
    name = name.partition("[")[0]
    factory = REWARDS.load("composite" if "+" in name else name)
    if not (isinstance(factory, type) and issubclass(factory, GroupReward)):
        raise TypeError(f"reward {name!r} is registered as {factory!r}, which is not a GroupReward subclass; "
                        "rewards subclass turngym.rewards.base.GroupReward and declare their contract there")
    return factory


def declared_estimator(name: str) -> str:
    """The estimator the reward registered as ``name`` declares (``a+b`` composites: ``CompositeReward``'s)."""
    return reward_class(name).estimator


def register_reward(name: str, factory: str | type[GroupReward]) -> None:
    """Add a reward under ``name``: its :class:`GroupReward` subclass or the class's ``"module:attribute"`` path.
    A name is registered once; a second registration raises ``ValueError``."""
    if "+" in name:
        raise ValueError(f"a reward name cannot hold '+' (it joins the parts of a composite), got {name!r}")
    if not isinstance(factory, str) and not (isinstance(factory, type) and issubclass(factory, GroupReward)):
        raise TypeError(f"reward {name!r}: register a GroupReward subclass (or its 'module:Class' path), got {factory!r}")
    REWARDS.register(name, factory)


def get_reward(name: str, **config: Any) -> GroupReward:
    """A reward by registry name (``outcome``, ``igpo``, ``ttrl``, ``empo``, ``siop``, ``scribe``, ``funrl``,
    ``toolcall_dense``, ``prm``, ``composite``), a label with options (``siop[prefix=after_observation]``: the
    reward's ``name`` is then the label), or a weighted sum of several named ``a+b``
    (see ``turngym.rewards.composite``)."""
    if "+" in name:
        try:
            return resolve(JOINED)(name, **config)
        except TypeError as exc:
            raise ValueError(f"bad configuration for reward {name!r}: {exc}") from None

    name, options = parse_label(name)
    label = reward_label(name, options)
    if clash := sorted(set(options) & set(config)):
        raise ValueError(f"reward {label!r}: options {clash} are given twice (in the label and as arguments)")
    if options and "name" not in config:
        config = {**config, "name": label}  # reports and saved scores name the variant, not only the reward
    factory = reward_class(name)
    try:
        return factory(**options, **config)
    except TypeError as exc:
        raise ValueError(f"bad configuration for reward {name!r}: {exc}") from None


def final_turn_rewards(episode: Episode, value: float) -> list[float]:
    """``value`` on the last turn, 0 elsewhere (no turns: empty list)."""
    out = [0.0] * len(episode.turns)
    if out:
        out[-1] = finite(value)
    return out


def finite(x: float) -> float:
    """NaN and inf become 0 (rewards feed normalisation; one bad value would poison a batch)."""
    x = float(x)
    return x if math.isfinite(x) else 0.0


def outcome_score(episode: Episode, metric: str | None = None) -> float:
    """The episode's gold outcome as a number: ``metric`` if given, else the first of
    correct / em / bfcl_valid it has; NaN for an ungraded episode (:attr:`Episode.ungraded`: the grader
    itself failed, which is rare; a refused or timed-out answer is graded wrong). The trainer leaves an
    ungraded episode out of its group, with advantage 0."""
    if episode.ungraded:
        return math.nan
    keys = [metric] if metric else ["correct", "em", "bfcl_valid"]
    for key in keys:
        if key in episode.outcome:
            return float(episode.outcome[key])
    if metric:
        raise KeyError(f"episode {episode.id} has no outcome field {metric!r} (has {sorted(episode.outcome)})")
    return 0.0
