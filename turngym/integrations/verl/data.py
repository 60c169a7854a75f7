"""verl's training data for a turngym env: one parquet row per dataset item, the shape verl's ``RLHFDataset``
reads (``prompt`` chat messages, ``data_source``, ``reward_model``, ``extra_info``), with ``extra_info.index`` (the
item the ``turngym`` agent loop plays) and ``agent_name: turngym``. The env writes the real prompt when the loop
resets it; the row's ``prompt`` is the env's too, so verl's prompt-length filter sees the same text.

    python -m turngym.integrations.verl.data --env Calculator-v0 --out data/calculator.parquet --items 0:512
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from turngym.integrations.envs import full_env_id, make_turngym_env


def rows(env_id: str, indices: Sequence[int], env_kwargs: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """One verl row per item ``indices`` of the env ``env_id`` (made with ``env_kwargs``)."""
    env = make_turngym_env(full_env_id(env_id), **dict(env_kwargs or {}))
    raw = env.unwrapped
    out = []
    for i in indices:
        task = raw.normalise_task(raw.get_item(int(i)))
        out.append({"data_source": raw.env_name, "prompt": raw.make_prompt(task), "agent_name": "turngym",
                    "reward_model": {"style": "turngym", "ground_truth": json.dumps(task.get("answers", []))},
                    "extra_info": {"index": int(i), "env_id": env_id}})
    env.close()
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write verl parquet rows for a turngym env's items.")
    ap.add_argument("--env", required=True, help="a registered turngym env, e.g. Calculator-v0")
    ap.add_argument("--env-kwargs", default="{}", help="the env's arguments as JSON")
    ap.add_argument("--items", default="0:128", help="START:STOP item range")
    ap.add_argument("--out", required=True, help="the parquet file to write")
    args = ap.parse_args(argv)
    start, _, stop = args.items.partition(":")
    import datasets

    table = rows(args.env, range(int(start), int(stop)), json.loads(args.env_kwargs))
    datasets.Dataset.from_list(table).to_parquet(args.out)
    print(f"{len(table)} rows of {full_env_id(args.env)} -> {args.out}")


if __name__ == "__main__":
    main()
