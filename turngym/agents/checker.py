"""Contract checkers for policies and env handles, in the spirit of :func:`turngym.envs.checker.check_text_env`.

Callers read a policy's declared members (:class:`~turngym.agents.policy.Policy`) and never probe
it, so a declaration that lies fails deep inside a run (a continuous run on a policy that cannot
stream, a judge scoring with weights that are not there). This checks the declaration against the
object once, up front, and says which rule it breaks in one line. The rollout runner runs the
static checks on every policy it is given; ``request=`` also plays one request through
``generate`` (and ``stream``, where declared), for a new backend's tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable
from typing import Any

from turngym.agents.options import PROMPT_FORMATS
from turngym.agents.policy import Generation, GenerationRequest, PolicyBase, SamplingParams

# the members every policy has (PolicyBase supplies all but name, tokenizer and generate)
MEMBERS = ("name", "tokenizer", "max_context", "prompt_format", "supports_stream", "supports_score", "generate")


class PolicyContractError(TypeError):
    """A policy breaks the declared Policy contract; the message says which rule."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise PolicyContractError(message)


def _offers_stream(policy: Any) -> bool:
    """Whether the policy's class defines a ``stream`` of its own (not PolicyBase's refusal)."""
    own = inspect.getattr_static(policy, "stream", None)
    return callable(own) and own is not inspect.getattr_static(PolicyBase, "stream")


def check_policy(policy: Any, request: GenerationRequest | None = None,
                 sampling: SamplingParams | None = None) -> None:
    """Raise :class:`PolicyContractError` unless ``policy`` declares every member and honours its declaration.

    Static checks (no generation): every member of the contract is present and well typed;
    ``supports_stream`` is True exactly when the class defines ``stream`` (which takes ``prepare=``);
    ``supports_score`` comes with an in-process ``model`` and a ``tokenizer``. With ``request``, ``generate``
    must answer it with one :class:`Generation`, and a declared ``stream`` must deliver exactly one reply for it.
    """
    kind = type(policy).__name__
    missing = [m for m in MEMBERS if m not in dir(policy)]
    _require(not missing, f"{kind} does not declare {', '.join(missing)} (subclass turngym.agents.policy.PolicyBase)")
    name = policy.name
    _require(isinstance(name, str) and bool(name), f"{kind}: name must be a non-empty string, got {name!r}")
    ctx = policy.max_context
    _require(ctx is None or (isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0),
             f"{kind} {name!r}: max_context must be None or a positive int, got {ctx!r}")
    _require(policy.prompt_format in PROMPT_FORMATS,
             f"{kind} {name!r}: prompt_format must be one of {PROMPT_FORMATS}, got {policy.prompt_format!r}")
    _require(callable(policy.generate), f"{kind} {name!r}: generate must be a method")
    for flag, value in (("supports_stream", policy.supports_stream), ("supports_score", policy.supports_score)):
        _require(isinstance(value, bool), f"{kind} {name!r}: {flag} must be a bool, got {value!r}")
    offers = _offers_stream(policy)
    _require(offers or not policy.supports_stream,
             f"{kind} {name!r} declares supports_stream=True but defines no stream() method")
    _require(policy.supports_stream or not offers,
             f"{kind} {name!r} defines stream() but declares supports_stream=False: declare what it offers")
    if offers:
        _require("prepare" in inspect.signature(policy.stream).parameters,
                 f"{kind} {name!r}: stream() must take prepare= (replies that landed together, announced first)")
    if policy.supports_score:
        _require("model" in dir(policy) and policy.model is not None and callable(policy.model),
                 f"{kind} {name!r} declares supports_score=True but has no in-process model to score with")
        _require(policy.tokenizer is not None, f"{kind} {name!r} declares supports_score=True but has no tokenizer")
    if request is not None:
        _exercise(policy, kind, name, request, sampling or SamplingParams(max_new_tokens=4, temperature=0))


