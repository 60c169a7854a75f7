"""Kernel isolation probes (issue: cells touched the host through symlinks, subprocesses,
ctypes, a host unix socket, /tmp, child processes, /proc, nested user namespaces, same-uid
kills and forged protocol frames). Each probe runs real Python cells in a bubblewrap worker,
gets an error result or is contained, the next cell works, and nothing outside the sandbox
changes (canary folders, sockets, other sessions' state).

These tests need bubblewrap. They fail (not skip) where it is missing or cannot run, unless
the tests run without root and bwrap is not installed (then set-up could not install it).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from turngym.envs.math_code import MathCodeEnv
from turngym.sandbox import SandboxError, SandboxLimits, SandboxPool
from turngym.sandbox import isolation as iso
from turngym.sandbox.local import Isolation, _Worker

LIMITS = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_bytes=768 << 20, processes=32, max_output=4000,
                       tree_memory_bytes=512 << 20, disk_bytes=32 << 20)


def _require_bubblewrap() -> None:
    if os.geteuid() != 0 and iso.bwrap_path() is None:
        pytest.skip("bubblewrap is not installed and set-up could not install it without root")
    bwrap = iso.bwrap_path()
    why = "bwrap is not installed (scripts/setup.sh installs it as root)" if bwrap is None else iso.bwrap_probe(bwrap)
    if why:
        pytest.fail(f"bubblewrap cannot run here: {why}")


@pytest.fixture(scope="module")
def pool():
    _require_bubblewrap()
    p = SandboxPool(size=2, limits=LIMITS, preload=("math",), isolation="auto")
    assert p.chosen.level in (iso.BUBBLEWRAP_CGROUP, iso.BUBBLEWRAP)
    if os.geteuid() == 0 and p.chosen.level != iso.BUBBLEWRAP_CGROUP:
        print(f"note: no cgroup here: {p.chosen.note}")
    yield p
    p.close()


@pytest.fixture
def host_dir(tmp_path):
    """A host folder outside the sandbox holding a canary file."""
    d = tmp_path / "host"
    d.mkdir()
    (d / "canary.txt").write_text("canary")
    return d


def _snapshot(d: Path) -> dict:
    return {p.name: (p.is_symlink(), p.stat().st_size if p.exists() else None) for p in sorted(d.iterdir())}


def _assert_next_cell_works(s) -> None:
    r = s.run("print('next', 6 * 7)")
    assert r.ok and r.stdout == "next 42\n", r.render()


def test_an_interpreter_started_by_a_path_with_dotdot_through_a_host_folder_still_runs_cells(tmp_path):
    """``../.venv/bin/python`` from a subfolder: the kernel resolves ".." through folders the sandbox's view does
    not hold, so the sandbox must be handed the interpreter's absolute path (before: bwrap's execvp failed and no
    pool could start)."""
    _require_bubblewrap()
    exe = os.path.abspath(sys.executable)
    dotted = os.path.relpath(exe, tmp_path)  # relative: Python makes sys.executable cwd + this, ".." kept
    assert dotted.startswith("..") and os.path.samefile(tmp_path / dotted, exe)
    code = ("from turngym.sandbox import SandboxPool\n"
            "p = SandboxPool(size=1, isolation='auto')\n"
            "with p.session() as s:\n    print(s.run('print(6 * 7)').stdout, end='')\np.close()\n")
    out = subprocess.run([dotted, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "42\n", out.stderr[-2000:]


def test_links_and_fifos_to_a_host_folder_do_not_reach_it(pool, host_dir):
    before = _snapshot(host_dir)
    with pool.session() as s:
        for call in (f"os.symlink('/etc/passwd', {str(host_dir / 'ln')!r})",
                     f"os.link({str(host_dir / 'canary.txt')!r}, {str(host_dir / 'hard')!r})",
                     f"os.mkfifo({str(host_dir / 'fifo')!r})",
                     f"open({str(host_dir / 'canary.txt')!r}, 'w').write('pwned')"):
            r = s.run(f"import os\n{call}")
            assert r.status == "error" and ("FileNotFoundError" in r.error or "PermissionError" in r.error
                                            or "Read-only" in r.error), (call, r.render())
        # inside its own folder it may link and fifo freely; none of it is the host's
        r = s.run("import os\nos.symlink('/etc', 'etc_link')\nos.mkfifo('f')\nprint(sorted(os.listdir('.')))")
        assert r.ok and "etc_link" in r.stdout
        _assert_next_cell_works(s)
    assert _snapshot(host_dir) == before and (host_dir / "canary.txt").read_text() == "canary"


def test_subprocess_and_ctypes_cannot_write_to_the_host(pool, host_dir):
    before = _snapshot(host_dir)
    with pool.session() as s:
        r = s.run(textwrap.dedent(f"""
            import subprocess
            p = subprocess.run(['sh', '-c', 'echo pwned > {host_dir}/sub.txt; echo pwned > /usr/pwned; '
                                'touch /etc/pwned'], capture_output=True, text=True)
            print(p.returncode)
            print(p.stderr)
        """))
        assert r.ok and r.stdout.split()[0] != "0", r.render()
        assert "Read-only file system" in r.stdout and "/etc/pwned" in r.stdout, r.stdout
        r = s.run(textwrap.dedent(f"""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.open({str(host_dir / 'ctypes.txt').encode()!r}, os.O_WRONLY | os.O_CREAT, 0o644)
            mnt = libc.mount(b'none', b'/usr', b'tmpfs', 0, None)
            chroot = libc.chroot(b'/')
            print(fd, mnt, chroot)
        """))
        assert r.ok and r.stdout.split() == ["-1", "-1", "-1"], r.render()
        _assert_next_cell_works(s)
    assert _snapshot(host_dir) == before
    assert not os.path.exists("/usr/pwned") and not os.path.exists("/etc/pwned")


def test_host_unix_sockets_are_out_of_reach(pool, tmp_path):
    path = tmp_path / "host.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)
    server.setblocking(False)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0turngym-probe-{os.getpid()}")
    abstract.listen(4)
    abstract.setblocking(False)
    try:
        with pool.session() as s:
            r = s.run(f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(path)!r})")
            assert r.status == "error" and ("FileNotFoundError" in r.error or "refused" in r.error), r.render()
            r = s.run(f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0turngym-probe-{os.getpid()}')")
            assert r.status == "error" and "refused" in r.error, r.render()
            r = s.run("import os\nprint([p for p in ('/run', '/var/run', '/var', '/run/user') if os.path.exists(p)])")
            assert r.ok and r.stdout == "[]\n"
            _assert_next_cell_works(s)
        for srv in (server, abstract):
            with pytest.raises(BlockingIOError):
                srv.accept()
    finally:
        server.close()
        abstract.close()


def test_writing_384_mib_to_tmp_stops_at_the_private_tmpfs(pool):
    host_tmp = set(os.listdir("/tmp"))
    with pool.session() as s:
        r = s.run("f = open('/tmp/fill.bin', 'wb')\nfor _ in range(384):\n    f.write(b'0' * (1 << 20))")
        assert r.status == "error" and ("No space left" in r.error or "File too large" in r.error), r.render()
        r = s.run("f = open('/dev/shm/fill.bin', 'wb')\nfor _ in range(384):\n    f.write(b'0' * (1 << 20))")
        assert r.status == "error" and ("No space left" in r.error or "File too large" in r.error), r.render()
        r = s.run("import os\nprint(os.statvfs('/tmp').f_blocks * os.statvfs('/tmp').f_frsize)")
        assert r.ok and int(r.stdout) <= LIMITS.disk_bytes
        _assert_next_cell_works(s)
    assert "fill.bin" not in set(os.listdir("/tmp")) - host_tmp


def test_memory_of_the_whole_cell_tree_is_capped(pool):
    """Four children of 256 MiB each (1 GiB in all) against a 512 MiB cap for the tree."""
    if pool.chosen.level != iso.BUBBLEWRAP_CGROUP:
        pytest.skip(f"this machine lets no cgroup be created, so the tree cap is per process here: {pool.chosen.note}")
    with pool.session() as s:
        worker = s._worker
        r = s.run(textwrap.dedent("""
            import subprocess, sys
            code = "b = bytearray(256 << 20)\\nfor i in range(0, len(b), 4096): b[i] = 1\\nimport time; time.sleep(1)"
            kids = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(4)]
            print([k.wait() for k in kids])
        """))
        assert r.status in ("ok", "crashed", "error", "timeout"), r.render()  # timeout: a slow, loaded machine
        if r.ok:
            codes = json.loads(r.stdout)
            assert any(c == -signal.SIGKILL for c in codes), codes  # the OOM killer took some of them
        peak = worker.cgroup.peak_memory() if worker.cgroup.final_peak is None else worker.cgroup.final_peak
        assert peak is not None and peak <= LIMITS.tree_memory_bytes + (8 << 20), peak
        _assert_next_cell_works(s)


def test_fork_bomb_is_capped_for_the_tree(pool):
    host_procs = len(psutil.pids())
    with pool.session() as s:
        r = s.run("import os, time\nkids = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
                  "            os._exit(0)\n        kids += 1\nexcept OSError as e:\n    print(kids, type(e).__name__)")
        assert r.ok and "BlockingIOError" in r.stdout, r.render()
        assert int(r.stdout.split()[0]) < LIMITS.processes
        _assert_next_cell_works(s)
    assert len(psutil.pids()) < host_procs + LIMITS.processes * 2


def test_proc_shows_only_the_sandbox(pool):
    me = os.getpid()
    with pool.session() as s:
        r = s.run(textwrap.dedent("""
            import os
            pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
            cmds = []
            for p in pids:
                try:
                    cmds.append(open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode()[:80])
                except OSError:
                    cmds.append(None)
            print(len(pids), max(pids))
            print(cmds)
        """))
        assert r.ok, r.render()
        count, top = map(int, r.stdout.splitlines()[0].split())
        assert count <= 4 and top < 100, r.stdout  # bwrap's init, the supervisor, the interpreter
        assert "pytest" not in r.stdout and str(me) not in r.stdout.splitlines()[0]
        r = s.run(f"print(open('/proc/{me}/cmdline').read())")
        assert r.status == "error" and "FileNotFoundError" in r.error
        r = s.run("import os\nprint(os.path.exists('/sys'), os.path.exists('/root/.ssh'), os.path.exists('/home'))")
        assert r.stdout == "False False False\n"
        _assert_next_cell_works(s)


def test_no_new_namespaces_and_no_capabilities(pool):
    with pool.session() as s:
        r = s.run(textwrap.dedent("""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            out = []
            for flag in (0x10000000, 0x40000000, 0x00020000, 0x20000000):  # user, net, mount, pid
                out.append((libc.unshare(flag), ctypes.get_errno()))
            print(out)
            print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])
            print(open('/proc/sys/user/max_user_namespaces').read().strip())
        """))
        assert r.ok, r.render()
        lines = r.stdout.splitlines()
        assert all(rc == -1 for rc, _ in eval(lines[0])), lines[0]
        assert int(lines[1], 16) == 0
        if shutil.which("unshare"):
            r = s.run("import subprocess\nprint(subprocess.run(['unshare', '-U', 'true']).returncode)")
            assert r.ok and r.stdout.strip() != "0"
        _assert_next_cell_works(s)


def test_no_session_can_kill_another(pool):
    """A cell that signals every pid it can name, and kill(-1), reaches only its own sandbox; the
    host killing one session leaves the other's interpreter and variables alive."""
    a, b = pool.session(), pool.session()
    try:
        assert b.run("state = 'kept'").ok
        b_pids = [p.pid for p in psutil.Process(b._worker.proc.pid).children(recursive=True)] + [b._worker.proc.pid]
        r = a.run(textwrap.dedent(f"""
            import os, signal
            hit = []
            for pid in {b_pids!r}:
                try:
                    os.kill(pid, signal.SIGKILL)
                    hit.append(pid)
                except OSError:
                    pass
            print(hit)
        """))
        assert r.ok and json.loads(r.stdout) == [], r.render()  # none of b's host pids exist in a's namespace
        r = a.run("import os, signal\nos.kill(-1, signal.SIGKILL)\nimport time; time.sleep(1)")
        assert r.status in ("crashed", "error", "timeout") and r.restarted, r.render()
        assert b.run("print(state)").stdout == "kept\n"
        a.close()  # the host-side kill of a
        time.sleep(0.2)
        assert b.run("print(state)").stdout == "kept\n"
        assert all(psutil.pid_exists(p) for p in b_pids)
    finally:
        a.close()
        b.close()


