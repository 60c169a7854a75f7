"""SCRIBE: skill-prototype rubrics checked by a judge, as per-turn process rewards.

``llm`` (strict-JSON calls), ``embed`` and ``cluster`` (skill grouping), ``library``
(prototypes, build, JSON), ``steps`` (decompose, route, judge), ``reward`` (the ``scribe``
reward wrapper), ``diagnostics`` (judge reliability).
"""
