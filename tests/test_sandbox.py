"""Hostile code: each kind returns a clear error within the limits, the session keeps working
for the next cell, and the host is untouched. Every test runs at the strongest isolation level
the machine allows (``auto``); the tests of limits also run at ``rlimits-only`` (an ordinary
user's opt-in: limits and timeouts, not isolation, so the isolation tests skip it there). The
kernel-isolation probes are in test_sandbox_isolation.py."""

import json
import os
import socket
import struct
import time
from contextlib import nullcontext

import psutil
import pytest

from turngym.sandbox import ExecResult, SandboxLimits, SandboxPool
from turngym.sandbox import isolation as iso

LIMITS = SandboxLimits(wall_s=2.0, cpu_s=2.0, memory_bytes=512 << 20, processes=32, max_output=2000)


@pytest.fixture(scope="module", params=["auto", "rlimits-only"])
def pool(request):
    if request.param == iso.RLIMITS_ONLY and os.geteuid() == 0:
        pytest.skip("rlimits-only is refused as root (test_rlimits_only_is_opt_in_and_refused_as_root)")
    with pytest.warns(RuntimeWarning, match="NOT ISOLATION") if request.param == iso.RLIMITS_ONLY else nullcontext():
        p = SandboxPool(size=1, limits=LIMITS, preload=("math",), isolation=request.param)
    yield p
    p.close()


def _isolating(pool):
    if pool.chosen.level == iso.RLIMITS_ONLY:
        pytest.skip("rlimits-only is limits and timeouts, not isolation: nothing keeps a cell from the host")


def test_state_persists_between_cells_and_output_comes_back(pool):
    with pool.session() as s:
        assert s.run("x = 20\nprint('set')").stdout == "set\n"
        r = s.run("print(x * 2 + 2)")
        assert r.ok and r.stdout == "42\n"
        r = s.run("1/0")
        assert r.status == "error" and "ZeroDivisionError" in r.error and '<cell>' in r.error
        assert s.run("print(x)").stdout == "20\n"


HOSTILE = {
    "infinite loop": ("while True: pass", "timeout", "time limit"),
    "sleep": ("import time; time.sleep(60)", "timeout", "time limit"),
    "signal-ignoring loop": ("import signal\nfor s in (signal.SIGALRM, signal.SIGXCPU, signal.SIGTERM):\n"
                             "    signal.signal(s, signal.SIG_IGN)\nwhile True: pass", "timeout", "killed"),
    "giant integer": ("x = 10**10**9", "timeout", "time limit"),
    "memory bomb": ("a = bytearray(4 << 30)", "error", "MemoryError"),
    "list memory bomb": ("a = [0] * (1 << 34)", "error", "MemoryError"),
    "deep recursion": ("def f(n): return f(n + 1)\nf(0)", "error", "RecursionError"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "error", "BlockingIOError"),
    "segfault": ("import ctypes; ctypes.string_at(0)", "crashed", "segmentation fault"),
    "exit": ("raise SystemExit(3)", "error", "SystemExit"),
    "os._exit": ("import os; os._exit(1)", "crashed", "exited"),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_code_gets_a_clear_error_and_the_next_cell_works(pool, kind):
    code, status, needle = HOSTILE[kind]
    with pool.session() as s:
        s.run("marker = 1")
        start = time.monotonic()
        r = s.run(code)
        elapsed = time.monotonic() - start
        assert r.status == status, (r.status, r.render())
        assert needle in r.render()
        assert elapsed < LIMITS.wall_s + 6
        follow = s.run("print('alive')")
        assert follow.ok and follow.stdout == "alive\n"
        if r.restarted:
            assert "restarted" in r.render()


def test_huge_output_is_capped_and_marked(pool):
    with pool.session() as s:
        r = s.run("print('y' * 10_000_000)")
        assert r.ok and r.truncated and len(r.stdout) <= LIMITS.max_output
        assert r.render().endswith("[output truncated]")
        r = s.run("import sys\nfor _ in range(100): sys.stdout.write('z' * 1_000_000)")
        assert len(r.stdout) <= LIMITS.max_output


def test_file_size_and_working_directory(pool):
    with pool.session() as s:
        r = s.run("import os\nopen('local.txt', 'w').write('ok')\nprint(sorted(os.listdir('.')))")
        assert r.ok and "local.txt" in r.stdout
        r = s.run("f = open('big.bin', 'wb')\nf.write(b'0' * (64 << 20))")
        assert r.status == "error" and ("File too large" in r.error or "Errno 27" in r.error)


def test_no_writes_outside_the_sandbox(pool, tmp_path):
    _isolating(pool)
    outside = tmp_path / "host_file.txt"
    with pool.session() as s:
        r = s.run(f"open({str(outside)!r}, 'w').write('pwned')")
        assert r.status == "error" and ("PermissionError" in r.error or "FileNotFoundError" in r.error), r.error
        r = s.run("open('/etc/turngym_pwned', 'w')")
        assert r.status == "error"
    assert not outside.exists() and not os.path.exists("/etc/turngym_pwned")


def test_parent_cannot_be_signalled(pool):
    """The cell's parent is the sandbox's own supervisor (killing it ends only this session);
    the host is out of reach."""
    _isolating(pool)
    with pool.session() as s:
        s.run("x = 1")
        r = s.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time; time.sleep(1)")
        assert r.status in ("error", "crashed")
        if r.status == "error":
            assert "PermissionError" in r.error
        else:
            assert r.restarted
        r = s.run("import os, signal\nos.kill(1, signal.SIGTERM)")
        assert r.status in ("error", "ok")  # init of the sandbox's own namespace ignores it, or not permitted
        r = s.run(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)")
        assert s.run("print('alive')").stdout == "alive\n"
    assert psutil.Process().is_running()


def test_no_network(pool):
    """A port the host listens on is not reachable, nor is any outside address."""
    _isolating(pool)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        with pool.session() as s:
            r = s.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
            assert r.status == "error" and any(k in r.error for k in ("refused", "unreachable", "PermissionError")), r.error
            r = s.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
            assert r.status == "error" and any(k in r.error for k in ("unreachable", "PermissionError")), r.error
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_environment_is_scrubbed_and_stdin_closed(pool, monkeypatch):
    with pool.session() as s:
        r = s.run("import os, sys\nprint(sorted(k for k in os.environ if 'SECRET' in k or 'TOKEN' in k or 'KEY' in k))\n"
                  "print(repr(sys.stdin.read()))")
        assert r.ok and r.stdout.splitlines() == ["[]", "''"]


def test_spawned_daemons_do_not_outlive_their_cell(pool):
    with pool.session() as s:
        r = s.run("import subprocess\n"
                  "p = subprocess.Popen(['sh', '-c', '(setsid sleep 1000 &) ; sleep 1000'], start_new_session=True)\n"
                  "import time; time.sleep(0.3); print('spawned')")
        assert r.ok
        time.sleep(0.3)
        sleepers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "1000"]]
        assert sleepers == []