def test_the_host_channel_is_out_of_reach(pool):
    """The interpreter holds neither host descriptor, and cannot open the supervisor's through /proc
    (it is non-dumpable and the sandbox has no capabilities)."""
    with pool.session() as s:
        r = s.run(textwrap.dedent("""
            import os, stat
            pipes = []
            for fd in sorted(int(f) for f in os.listdir('/proc/self/fd')):
                try:
                    if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
                        pipes.append(fd)
                except OSError:  # the descriptor listdir itself used
                    pass
            print(len(pipes))
            opened = 0
            try:
                names = os.listdir(f'/proc/{os.getppid()}/fd')
            except OSError:
                names = []
            for n in names:
                try:
                    open(f'/proc/{os.getppid()}/fd/{n}', 'wb')
                    opened += 1
                except OSError:
                    pass
            print(opened)
            try:
                open(f'/proc/{os.getppid()}/mem', 'rb')
            except OSError as e:
                print(type(e).__name__)
        """))
        assert r.ok, r.render()
        pipes, fd_list, mem = r.stdout.splitlines()
        assert int(pipes) == 2  # its own code and status pipes to the supervisor
        assert fd_list == "0" and mem == "PermissionError"
        _assert_next_cell_works(s)


FORGERIES = {
    "empty frame": "b''",
    "not json": "b'{not json'",
    "wrong fields": "json.dumps({'status': 'ok'}).encode()",
    "bad status": "json.dumps({'seq': 1, 'status': 'pwned', 'error': None, 'elapsed_s': 0}).encode()",
    "stale sequence": "json.dumps({'seq': -5, 'status': 'ok', 'error': None, 'elapsed_s': 0}).encode()",
    "oversize length": None,
}