def _exercise(policy: Any, kind: str, name: str, request: GenerationRequest, sampling: SamplingParams) -> None:
    """Play ``request`` through generate and, where declared, stream: each must give one Generation."""
    gens = policy.generate([request], sampling)
    _require(isinstance(gens, list) and len(gens) == 1 and isinstance(gens[0], Generation),
             f"{kind} {name!r}: generate must return one Generation per request, got {gens!r}"[:300])
    if not policy.supports_stream:
        return
    fed: list[tuple[Hashable, GenerationRequest]] = [("check", request)]
    got: list[tuple[Hashable, Any]] = []

    def feed(free: int) -> list[tuple[Hashable, GenerationRequest]]:
        out = fed[:free]
        del fed[:len(out)]
        return out

    def deliver(key: Hashable, gen: Generation) -> None:
        got.append((key, gen))

    policy.stream(feed, deliver, sampling, 1)
    _require(len(got) == 1 and got[0][0] == "check" and isinstance(got[0][1], Generation),
             f"{kind} {name!r} declares supports_stream=True but its stream delivered {len(got)} replies for 1 request")


# ------------------------------------------------------------------ env handles

HANDLE_METHODS = ("reset", "step", "close")
FACE_METHODS = ("reply_prefill", "end_episode", "submit_reset", "submit_step")


class EnvContractError(TypeError):
    """An env handle or factory breaks the declared contract (:mod:`turngym.agents.env_handle`)."""


def _env_require(ok: bool, message: str) -> None:
    if not ok:
        raise EnvContractError(message)


def check_env_handle(env: Any) -> None:
    """Raise :class:`EnvContractError` unless ``env`` has every member of :class:`~turngym.agents.env_handle.EnvHandle`
    and its ``unwrapped`` every member of :class:`~turngym.agents.env_handle.EnvFace`, well typed."""
    kind = type(env).__name__
    missing = [m for m in HANDLE_METHODS if not callable(inspect.getattr_static(env, m, None))]
    _env_require("unwrapped" in dir(env) and not missing,
                 f"{kind} is no env handle: it lacks {', '.join(missing or ['unwrapped'])}")
    face = env.unwrapped
    kind = type(face).__name__
    missing = [m for m in FACE_METHODS if not callable(inspect.getattr_static(face, m, None))]
    _env_require(not missing, f"{kind} lacks {', '.join(missing)} (subclass turngym.envs.base.TextEnv, which has them)")
    _env_require(isinstance(face.env_name, str) and bool(face.env_name), f"{kind}: env_name must be a non-empty string")
    _env_require(isinstance(face.dataset_name, str), f"{kind}: dataset_name must be a string, got {face.dataset_name!r}")
    stop = face.stop
    _env_require(isinstance(stop, tuple) and all(isinstance(s, str) and s for s in stop),
                 f"{kind}: stop must be a tuple of non-empty strings, got {stop!r}")
    _env_require(isinstance(face.prefills, bool), f"{kind}: prefills must be a bool, got {face.prefills!r}")
    role = face.observation_role
    _env_require(role is None or isinstance(role, str), f"{kind}: observation_role must be None or a string, got {role!r}")
    turns = face.max_turns
    _env_require(isinstance(turns, int) and not isinstance(turns, bool) and turns > 0,
                 f"{kind}: max_turns must be a positive int, got {turns!r}")


def check_env_factory(factory: Any) -> None:
    """Raise :class:`EnvContractError` unless ``factory`` is a declared :class:`~turngym.agents.env_handle.EnvFactory`
    whose ``slots`` is None or a positive int."""
    from turngym.agents.env_handle import EnvFactory

    _env_require(isinstance(factory, EnvFactory), f"{type(factory).__name__} is no EnvFactory "
                 "(subclass turngym.agents.env_handle.EnvFactory, or wrap a callable with env_factory())")
    slots = factory.slots
    _env_require(slots is None or (isinstance(slots, int) and not isinstance(slots, bool) and slots > 0),
                 f"{type(factory).__name__}: slots must be None or a positive int, got {slots!r}")
