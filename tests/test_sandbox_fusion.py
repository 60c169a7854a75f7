"""The SandboxFusion backend. Against a real server (set TURNGYM_SANDBOXFUSION_URL, e.g. a server
started from SandboxFusion's source; see docs/sandbox.md) it passes the sandbox behaviour tests that
make sense remotely: state across cells, errors, limits, crashes, and restoring a MathCode episode by
replay, with the same observations as the local pool. Without a URL those tests skip; the response
handling is then still checked against a fake server speaking SandboxFusion's documented ``/run_code``
API (named as one: it runs no code)."""

from __future__ import annotations

import base64
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from turngym.envs.base import restore
from turngym.envs.math_code import MathCodeEnv
from turngym.sandbox import SandboxError, SandboxLimits, SandboxPool, make_sandbox
from turngym.sandbox.fusion import RESULT_FILE, SandboxFusion

pytest.importorskip("sandbox_fusion", reason="the SandboxFusion client is not installed (pip install turngym[sandboxfusion])")

URL = os.environ.get("TURNGYM_SANDBOXFUSION_URL")
LIMITS = SandboxLimits(wall_s=2.0, cpu_s=2.0, memory_bytes=512 << 20, max_output=2000)
real = pytest.mark.skipif(not URL, reason="no SandboxFusion server: set TURNGYM_SANDBOXFUSION_URL to run these")


@pytest.fixture(scope="module")
def fusion():
    return make_sandbox(f"sandboxfusion:{URL}", LIMITS)


@real
def test_state_persists_between_cells_and_errors_come_back(fusion):
    with fusion.session() as s:
        assert s.run("x = 20\nprint('set')").stdout == "set\n"
        r = s.run("print(x * 2 + 2)")
        assert r.ok and r.stdout == "42\n"
        r = s.run("1/0")
        assert r.status == "error" and "ZeroDivisionError" in r.error and "<cell>" in r.error
        assert s.run("print(x)").stdout == "20\n"
        assert s.describe()["backend"] == "sandboxfusion" and s.describe()["replayed_cells"] == 4


HOSTILE = {
    "infinite loop": ("while True: pass", "timeout", "time limit"),
    "sleep": ("import time; time.sleep(60)", "timeout", "time limit"),
    "signal-ignoring loop": ("import signal\nfor s in (signal.SIGALRM, signal.SIGXCPU, signal.SIGTERM):\n"
                             "    signal.signal(s, signal.SIG_IGN)\nwhile True: pass", "timeout", "killed"),
    "giant integer": ("x = 10**10**9", "timeout", "time limit"),
    "memory bomb": ("a = bytearray(4 << 30)", "error", "MemoryError"),
    "deep recursion": ("def f(n): return f(n + 1)\nf(0)", "error", "RecursionError"),
    "file too large": ("open('big.bin', 'wb').write(b'0' * (64 << 20))", "error", "File too large"),
    "segfault": ("import ctypes; ctypes.string_at(0)", "crashed", "segmentation fault"),
    "exit": ("raise SystemExit(3)", "error", "SystemExit: 3"),
    "os._exit": ("import os; os._exit(1)", "crashed", "exited"),
}


@real
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_code_gets_a_clear_error_and_the_next_cell_works(fusion, kind):
    code, status, needle = HOSTILE[kind]
    with fusion.session() as s:
        s.run("marker = 1")
        r = s.run(code)
        assert r.status == status, (r.status, r.render())
        assert needle in r.render()
        follow = s.run("print(marker)")
        if r.restarted:  # a crash empties the session, as a crash restarts the local interpreter
            assert "restarted" in r.render() and "NameError" in follow.error
        else:
            assert follow.ok and follow.stdout == "1\n"


@real
def test_huge_output_is_capped_and_marked(fusion):
    with fusion.session() as s:
        r = s.run("print('y' * 100_000)")
        assert r.ok and r.truncated and len(r.stdout) == LIMITS.max_output
        assert r.render().endswith("[output truncated]")


@real
def test_replayed_cells_print_nothing_and_a_timed_out_cell_is_not_replayed(fusion):
    with fusion.session() as s:
        s.run("print('first')\nn = 1")
        assert s.run("import time\nn += 1\ntime.sleep(60)").status == "timeout"
        r = s.run("print(n)")
        assert r.stdout == "1\n"  # the earlier cell's print is not shown again; the timed-out cell left nothing


ACTIONS = ["```python\nleft = 16 - 3 - 4\nprint(left)\n```", "```python\nprint(left * 2)\nundefined_name\n```",
           "```python\nimport math\nprint(math.comb(left, 2))\n```"]


def _play(env, actions):
    env.reset(options={"index": 0})
    return [env.step(a)[0] for a in actions]


@real
def test_a_mathcode_episode_matches_the_local_pool_and_restores_by_replay():
    remote = MathCodeEnv(dataset="gsm8k", sandbox=f"sandboxfusion:{URL}", limits=LIMITS, max_turns=6)
    with SandboxPool(size=1, limits=LIMITS, preload=("math",)) as pool:
        local = MathCodeEnv(dataset="gsm8k", sandbox=pool, limits=LIMITS, max_turns=6)
        assert _play(remote, ACTIONS) == _play(local, ACTIONS)
        local.close()
    episode = remote.unwrapped.episode
    assert episode.meta["sandbox"]["backend"] == "sandboxfusion" and episode.meta["sandbox"]["url"] == URL
    branch = MathCodeEnv(dataset="gsm8k", sandbox=f"sandboxfusion:{URL}", limits=LIMITS, max_turns=6)
    assert restore(branch, episode, 2) == []  # the replayed observations equal the recorded ones
    obs, *_ = branch.step("```python\nprint(left + 1)\n```")
    assert "10" in obs  # the branch continues from the restored state
    remote.close()
    branch.close()