def test_timeout_kills_every_process_the_worker_started(pool):
    with pool.session() as s:
        r = s.run("import subprocess, signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                  "signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
                  "subprocess.Popen(['sh', '-c', '(setsid sleep 999 &)'])\nwhile True: pass")
        assert r.status == "timeout" and r.restarted
        time.sleep(0.3)
        assert [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "999"]] == []
        assert s.run("print(1)").stdout == "1\n"


def test_null_bytes_and_non_text_are_errors(pool):
    with pool.session() as s:
        assert s.run("print(1)\x00").status == "error"
        assert s.run(b"print(1)").status == "error"


def test_exec_result_render_marks_truncation():
    r = ExecResult(status="ok", stdout="a" * 50)
    assert r.render(max_chars=10) == "a" * 10 + "\n... [output truncated]"


HOST_FORGERIES = {
    "empty frame": b"",
    "not json": b"{oops",
    "not an object": b"[1, 2]",
    "another request's nonce": json.dumps({"nonce": "other", "status": "ok", "stdout": "", "stderr": "", "error": None,
                                           "truncated": False, "elapsed_s": 0.0}).encode(),
    "missing fields": json.dumps({"nonce": "n0", "status": "ok"}).encode(),
    "unknown status": json.dumps({"nonce": "n0", "status": "pwned", "stdout": "", "stderr": "", "error": None,
                                  "truncated": False, "elapsed_s": 0.0}).encode(),
    "wrong types": json.dumps({"nonce": "n0", "status": "ok", "stdout": 5, "stderr": "", "error": None,
                               "truncated": False, "elapsed_s": 0.0}).encode(),
    "oversize length": None,
    **{f"elapsed {v}": json.dumps({"nonce": "n0", "status": "ok", "stdout": "", "stderr": "", "error": None,
                                   "truncated": False, "elapsed_s": v}).encode()
       for v in (float("nan"), float("inf"), -1.0, 1e9)},
}