def _forge_cell(kind: str) -> str:
    """A cell writing one bad frame on every pipe it holds (its channel to the supervisor)."""
    if kind == "oversize length":
        frame = "frame = struct.pack('>I', 1 << 30) + b'x' * 16"
    else:
        frame = f"data = {FORGERIES[kind]}\nframe = struct.pack('>I', len(data)) + data"
    return "import json, os, stat, struct\n" + frame + textwrap.dedent("""
        for fd in sorted(int(f) for f in os.listdir('/proc/self/fd')):
            try:
                if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, frame)
            except OSError:
                pass
        print('forged')
    """)


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_forged_frames_end_the_session_with_an_error_and_a_fresh_worker(pool, kind):
    with pool.session() as s:
        assert s.run("marker = 1").ok
        results = [s.run(_forge_cell(kind)), s.run("print('after')")]
        assert any(r.restarted and r.status in ("error", "crashed", "timeout") for r in results), \
            [r.render() for r in results]
        bad = next(r for r in results if r.restarted)
        assert "Sandbox" in bad.render() or "Timeout" in bad.render(), bad.render()
        _assert_next_cell_works(s)
        assert s.run("print(marker)").status == "error"  # a fresh interpreter: the old state is gone


def test_a_valid_forged_frame_cannot_shift_later_outputs(pool):
    """A cell that reads its own sequence number and forges a correct status frame only chooses
    its own output (as print could); the genuine frame that follows is caught, and no later
    cell ever gets an earlier cell's output."""
    forge = textwrap.dedent("""
        import json, os, stat, struct, sys
        f, seq = sys._getframe(), None
        while f is not None and seq is None:
            seq = (f.f_locals.get('msg') or {}).get('seq') if isinstance(f.f_locals.get('msg'), dict) else None
            f = f.f_back
        data = json.dumps({'seq': seq, 'status': 'ok', 'error': None, 'elapsed_s': 0.0}).encode()
        for fd in sorted(int(x) for x in os.listdir('/proc/self/fd')):
            try:
                if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, struct.pack('>I', len(data)) + data)
            except OSError:
                pass
        print('genuine')
    """)
    with pool.session() as s:
        outs = [s.run(forge), s.run("print('second')"), s.run("print('third')"), s.run("print('fourth')")]
        stdouts = [r.stdout for r in outs]
        assert "genuine\n" not in stdouts[1:], stdouts  # never shifted onto a later cell
        assert any(r.restarted and "SandboxProtocolError" in (r.error or "") for r in outs[:2]), [r.render() for r in outs]
        assert outs[-1].stdout == "fourth\n"


