"""``--server`` and ``--prompt-format``: parsed with their defaults shown, refused with one clear
line when they cannot apply, and carried to the OpenAI-compatible policy by every command that
takes ``--base-url`` (the end-to-end run against a real server is in test_openai_server.py)."""

import pytest

from turngym.agents.openai_compat import OpenAICompatPolicy, server_options
from turngym.cli import build_parser, main
from turngym.evals.harness import EvalError, EvalSpec, run_eval


@pytest.mark.parametrize("command", [["eval", "--out", "o"], ["rollout", "--out", "o"], ["play"]])
def test_defaults_and_choices_parse_on_every_command_with_base_url(command):
    args = build_parser().parse_args(command)
    assert (args.server, args.prompt_format) == ("auto", "chat")
    args = build_parser().parse_args(command + ["--base-url", "http://h/v1", "--server", "openai", "--prompt-format", "text"])
    assert (args.base_url, args.server, args.prompt_format) == ("http://h/v1", "openai", "text")


def test_help_shows_the_choices_and_defaults(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--server {auto,vllm,openai}" in text and "--prompt-format {chat,text}" in text
    assert "(default: auto)" in text and "(default: chat)" in text


@pytest.mark.parametrize("flag,value", [("--server", "tgi"), ("--prompt-format", "completion")])
def test_an_unknown_value_is_one_clear_error(capsys, flag, value):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["eval", "--out", "o", "--base-url", "http://h/v1", flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}: invalid choice: '{value}'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["eval", "--out", "OUT"], ["rollout", "--out", "OUT/r.jsonl"]])
def test_server_options_without_base_url_are_refused_before_anything_runs(tmp_path, command):
    argv = [a.replace("OUT", str(tmp_path / "run")) for a in command] + ["--env", "Calculator-v0", "--server", "vllm"]
    with pytest.raises(SystemExit, match="^error: --server and --prompt-format apply to an OpenAI-compatible server "
                                         "only: add --base-url$"):
        main(argv)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_server_options_reach_the_policy_and_the_run_settings(monkeypatch, tmp_path):
    assert server_options(None) == {} and server_options(None, "auto", "chat") == {}
    assert server_options("http://h/v1", "vllm", "text") == {"server": "vllm", "prompt_format": "text"}
    with pytest.raises(ValueError, match="--server must be one of auto, vllm, openai"):
        server_options("http://h/v1", "tgi")
    spec = EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 1}, model="m", base_url="http://127.0.0.1:9/v1",
                    limit=1, server="openai", prompt_format="text")
    assert spec.settings()["server"] == "openai" and spec.settings()["prompt_format"] == "text"
    assert "server" not in EvalSpec(env_id="turngym/Calculator-v0").settings()  # local model runs: settings as before

    seen = {}

    def recording_load_policy(model, base_url=None, **kwargs):  # a fake loader: records, builds the real policy
        seen.update(model=model, base_url=base_url, **kwargs)
        raise RuntimeError("stop here: the policy arguments are what this test checks")

    monkeypatch.setattr("turngym.agents.loading.load_policy", recording_load_policy)
    with pytest.raises(RuntimeError, match="stop here"):
        run_eval(spec, tmp_path / "eval")
    assert seen == {"model": "m", "base_url": "http://127.0.0.1:9/v1", "server": "openai", "prompt_format": "text"}
    policy = OpenAICompatPolicy(model="m", base_url="http://127.0.0.1:9/v1", **server_options(spec.base_url, "openai", "text"))
    assert (policy.server_kind, policy.prompt_format) == ("openai", "text")  # configured: /models is not asked
    with pytest.raises(EvalError, match="--prompt-format must be one of chat, text"):
        run_eval(EvalSpec(env_id="turngym/Calculator-v0", base_url="http://h/v1", prompt_format="completion"), tmp_path / "e2")


def test_default_server_options_leave_a_server_run_settings_as_before():
    """A --base-url run written before --server/--prompt-format existed resumes under the defaults."""
    from turngym.evals.harness import EvalSpec

    settings = EvalSpec(env_id="turngym/Calculator-v0", base_url="http://h/v1").settings()
    assert "server" not in settings and "prompt_format" not in settings
    assert EvalSpec(env_id="turngym/Calculator-v0", base_url="http://h/v1", server="vllm").settings()["server"] == "vllm"
