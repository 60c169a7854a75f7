"""``turngym import agentprocessbench|messages``: labelled chat trajectories as turngym episodes (turngym.importers)."""

from __future__ import annotations

import argparse
from typing import Any

from turngym.cli._common import attempt

COMMANDS = ("import",)


def add_parser(sub: Any) -> None:
    """``turngym import agentprocessbench FILE`` and ``turngym import messages FILE --env ENV``."""
    imp = sub.add_parser("import", help="labelled chat trajectories -> turngym episodes with human step labels")
    kinds = imp.add_subparsers(dest="import_kind", required=True, metavar="KIND")
    apb = kinds.add_parser("agentprocessbench", help="AgentProcessBench JSONL (HotpotQA -> SearchQA-v0, BFCL -> BFCL-v0)")
    msg = kinds.add_parser("messages", help="OpenAI-message trajectories with per-step labels")
    msg.add_argument("--env", required=True, help="SearchQA-v0 or BFCL-v0")
    msg.add_argument("--dataset", default=None, help="task dataset name recorded on each episode (e.g. hotpotqa)")
    msg.add_argument("--source", default="messages", help="prefix of episode ids and meta.imported.source")
    for name, default in (("messages", "messages"), ("labels", "step_labels"), ("question", "question"),
                          ("answers", "answers"), ("id", None), ("final-label", None)):
        msg.add_argument(f"--{name}-field", default=default, help=f"record field of the {name.replace('-', ' ')} (a dotted path)")
    for p in (apb, msg):
        p.add_argument("file", help="JSONL (one trajectory per line) or a JSON array")
        p.add_argument("--out", required=True, help="episodes JSONL to write")
        p.add_argument("--overwrite", action="store_true", help="replace --out if it exists (else refused)")
        p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from turngym.importers import Fields, ImportSummary, import_agentprocessbench, import_messages

    def imported() -> ImportSummary:
        if args.import_kind == "agentprocessbench":
            return import_agentprocessbench(args.file, args.out, overwrite=args.overwrite)
        fields = Fields(messages=args.messages_field, labels=args.labels_field, question=args.question_field,
                        answers=args.answers_field, id=args.id_field, final_label=args.final_label_field)
        return import_messages(args.file, args.out, args.env, fields, source=args.source, dataset=args.dataset,
                               overwrite=args.overwrite)

    s = attempt(imported, FileNotFoundError, FileExistsError, ValueError)
    labels = ", ".join(f"{v:+d}: {c}" if v else f"0: {c}" for v, c in sorted(s.labels.items()))
    print(f"wrote {s.written} episode(s) to {s.out} (step labels {labels or 'none'})")
    for ds, c in sorted(s.skipped.items()):
        print(f"skipped {c} trajectory(ies) of {ds}: no turngym env for it")
    return 0
