"""``turngym serve-env``: a turngym env served as an OpenEnv environment (turngym.integrations.openenv)."""

from __future__ import annotations

import argparse
from typing import Any

from turngym.cli._common import fail

COMMANDS = ("serve-env",)


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("serve-env", help="serve an env over OpenEnv's reset/step/state protocol (needs the openenv extra)")
    sp.add_argument("--env", required=True, help="env id, e.g. Calculator-v0 or turngym/SearchQA-v0")
    sp.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="env argument (a value is read as JSON when it parses)")
    sp.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    sp.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    sp.add_argument("--max-sessions", type=int, default=64, help="concurrent sessions, one env each (default: %(default)s)")
    sp.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from turngym.run.pipeline import PipelineError, env_kwargs

    if args.max_sessions < 1:
        fail("--max-sessions must be >= 1")
    try:
        from turngym.integrations.openenv import full_env_id, make_app
    except ImportError as exc:
        fail(f"serve-env needs OpenEnv: pip install 'turngym[openenv]' ({exc})")
    try:
        app = make_app(args.env, max_concurrent_envs=args.max_sessions, **env_kwargs(args.env_arg))
    except (PipelineError, ValueError, TypeError, FileNotFoundError, ImportError) as exc:
        fail(f"cannot serve {args.env}: {exc}")
    import uvicorn

    print(f"serving {full_env_id(args.env)} as an OpenEnv environment on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