def test_mathcode_episode_survives_forged_frames_and_records_isolation(pool):
    env = MathCodeEnv(dataset="gsm8k", sandbox=pool, max_turns=4)
    env.reset(options={"index": 0})
    obs, *_ = env.step("```python\n" + _forge_cell("not json") + "```")
    assert "SandboxProtocolError" in obs and "restarted" in obs
    obs, *_ = env.step("```python\nprint(6 * 7)\n```")
    assert "42" in obs
    assert env.unwrapped.episode.meta["sandbox"]["isolation"] == pool.chosen.level
    env.close()


def test_throwaway_uids_are_never_shared():
    if os.geteuid() != 0:
        pytest.skip("throwaway uids are used only as root")
    claims = [iso.UidClaim() for _ in range(130)]
    try:
        assert len({c.uid for c in claims}) == 130
    finally:
        for c in claims:
            c.release()


def test_rlimits_only_never_runs_as_root():
    """The opt-in without isolation is refused as root, by the host and by the worker itself."""
    if os.geteuid() != 0:
        pytest.skip("an ordinary user may opt in (test_sandbox.py covers that)")
    with pytest.raises(SandboxError, match="does not run as root"):
        SandboxPool(size=0, isolation=iso.RLIMITS_ONLY)
    forced = Isolation(iso.RLIMITS_ONLY, note="forced past choose_isolation by this test")
    worker = _Worker(LIMITS, (), forced)
    with pytest.raises(SandboxError, match="does not run as root"):
        worker.wait_ready()


