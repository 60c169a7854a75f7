"""Tool-call answers compared as calls: the same calls with the same arguments, key order aside.

A BFCL episode's answer is its decoded calls as JSON; two answers are the same outcome when
their canonical JSON (keys sorted) is equal. Text that is not JSON is compared stripped.
"""

from __future__ import annotations

import json


def canonical_calls(answer: str) -> str:
    """``answer`` as canonical JSON (sorted keys), or stripped text if it is not JSON."""
    try:
        return json.dumps(json.loads(answer), sort_keys=True)
    except (json.JSONDecodeError, TypeError):
        return answer.strip()