# ------------------------------------------------------------ a fake server (documented API; runs no code)


class _FakeSandboxFusion(BaseHTTPRequestHandler):
    """Answers ``POST /run_code`` with the next canned response body (or an HTTP status)."""

    replies: list = []
    requests: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        reply = type(self).replies.pop(0)
        data = json.dumps(reply).encode() if isinstance(reply, dict) else b"server error"
        self.send_response(200 if isinstance(reply, dict) else reply)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake():
    _FakeSandboxFusion.replies, _FakeSandboxFusion.requests = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSandboxFusion)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _FakeSandboxFusion
    server.shutdown()


def _reply(status="Finished", return_code=0, stdout="", report=None, sandbox_status="Success"):
    files = {} if report is None else {RESULT_FILE: base64.b64encode(json.dumps(report).encode()).decode()}
    return {"status": sandbox_status, "message": "", "compile_result": None, "executor_pod_name": None,
            "run_result": {"status": status, "execution_time": 0.05, "return_code": return_code, "stdout": stdout,
                           "stderr": ""}, "files": files}


def test_fake_server_requests_carry_the_history_and_limits_and_replies_map_to_results(fake):
    url, server = fake
    ok = {"status": "ok", "error": None, "elapsed_s": 0.01}
    server.replies += [_reply(stdout="1\n", report=ok), _reply(stdout="", report=ok),
                       _reply(status="TimeLimitExceeded", return_code=None), _reply(return_code=139, report=None),
                       _reply(report=ok)]
    s = SandboxFusion(url, LIMITS, max_attempts=1).session()
    assert s.run("a = 1\nprint(a)").stdout == "1\n"
    assert s.run("b = 2").ok
    first = json.loads(base64.b64decode(server.requests[1]["files"][".turngym-cells.json"]))
    assert first["history"] == ["a = 1\nprint(a)"] and first["cell"] == "b = 2" and first["limits"]["wall_s"] == 2.0
    assert server.requests[1]["memory_limit_MB"] == 512 and server.requests[1]["language"] == "python"
    t = s.run("while True: pass")
    assert t.status == "timeout" and "time limit (2 s)" in t.error and len(s.history) == 2
    c = s.run("import ctypes; ctypes.string_at(0)")
    assert c.status == "crashed" and c.restarted and "segmentation fault" in c.error and s.history == []
    assert s.run("print(1)").ok
    assert json.loads(base64.b64decode(server.requests[4]["files"][".turngym-cells.json"]))["history"] == []


def test_fake_server_failures_are_one_clear_error(fake):
    url, server = fake
    server.replies += [_reply(sandbox_status="SandboxError"), 500]
    s = SandboxFusion(url, LIMITS, max_attempts=1).session()
    with pytest.raises(SandboxError, match="SandboxFusion at .* failed after 1 attempt"):
        s.run("print(1)")
    with pytest.raises(SandboxError, match="responded with code 500"):
        s.run("print(1)")
    bad = {"status": "ok", "error": None, "elapsed_s": float("nan")}
    server.replies += [_reply(report={"nonsense": 1}), _reply(report=bad)]
    assert "unreadable status report" in s.run("print(1)").error
    assert "impossible status report" in s.run("print(1)").error


def test_a_bad_spec_or_url_is_refused_before_any_request():
    with pytest.raises(ValueError, match="needs the server's URL"):
        make_sandbox("sandboxfusion")
    with pytest.raises(ValueError, match="starts with http"):
        make_sandbox("sandboxfusion:localhost:8080")
    with pytest.raises(ValueError, match="unknown sandbox 'e2b'"):
        MathCodeEnv(dataset="gsm8k", sandbox="e2b")


# ------------------------------------------------------------ the health check when an env is built


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_server_stops_the_env_at_build_with_one_line_naming_it():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(SandboxError) as err:
        MathCodeEnv(dataset="gsm8k", sandbox=f"sandboxfusion:{url}", limits=LIMITS)
    assert str(err.value) == f"the SandboxFusion server at {url} is not usable: connection refused"


def test_the_health_check_runs_a_test_cell_through_the_driver(fake):
    url, server = fake
    ok = {"status": "ok", "error": None, "elapsed_s": 0.01}
    server.replies += [_reply(stdout="ok\n", report=ok), _reply(stdout="ok\n", report=ok)]
    env = MathCodeEnv(dataset="gsm8k", sandbox=f"sandboxfusion:{url}", limits=LIMITS)  # the fake answers its test cell
    job = json.loads(base64.b64decode(server.requests[0]["files"][".turngym-cells.json"]))
    assert job["history"] == [] and job["cell"] == "print('ok')" and env.check_ready() is None
    bad = {"status": "error", "error": "Traceback (most recent call last):\nPermissionError: denied", "elapsed_s": 0.0}
    server.replies += [_reply(report=bad), 500]
    fusion = SandboxFusion(url, LIMITS)
    with pytest.raises(SandboxError, match=r"at http://127\.0\.0\.1:\d+ is not usable: a test cell came back error "
                                           r"\(PermissionError: denied\)$"):
        fusion.check_ready()
    with pytest.raises(SandboxError, match=r"is not usable: it answered HTTP 500$"):
        fusion.check_ready()