def test_state_of_a_killed_host_is_removed_at_the_next_start(tmp_path):
    """A host process killed with live workers (bubblewrap, and rlimits-only where an ordinary user may opt
    in), its watchdog killed first, leaves folders and cgroups; the next pool start removes them."""
    _require_bubblewrap()
    script = textwrap.dedent("""
        import json, os, sys, time
        from turngym.sandbox import isolation as iso
        from turngym.sandbox import SandboxPool
        a = SandboxPool(size=1, preload=(), isolation='auto')
        sa = a.session()
        workdir = None
        if os.geteuid() != 0:
            sb = SandboxPool(size=1, preload=(), isolation='rlimits-only').session()
            sb.run("open('left.txt', 'w').write('x')")
            workdir = sb._worker.workdir
        cg = [str(d) for d in sa._worker.cgroup.dirs] if sa._worker.cgroup else []
        print(json.dumps({"state": str(iso.host_state().dir), "workdir": workdir, "cgroups": cg,
                          "watchdog": iso.host_state()._watchdog.pid}), flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        left = json.loads(proc.stdout.readline())
        os.kill(left["watchdog"], signal.SIGKILL)  # this test is about the next start; the watchdog has its own test
        time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
    assert Path(left["state"]).exists() and (left["workdir"] is None or Path(left["workdir"]).exists())
    assert all(Path(d).exists() for d in left["cgroups"])
    removed = iso.clean_stale_state()
    assert left["state"] in removed
    assert not Path(left["state"]).exists() and (left["workdir"] is None or not Path(left["workdir"]).exists())
    assert not any(Path(d).exists() for d in left["cgroups"])
    assert str(iso.host_state().dir) not in removed  # a live host's state stays


def test_a_stalled_partial_frame_is_a_protocol_error_not_a_hang(pool):
    """A header promising more bytes than ever come is caught within about a second."""
    cell = textwrap.dedent("""
        import os, stat, struct
        for fd in sorted(int(f) for f in os.listdir('/proc/self/fd')):
            try:
                if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, struct.pack('>I', 100000) + b'{')
            except OSError:
                pass
    """)
    with pool.session() as s:
        start = time.monotonic()
        r = s.run(cell)
        assert r.restarted and "SandboxProtocolError" in r.error and "incomplete" in r.error, r.render()
        assert time.monotonic() - start < LIMITS.wall_s
        _assert_next_cell_works(s)


def test_an_oom_kill_of_the_interpreter_says_so(pool):
    if pool.chosen.level != iso.BUBBLEWRAP_CGROUP:
        pytest.skip(f"no cgroup here: {pool.chosen.note}")
    with pool.session() as s:
        # below the per-process address-space cap, above the tree's memory cap
        r = s.run("chunks = []\nfor _ in range(700):\n    chunks.append(bytearray(1 << 20))")
        assert r.status == "crashed" and "memory cap" in r.error, r.render()
        _assert_next_cell_works(s)


def test_nothing_a_cell_writes_reaches_the_interpreter_or_the_next_session(pool):
    """Planting code in the interpreter's own trees fails (read-only), and files a session leaves in
    its /tmp or working directory are not there for the next session."""
    import numpy  # any installed package: its folder is in the sandbox, read-only

    site = str(Path(numpy.__file__).parent.parent)
    with pool.session() as a:
        r = a.run(f"open({site + '/sitecustomize.py'!r}, 'w').write('print(1)')")
        assert r.status == "error" and "Read-only file system" in r.error, r.render()
        r = a.run(f"open({sys.prefix + '/pwned.pth'!r}, 'w')")
        assert r.status == "error", r.render()
        assert a.run("open('/tmp/left', 'w').write('x'); open('left', 'w').write('x')").ok
    with pool.session() as b:
        r = b.run("import os\nprint(os.path.exists('/tmp/left'), os.path.exists('left'), sorted(os.environ))")
        assert r.stdout.startswith("False False"), r.render()
        assert "PYTHONPATH" not in r.stdout and "TOKEN" not in r.stdout
    assert not os.path.exists(site + "/sitecustomize.py") and not os.path.exists(sys.prefix + "/pwned.pth")


def test_seccomp_refuses_keyrings_ptrace_and_foreign_abis(pool):
    """The host's session keyring is inherited by every child process; inside the sandbox the
    keyring syscalls (and ptrace, perf, BPF, userfaultfd, io_uring, x32) are refused."""
    import platform

    if iso.seccomp_program() is None:
        pytest.skip(f"no seccomp filter for {platform.machine()}")
    _, numbers = iso._DENIED_SYSCALLS[platform.machine()]
    assert pool.describe()["seccomp"] is True
    with pool.session() as s:
        r = s.run(textwrap.dedent(f"""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            out = {{}}
            for name, nr in {numbers!r}.items():
                out[name] = (libc.syscall(nr, 0, -3, 0, 0, 0), ctypes.get_errno())
            print(out)
            print(libc.syscall(0x40000000 + 39, 0, 0, 0), ctypes.get_errno())  # x32 getpid
        """))
        assert r.ok, r.render()
        results = eval(r.stdout.splitlines()[0])
        assert all(v == (-1, 1) for v in results.values()), results  # EPERM
        if platform.machine() == "x86_64":
            assert r.stdout.splitlines()[1] == "-1 1"
        _assert_next_cell_works(s)


def test_seccomp_program_is_valid_bpf():
    """Jump targets land inside the program and it ends in returns (checked on both machines)."""
    import struct as st

    for machine in ("x86_64", "aarch64"):
        prog = iso.seccomp_program(machine)
        ins = [st.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
        for i, (code, jt, jf, _) in enumerate(ins):
            if code in (0x15, 0x35):
                assert i + 1 + jt < len(ins) and i + 1 + jf < len(ins)
        assert ins[-1][0] == 0x06 and ins[-2][0] == 0x06
    assert iso.seccomp_program("riscv64") is None


def test_a_stopped_supervisor_cannot_hang_the_host_on_a_large_cell(pool):
    """The supervisor is stopped between cells (a cell can no longer leave anything running to do
    it, so the test does it from outside); the next cell is larger than a pipe holds. The host's
    write gives up at the time limit, kills the worker and says so."""
    with pool.session() as s:
        r = s.run("x = 0")
        assert r.ok, r.render()
        worker = psutil.Process(s._worker.proc.pid)
        for p in worker.children(recursive=True):
            p.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        r = s.run("x = 1\n" + "#" * (256 << 10) + "\nprint(x)")
        assert time.monotonic() - start < LIMITS.wall_s + 6
        assert r.status == "timeout" and r.restarted, r.render()
        _assert_next_cell_works(s)


GOLD = "data/math/gsm8k/test.jsonl"


def _venv_with_turngym_installed(parent: str) -> tuple[Path, Path]:
    """A virtualenv under ``parent`` with turngym laid out as a wheel installs it (the package,
    data files included, inside site-packages); returns (its python, the package folder there)."""
    import importlib.resources

    root = Path(__import__("tempfile").mkdtemp(prefix="turngym-venv-", dir=parent))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(root / "venv")],
                   check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    src = Path(str(importlib.resources.files("turngym")))
    shutil.copytree(src, Path(site) / "turngym", ignore=shutil.ignore_patterns("__pycache__"))
    found = _package_dir_seen_by(str(python))
    assert (found / GOLD).is_file()
    return python, found


def _package_dir_seen_by(python: str) -> Path:
    """Where ``python`` (started as the worker is, ``-I``) finds the turngym package."""
    probe = "import importlib.util; print(importlib.util.find_spec('turngym').submodule_search_locations[0])"
    return Path(subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, check=True).stdout.strip())


def _run_in_bwrap(python: Path, code: str, disk_bytes: int = 8 << 20) -> subprocess.CompletedProcess:
    cmd = iso.bwrap_command(iso.bwrap_path(), disk_bytes, None, python=str(python)) + [str(python), "-I", "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)


READ_PACKAGE = ("import os, sys\nfor p in sys.argv[1:]:\n"
                "    try:\n        print(len(open(p).read()) if p.endswith('.jsonl') else os.listdir(p))\n"
                "    except OSError as e:\n        print(type(e).__name__)\n")


def test_a_wheel_installed_turngym_is_hidden_from_cells():
    """In a non-editable install the gold answers sit in site-packages, which the sandbox shows."""
    _require_bubblewrap()
    parent = "/var/tmp" if os.path.isdir("/var/tmp") else str(Path.home())
    python, pkg = _venv_with_turngym_installed(parent)
    try:
        code = READ_PACKAGE.replace("sys.argv[1:]", repr([str(pkg / GOLD), str(pkg), str(pkg / "data")]))
        out = _run_in_bwrap(python, code)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] in ("FileNotFoundError", "PermissionError"), out.stdout
        assert lines[1] in ("[]", "FileNotFoundError", "PermissionError"), out.stdout
        assert lines[2] in ("FileNotFoundError", "PermissionError"), out.stdout
        # the rest of site-packages is still there: the interpreter starts and imports from it
        assert _run_in_bwrap(python, "import json, sysconfig; print(1)").stdout == "1\n"
    finally:
        shutil.rmtree(python.parent.parent.parent)


def test_cells_cannot_read_the_packages_gold_answers(pool):
    """The editable install here: the package folder the host imports and the one the worker's
    interpreter would find are both out of a cell's reach."""
    import importlib.resources

    host_pkg = Path(str(importlib.resources.files("turngym")))
    worker_pkg = _package_dir_seen_by(sys.executable)
    paths = [str(host_pkg / GOLD), str(host_pkg), str(worker_pkg / GOLD), str(worker_pkg)]
    with pool.session() as s:
        r = s.run(READ_PACKAGE.replace("sys.argv[1:]", repr(paths)))
        assert r.ok, r.render()
        assert all(line in ("[]", "FileNotFoundError", "PermissionError") for line in r.stdout.splitlines()), r.stdout
        _assert_next_cell_works(s)