@pytest.mark.parametrize("kind", sorted(HOST_FORGERIES))
def test_the_host_turns_any_bad_reply_into_an_error_and_a_fresh_worker(pool, kind, monkeypatch):
    """Defence in depth behind the supervisor: whatever arrives on the host's result channel, the
    host checks it; a bad frame is an error result with a fresh interpreter, never an exception."""
    import turngym.sandbox.local as sandbox_module

    monkeypatch.setattr(sandbox_module.secrets, "token_hex", lambda n=16: "n0")
    with pool.session() as s:
        assert s.run("x = 1").ok
        worker = s._worker
        fake_r, fake_w = os.pipe()
        real_r, worker._res_r = worker._res_r, fake_r
        body = HOST_FORGERIES[kind]
        os.write(fake_w, b"\xff\xff\xff\xff" if body is None else struct.pack(">I", len(body)) + body)
        try:
            r = s.run("print('real output')")
        finally:
            os.close(real_r)
            os.close(fake_w)
        assert r.status == "error" and r.restarted and r.error.startswith("SandboxProtocolError"), r.render()
        assert worker.proc.poll() is not None  # the worker behind the bad channel is gone
        assert s.run("print(x)").status == "error"  # a fresh interpreter
        assert s.run("print(2)").stdout == "2\n"


def test_rlimits_only_is_opt_in_and_refused_as_root(monkeypatch, capsys):
    """Simulates a machine without bwrap (the lookup finds none): ``auto`` and ``bubblewrap`` are
    errors that name the opt-in; ``rlimits-only`` is refused as root, and for an ordinary user it
    is announced as not isolation and MathCode episodes record that level."""
    from turngym.envs.math_code import MathCodeEnv
    from turngym.sandbox import SandboxError

    monkeypatch.setattr(iso, "bwrap_path", lambda: None)
    with pytest.raises(SandboxError, match="bubblewrap cannot run"):
        SandboxPool(size=0, isolation="bubblewrap")
    with pytest.raises(SandboxError, match="opt in to isolation='rlimits-only'"):
        SandboxPool(size=0, isolation="auto")
    if os.geteuid() == 0:
        with pytest.raises(SandboxError, match="does not run as root"):
            SandboxPool(size=0, isolation="rlimits-only")
        return
    with pytest.warns(RuntimeWarning, match="SANDBOX IS NOT ISOLATION"):
        weak = SandboxPool(size=0, limits=LIMITS, preload=(), isolation="rlimits-only")
    assert "SANDBOX IS NOT ISOLATION" in capsys.readouterr().err
    with weak:
        env = MathCodeEnv(dataset="gsm8k", sandbox=weak, max_turns=3)
        env.reset(options={"index": 0})
        obs, *_ = env.step("```python\nprint(6 * 7)\n```")
        assert "42" in obs
        assert env.episode.meta["sandbox"]["isolation"] == "rlimits-only"
        assert env.episode.meta["sandbox"]["host_uid"] == os.geteuid() != 0
        env.close()


def test_a_huge_exception_message_is_cut_not_taken_for_a_forgery(pool):
    with pool.session() as s:
        assert s.run("kept = 7").ok
        r = s.run("raise ValueError('x' * 2_000_000)")
        assert r.status == "error" and not r.restarted, r.render()
        assert r.error.startswith("Traceback") and "ValueError: xxx" in r.error and r.error.endswith("[error truncated]")
        assert len(r.error) <= pool.limits.max_output + 30
        assert s.run("print(kept)").stdout == "7\n"  # the interpreter's state survived


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_output_cap_counts_characters_not_bytes(pool, char):
    cap = pool.limits.max_output
    with pool.session() as s:
        r = s.run(f"print({char!r} * {cap + 10})")
        assert r.ok and r.truncated, r.render()
        assert r.stdout == char * cap  # whole characters, no replacement character at the cut
        r = s.run(f"print({char!r} * {cap - 1})")
        assert r.stdout == char * (cap - 1) + "\n" and not r.truncated


def test_processes_forked_after_a_cell_returned_do_not_live_until_the_next(pool):
    """A cell's thread forks a child once the cell has returned: it is gone within moments,
    at every level (with a cgroup freezer the thread does not even run between cells)."""
    with pool.session() as s:
        r = s.run("import subprocess, threading, time\n"
                  "def later():\n    time.sleep(0.3)\n    subprocess.Popen(['sleep', '997'])\n"
                  "threading.Thread(target=later, daemon=True).start()")
        assert r.ok, r.render()
        time.sleep(1.2)
        assert [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "997"]] == []
        assert s.run("print(3)").stdout == "3\n"