def test_an_interpreter_under_tmp_runs_sandboxed_with_a_private_capped_tmp():
    """CI may clone (and build its venv) under /tmp: the interpreter's folders stay visible over
    the private /tmp, which stays writable, private and capped; the package is still hidden."""
    _require_bubblewrap()
    python, pkg = _venv_with_turngym_installed(tempfile.gettempdir())
    host_tmp = Path(tempfile.gettempdir())
    try:
        code = ("import os, sys\nprint(sys.executable)\nopen('/tmp/f', 'w').write('x')\n"
                f"print(os.path.exists({str(host_tmp / 'nothing-here')!r}), os.path.exists({str(pkg / GOLD)!r}))\n"
                "try:\n    open('/tmp/big', 'wb').write(b'x' * (16 << 20))\nexcept OSError as e:\n"
                "    print(type(e).__name__, e.errno)\n"
                f"print(sorted(os.listdir('/tmp')))")
        (host_tmp / "nothing-here").write_text("host")
        out = _run_in_bwrap(python, code, disk_bytes=8 << 20)
        assert out.returncode == 0, out.stderr
        top = python.parent.parent.parent.name  # only the interpreter's own folder shows through
        assert out.stdout.splitlines() == [str(python), "False False", "OSError 28", str(["big", "f", top])], out.stdout
    finally:
        (host_tmp / "nothing-here").unlink(missing_ok=True)
        shutil.rmtree(python.parent.parent.parent)


def _tree_cpu_s(pid: int) -> float:
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def test_what_a_cell_leaves_running_gets_no_cpu_between_cells(pool):
    """A thread that forks busy children after its cell returned: the cell's end stops the
    interpreter (it left a thread running), and nothing it started gets CPU afterwards."""
    if not pool.chosen.describe()["frozen_between_cells"]:
        pytest.skip(f"no cgroup freezer here: {pool.chosen.note}")
    with pool.session() as s:
        r = s.run("import os, threading, time\n"
                  "def spin():\n    time.sleep(0.3)\n"
                  "    for _ in range(2):\n        if os.fork() == 0:\n            while True: pass\n"
                  "    while True: pass\n"
                  "threading.Thread(target=spin, daemon=True).start()")
        assert r.restarted and "threads running" in r.error, r.render()
        pid = s._worker.proc.pid
        time.sleep(0.6)
        before = _tree_cpu_s(pid)
        time.sleep(1.5)
        assert _tree_cpu_s(pid) - before < 0.1
        _assert_next_cell_works(s)


def test_the_held_freeze_file_stays_on_the_host_and_is_closed_with_its_worker(pool):
    """The host keeps each worker's freeze file open (two writes a cell, not two opens): no process of the
    worker holds it (it could thaw itself), and it is closed when the worker ends."""
    if not pool.chosen.describe()["frozen_between_cells"]:
        pytest.skip(f"no cgroup freezer here: {pool.chosen.note}")
    with pool.session() as s:
        worker = s._worker
        fd = worker.cgroup._freeze_fd
        assert fd is not None and os.readlink(f"/proc/self/fd/{fd}").endswith(("freezer.state", "cgroup.freeze"))
        assert worker.cgroup.dirs[0].name in os.readlink(f"/proc/self/fd/{fd}")
        held = []
        for p in [psutil.Process(worker.proc.pid), *psutil.Process(worker.proc.pid).children(recursive=True)]:
            for name in os.listdir(f"/proc/{p.pid}/fd"):
                try:
                    held.append(os.readlink(f"/proc/{p.pid}/fd/{name}"))
                except OSError:
                    pass
        assert held and not [h for h in held if "freez" in h or "cgroup" in h], held
        assert s.run("print(2)").stdout == "2\n"
    assert worker.cgroup._freeze_fd is None
    try:  # the number may since hold another worker's file, never this one's
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        link = ""
    assert worker.cgroup.dirs[0].name not in link


@pytest.mark.parametrize("elapsed", ["float('nan')", "float('inf')", "-1.0", "None"])
def test_a_cell_cannot_choose_the_elapsed_time_it_is_recorded_with(pool, elapsed):
    """A cell forging its own status frame (with or without a time of its choosing) gets a time
    the supervisor measured, finite and within the limit, or a protocol error."""
    fields = "'seq': seq, 'status': 'ok', 'error': None" + ("" if elapsed == "None" else f", 'elapsed_s': {elapsed}")
    forge = textwrap.dedent("""
        import json, os, stat, struct, sys
        f, seq = sys._getframe(), None
        while f is not None and seq is None:
            seq = (f.f_locals.get('msg') or {}).get('seq') if isinstance(f.f_locals.get('msg'), dict) else None
            f = f.f_back
        data = json.dumps({FIELDS}).encode()
        for fd in sorted(int(x) for x in os.listdir('/proc/self/fd')):
            try:
                if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, struct.pack('>I', len(data)) + data)
            except OSError:
                pass
    """).replace("FIELDS", fields)
    with pool.session() as s:
        for r in (s.run(forge), s.run("print(1)")):
            assert isinstance(r.elapsed_s, float) and 0.0 <= r.elapsed_s <= LIMITS.wall_s + 2.0, r
        _assert_next_cell_works(s)


def test_state_records_are_removed_when_workers_end(pool):
    """The host's list of worker cgroups holds only live workers, however many have come and gone."""
    state = iso.host_state()
    for _ in range(4):
        with pool.session() as s:
            assert s.run("print(1)").ok
            r = s.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")  # a restart: another worker ends
            assert r.restarted
    pool.wait_warm()
    recorded = state.recorded_cgroups()
    assert all(d.exists() for d in recorded), [str(d) for d in recorded if not d.exists()]


def test_uid_claims_leave_no_lock_files():
    claims = [iso.UidClaim() for _ in range(5)]
    assert len({c.uid for c in claims}) == 5 and all(c.path.exists() for c in claims)
    lock_dir = claims[0].path.parent
    for c in claims:
        c.release()
    assert not any(c.path.exists() for c in claims)
    again = iso.UidClaim()  # a claim still works after a release, and releases cleanly
    again.release()
    assert not again.path.exists() and lock_dir.is_dir()


def test_unheld_uid_lock_files_are_removed_at_the_next_start():
    held = iso.UidClaim()
    left = iso.private_state_root() / "uids" / "12345"
    left.write_text("")  # what a killed host (or an older version) left
    try:
        removed = iso.clean_stale_state()
        assert str(left) in removed and not left.exists()
        assert held.path.exists() and str(held.path) not in removed
    finally:
        held.release()
