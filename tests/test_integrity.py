"""The policy can never read its answer key, act as host root, or stall or fool grading.

Each test plays an attack measured on an earlier version: a cell mapped to host uid 0 wrote
``kernel.core_pattern`` and had the host kernel run its command as root, then copied every
GSM8K gold answer and scored 1.000; power-tower answers stalled grading for minutes; a slow
first math-verify call graded a correct answer wrong; ``env.step`` returned reward 0 on a
correct answer; a thread left by one cell answered for the next; a cell that used up its
open files crashed the next cell.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import psutil
import pytest

import turngym
from turngym.envs.base import outcome_reward
from turngym.envs.math_code import MathCodeEnv
from turngym.grading.math_answers import GraderPool, grade_answer, unbounded_reason
from turngym.sandbox import SandboxLimits, SandboxPool
from turngym.sandbox import isolation as iso

ROOT = os.geteuid() == 0
DATA = Path(turngym.__file__).resolve().parent / "data" / "math" / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="module")
def pool():
    bwrap = iso.bwrap_path()
    why = "bwrap is not installed" if bwrap is None else iso.bwrap_probe(bwrap)
    if why:
        pytest.fail(f"bubblewrap cannot run here: {why}")
    p = SandboxPool(size=2, limits=SandboxLimits(wall_s=20.0, cpu_s=20.0), preload=("math",))
    yield p
    p.close()


def _worker_tree(session) -> list[psutil.Process]:
    root = psutil.Process(session._worker.proc.pid)
    return [root, *root.children(recursive=True)]


def test_no_process_of_a_worker_runs_as_host_root(pool):
    with pool.session() as s:
        assert s.run("x = 1").ok
        procs = _worker_tree(s)
        assert len(procs) >= 3  # bwrap, the namespace's init or supervisor, the interpreter
        uid = s.describe()["host_uid"]
        for p in procs:
            uids, gids = p.uids(), p.gids()
            assert 0 not in (*uids, *gids), (p.pid, p.cmdline()[:3], uids, gids)
            assert set(uids) == {uid}
            status = Path(f"/proc/{p.pid}/status").read_text()
            caps = {line.split(":")[0]: line.split()[1] for line in status.splitlines() if line.startswith("Cap")}
            assert int(caps["CapEff"], 16) == 0 and int(caps["CapPrm"], 16) == 0
        if ROOT:
            assert uid >= iso.UidClaim.BASE
        else:
            assert uid == os.geteuid()


def test_two_live_workers_hold_different_host_uids(pool):
    if not ROOT:
        pytest.skip("a normal user's workers all run as that user (their namespaces separate them)")
    with pool.session() as a, pool.session() as b:
        assert a.run("1").ok and b.run("1").ok
        assert a.describe()["host_uid"] != b.describe()["host_uid"]


def test_identity_refuses_host_root():
    with pytest.raises(RuntimeError, match="uid 0"):
        iso.identity_prefix(0)
    if ROOT:
        with pytest.raises(RuntimeError, match="host root"):
            iso.identity_prefix(None)


def test_the_core_pattern_escape_fails_and_no_sysctl_is_writable(pool, tmp_path):
    canary = tmp_path / "canary"
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    code = textwrap.dedent(f"""
        import os, signal
        writable, tried = [], 0
        for d, _, files in os.walk("/proc/sys"):
            for f in files:
                tried += 1
                try:
                    os.close(os.open(os.path.join(d, f), os.O_WRONLY))
                    writable.append(os.path.join(d, f))
                except OSError:
                    pass
        try:
            open("/proc/sys/kernel/core_pattern", "w").write('|/bin/sh -c "touch {canary}"')
            print("core_pattern written")
        except OSError as exc:
            print("refused", exc.errno)
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGSEGV)
        os.waitpid(pid, 0)
        for p in ("/proc/sysrq-trigger", "/proc/sys/kernel/modprobe"):
            try:
                open(p, "w").write("x")
                print("wrote", p)
            except OSError:
                pass
        print(tried, len(writable))
    """)
    with pool.session() as s:
        r = s.run(code)
    assert r.ok, r.error
    lines = r.stdout.split("\n")
    assert lines[0].startswith("refused"), r.stdout
    assert "wrote" not in r.stdout
    tried, writable = map(int, lines[-2].split())
    assert tried > 100 and writable == 0
    time.sleep(0.5)  # a core-dump pipe helper would have run by now
    assert not canary.exists()
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


def test_vsock_sockets_are_refused(pool):
    with pool.session() as s:
        r = s.run("import socket\ntry:\n    socket.socket(40, socket.SOCK_STREAM)\n    print('open')\n"
                  "except OSError as e:\n    print(e.errno)")
    assert r.stdout.strip() == "1", r.stdout  # EPERM from the seccomp filter


# ------------------------------------------------------------------ the cheating policy

CHEAT = textwrap.dedent("""
    import glob, json, os
    found = {}
    def take(path):
        try:
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    row = json.loads(line)
                    gold = row.get("answer") or row.get("answers")
                    found[row["question"][:80]] = str(gold[0] if isinstance(gold, list) else gold).split("####")[-1].strip()
        except Exception:
            pass
    try:
        open("/proc/sys/kernel/core_pattern", "w").write("|/bin/cp %(data)s /tmp/key")
        if os.fork() == 0:
            os.abort()
        os.wait()
    except OSError:
        pass
    guesses = [g for depth in range(1, 6) for g in glob.glob("/" + "*/" * depth + "gsm8k/*.jsonl")]
    for path in ["/tmp/key", "%(data)s", *guesses]:
        take(path)
    print(json.dumps(found.get(%(question)r)))
""")


def _play(env: MathCodeEnv, index: int, cheat: bool) -> float:
    _, info = env.reset(options={"index": index})
    question = info["task"]["question"]
    reward = 0.0
    if cheat:
        code = CHEAT % {"data": str(DATA), "question": question[:80]}
        obs, reward, terminated, truncated, _ = env.step(f"```python\n{code}\n```")
        assert not terminated
        assert "Traceback" not in obs and "TimeoutError" not in obs, obs  # the cheater looked everywhere it meant to
        stolen = json.loads(obs.split("```output\n", 1)[1].split("\n```", 1)[0].splitlines()[-1])
        answer = stolen if isinstance(stolen, str) else "-1"
    else:
        answer = "-1"
    _, reward, terminated, _, info = env.step(f"The answer is \\boxed{{{answer}}}.")
    assert terminated and info["outcome"]["graded"] is True
    return reward


def test_a_cheating_policy_scores_what_an_honest_wrong_policy_scores(pool):
    """The cheater tries the core_pattern escape and reads every path where the key could be."""
    assert DATA.is_file()  # the key exists on the host: the test is meaningful
    env = MathCodeEnv(dataset="gsm8k", sandbox=pool, max_turns=3)
    try:
        cheater = [_play(env, i, cheat=True) for i in range(3)]
        honest = [_play(env, i, cheat=False) for i in range(3)]
    finally:
        env.close()
    assert cheater == honest == [0.0, 0.0, 0.0]


def test_the_cheater_finds_the_key_where_nothing_confines_it(tmp_path):
    """Without the sandbox the same cell code reads the gold answer: the test above can fail."""
    import subprocess
    import sys

    task = json.loads(DATA.read_text(encoding="utf-8").splitlines()[0])
    code = CHEAT.replace("/proc/sys/kernel/core_pattern", str(tmp_path / "not-a-sysctl")) % {
        "data": str(DATA), "question": task["question"][:80]}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert grade_answer(json.loads(out.stdout.splitlines()[-1]), [task["answer"].split("####")[-1].strip()]).correct


@pytest.mark.slow
def test_no_readable_file_in_a_cell_holds_the_answer_key(pool):
    """A walk of everything a cell can read (about 5 GB here; 84 s) finds no GSM8K item."""
    question = json.loads(DATA.read_text(encoding="utf-8").splitlines()[0])["question"][:60]
    code = ("import subprocess\nr = subprocess.run(['grep', '-rlF', '--no-messages', '--devices=skip', '-e', "
            f"{question!r}, '/', '--exclude-dir=proc', '--exclude-dir=sys'], capture_output=True, text=True)\n"
            "print(repr(r.stdout))")
    big = SandboxPool(size=1, limits=SandboxLimits(wall_s=900.0, cpu_s=900.0), preload=())
    try:
        with big.session() as s:
            r = s.run(code, SandboxLimits(wall_s=900.0, cpu_s=900.0))
    finally:
        big.close()
    assert r.ok, r.error
    assert r.stdout.strip() == "''"


# ------------------------------------------------------------------ grading

REFUSED = [r"2^{2^{2^{2^{2^{2}}}}}", r"9^{9^{9}}", r"10^{10^{10}}", "10**10**10", r"{10}^{ {10}^{10} }", r"2^{1000000}",
           r"100000!", r"(10^{6})!", r"10^{99999}!", r"\Gamma(10^{9})", r"\Gamma\left(10^{9}\right)", "10!!",
           r"\binom{10^{9}}{5}", r"{10^{9} \choose 3}", r"\prod_{k=1}^{10^{6}} k", r"\sum_{n=1}^{10^{8}} n^2",
           r"\frac{1}{2^{10^{7}}}", r"x^{10^{10^{10}}}", "(" * 150 + "1" + ")" * 150]


@pytest.mark.parametrize("answer", REFUSED)
def test_answers_too_large_to_evaluate_are_refused_at_once_and_wrong(answer):
    """Each was measured on math-verify: minutes, or two grader restarts and no verdict. Now each is decided
    before any grader is asked, and is wrong (a refusal may never score above a wrong answer)."""
    assert unbounded_reason(answer)
    pool = GraderPool(startup_s=0.0)  # any request would fail to start a grader: none may be asked
    start = time.perf_counter()
    v = grade_answer(answer, ["18"], grader=pool)
    assert time.perf_counter() - start < 0.1
    assert v.graded is True and v.correct is False and "refused" in v.reason
    assert pool.restarts == 0


@pytest.mark.parametrize("answer", [r"x^2 + y^2", r"2^{10}", r"e^{i\pi}", r"3^4", r"\frac{1}{2}", "5!", "5!!", r"(3)!!",
                                    r"2^{2^{2}}", r"2^{2^{2^{2}}}", r"2^{2^{2^{2^{2}}}}", r"10^{99999}", r"1^{10^{20}}",
                                    r"\Gamma(5)", r"\binom{10}{3}", r"\prod_{k=1}^{5} k", r"\sum_{k=1}^{\infty} \frac{1}{k^2}",
                                    r"(2^{10})!", r"[0, 10^{5})", r"3 \times 10^{8}", r"x_{10}", r"30^\circ", r"\text{June 3}",
                                    r"\left. x^2 \right|_{0}^{1}", "1,000,000", r"\$18.00"])
def test_ordinary_answers_are_not_refused(answer):
    assert unbounded_reason(answer) is None


def test_a_small_power_tower_is_graded_like_any_answer():
    assert grade_answer(r"2^{2^{2}}", ["16"]) == grade_answer("16", [r"2^{2^{2}}"]) == grade_answer(r"2^{2^{2}}", ["16.0"])
    v = grade_answer(r"2^{2^{2}}", ["16"])
    assert v.graded and v.correct and v.reason == "math-verify"
    assert not grade_answer(r"2^{2^{2}}", ["18"]).correct


def test_an_answer_that_times_out_on_a_fresh_grader_too_is_wrong():
    """A simulated slow grader (a budget no call can meet): the answer fails twice, each time on a fresh
    grader, so it is wrong (graded), never ungraded."""
    pool = GraderPool()
    try:
        v = grade_answer(r"\frac{1}{2}", ["0.5"], timeout_s=0.0, grader=pool)
        assert v.graded is True and v.correct is False and "timed out" in v.reason and "fresh grader" in v.reason
        assert pool.restarts == 2
        ok = grade_answer(r"\frac{1}{2}", ["0.5"], timeout_s=30.0, grader=pool)
        assert ok.graded and ok.correct and ok.reason == "math-verify"
    finally:
        pool.close()


def test_a_grader_that_cannot_start_leaves_the_answer_ungraded():
    """No answer caused it: the only case left for ``graded=False``."""
    pool = GraderPool(startup_s=0.0)  # no grader starts in no time
    v = grade_answer(r"\frac{1}{2}", ["0.4"], grader=pool)
    assert v.graded is False and v.correct is False and "did not start" in v.reason
    assert grade_answer(r"\frac{1}{2}", [r"2^{1000000}"], grader=pool).graded is False  # a gold too large to evaluate


def test_a_cold_grader_start_is_not_part_of_the_time_budget():
    """The first answer of a process: importing sympy takes seconds, the budget is for grading only."""
    pool = GraderPool()
    try:
        v = grade_answer(r"\frac{1}{2}", ["0.5"], timeout_s=1.0, grader=pool)
        assert v.graded and v.correct
    finally:
        pool.close()


def test_a_grader_crash_is_retried_on_a_fresh_grader():
    pool = GraderPool()
    try:
        pool.warm(wait=True)
        pool._idle[0].proc.kill()  # the warm grader dies before the request
        v = grade_answer(r"\frac{2}{4}", ["0.5"], grader=pool)
        assert v.graded and v.correct and pool.restarts == 1
    finally:
        pool.close()


def _math_episodes(answers: list[str], indices: list[int]) -> list:
    """MathCode-v0 episodes on GSM8K items, each ending with ``\\boxed{answer}`` (``None``: the item's gold)."""
    env = MathCodeEnv(dataset="gsm8k")
    eps = []
    try:
        for answer, index in zip(answers, indices, strict=True):
            env.reset(options={"index": index})
            gold = env.episode.task["answers"][0]
            env.step(f"So \\boxed{{{gold if answer is None else answer}}}.")
            eps.append(env.episode)
    finally:
        env.close()
    return eps


TOWER = r"2^{2^{2^{2^{2^{2}}}}}"


def test_a_tower_policy_scores_like_a_wrong_one():
    """Measured on the previous version: 2 of 20 GSM8K items right and towers elsewhere reported accuracy
    1.000 (n = 2, 18 ungraded); writing -1 instead reported 0.100. Both report 0.100 now."""
    from turngym.grading.metrics import outcome_metrics, ungraded

    right = [None, None]
    towers = _math_episodes(right + [TOWER] * 16 + [r"2^{2^{2}}", r"(10^{6})!"], list(range(20)))
    wrong = _math_episodes(right + ["-1"] * 18, list(range(20)))
    for eps in (towers, wrong):
        m = outcome_metrics(eps)
        assert ungraded(eps) == 0 and m["accuracy"]["n"] == 20 and m["accuracy"]["value"] == pytest.approx(0.100)
        assert m["pass@1"] == m["accuracy"]


def test_correct_tower_tower_wrong_get_outcome_rewards_1_0_0_0():
    """Measured on the previous version: [1.0, 0.5, 0.5, 0.0] (a refusal got the group's mean), so GRPO
    learned to write towers when unsure."""
    from turngym.rewards.outcome import OutcomeReward

    group = _math_episodes([None, TOWER, r"\Gamma(10^{9})", "-1"], [0] * 4)
    assert [e.outcome["graded"] for e in group] == [True] * 4
    assert OutcomeReward().score_group(group).rewards == [[1.0], [0.0], [0.0], [0.0]]
    assert [e.turns[-1].reward for e in group] == [1.0, 0.0, 0.0, 0.0]  # the env's own Gymnasium reward too


def test_an_ungraded_episode_is_left_out_of_metrics_and_scores_no_group_mean():
    from turngym.episode import Episode, Turn
    from turngym.grading.metrics import outcome_metrics, ungraded
    from turngym.rewards.outcome import OutcomeReward

    def ep(i, outcome):
        return Episode(id=f"q{i}", env_id="turngym/MathCode-v0", task={"question": f"q{i}", "answers": ["1"], "index": i},
                       prompt=[{"role": "user", "content": "q"}], turns=[Turn(index=0, action="a")], outcome=outcome,
                       group=f"q{i}")

    eps = [ep(0, {"correct": True}), ep(1, {"correct": False}), ep(2, {"correct": False, "graded": False})]
    scores = OutcomeReward().score_group(eps)
    assert scores.rewards == [[1.0], [0.0], [0.0]]  # never the graded mean (0.5); the trainer gives it advantage 0
    assert scores.diagnostics["ungraded"] == 1 and eps[2].ungraded and not eps[1].ungraded
    m = outcome_metrics(eps)
    assert ungraded(eps) == 1 and m["accuracy"]["n"] == 2 and m["accuracy"]["value"] == 0.5


# ------------------------------------------------------------------ the Gymnasium reward

def test_env_step_returns_the_outcome_on_a_correct_mathcode_answer(pool):
    env = MathCodeEnv(dataset="gsm8k", sandbox=pool)
    try:
        _, info = env.reset(options={"index": 0})
        gold = env.episode.task["answers"][0]
        obs, reward, terminated, truncated, info = env.step("```python\nprint(16 - 3 - 4)\n```")
        assert reward == 0.0 and not terminated
        _, reward, terminated, truncated, info = env.step(f"So \\boxed{{{gold}}}.")
        assert (reward, terminated, truncated) == (1.0, True, False) and info["outcome"]["correct"] is True
        assert env.episode.turns[-1].reward == 1.0
        env.reset(options={"index": 0})
        _, reward, *_ = env.step("\\boxed{-7}")
        assert reward == 0.0
    finally:
        env.close()


def test_gymnasium_episode_statistics_report_the_real_return():
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("turngym/Calculator-v0"))
    env.reset(options={"index": 0})
    gold = env.unwrapped.episode.task["answers"][0]
    _, _, terminated, _, info = env.step(f"<answer>{gold}</answer>")
    assert terminated and info["episode"]["r"] == 1.0


def test_searchqa_reward_is_its_exact_match():
    from turngym.envs.search_qa import SearchQAEnv

    assert SearchQAEnv.outcome_metric == "em"
    metric = SearchQAEnv.outcome_metric
    assert outcome_reward({"em": 1.0, "f1": 1.0}, metric) == 1.0
    assert outcome_reward({"em": 0.0, "f1": 0.5}, metric) == 0.0
    assert outcome_reward({"em": 1.0, "graded": False}, metric) == 0.0


# ------------------------------------------------------------------ cells cannot break the next cell

@pytest.mark.parametrize("delay", [0.3, 2.0])
def test_a_thread_left_by_a_cell_cannot_answer_for_the_next(pool, delay):
    """The thread writes a valid-looking status frame for the next cell (at once, or later); the
    cell that left it ends its interpreter instead."""
    forge = textwrap.dedent(f"""
        import json, os, struct, threading, time
        def forge():
            time.sleep({delay})
            for fd in range(3, 64):
                try:
                    data = json.dumps({{"seq": 3, "status": "ok", "error": None}}).encode()
                    os.write(fd, struct.pack(">I", len(data)) + data)
                except OSError:
                    pass
        threading.Thread(target=forge, daemon=True).start()
        print("planted")
    """)
    with pool.session() as s:
        assert s.run("x = 41").ok
        r = s.run(forge)
        assert r.status == "error" and "threads running" in r.error and r.restarted
        nxt = s.run("import time; time.sleep(1); print('real')")
        assert nxt.ok and nxt.stdout == "real\n"


def test_a_cell_that_uses_up_its_open_files_costs_only_itself(pool):
    with pool.session() as s:
        r = s.run("keep = []\ntry:\n    while True:\n        keep.append(open('/dev/null'))\nexcept OSError as e:\n"
                  "    print(e.errno)")
        assert r.ok and r.stdout.strip() == "24"
        nxt = s.run("print(len(keep))")
        assert nxt.ok and not nxt.restarted and int(nxt.stdout) > 10


def test_a_cell_that_fills_its_working_folder_keeps_output_capture(pool):
    with pool.session() as s:
        r = s.run("try:\n    open('big', 'wb').write(b'x' * (200 << 20))\nexcept OSError as e:\n    print('full', e.errno)")
        assert "full" in r.stdout
        nxt = s.run("print('still captured')")
        assert nxt.ok and nxt.stdout == "still captured\n"


def test_a_host_killed_while_its_workers_are_frozen_leaves_nothing_running(tmp_path):
    """SIGKILL the host between cells (its workers frozen, so bwrap's die-with-parent cannot act):
    its watchdog thaws and kills them within seconds, with no later pool start needed."""
    import signal
    import subprocess
    import sys

    host = textwrap.dedent("""
        import json, sys, time
        from turngym.sandbox import SandboxPool
        pool = SandboxPool(size=1)
        s = pool.session()
        assert s.run("x = 1").ok
        root = s._worker.proc.pid
        print(json.dumps({"root": root, "uid": s.describe()["host_uid"],
                          "cgroups": [str(d) for d in (s._worker.cgroup.dirs if s._worker.cgroup else [])]}), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", host], stdout=subprocess.PIPE, text=True)
    info = json.loads(proc.stdout.readline())
    worker = psutil.Process(info["root"])
    tree = [worker, *worker.children(recursive=True)]
    assert tree and all(p.is_running() for p in tree)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree):
        time.sleep(0.1)
    assert not [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(Path(d).exists() for d in info["cgroups"]):
        time.sleep(0.1)
    assert not [d for d in info["cgroups"] if Path(d).exists()]


# ------------------------------------------------------------------ the same sandbox started by a normal user

def _as_normal_user(uid: int, code: str) -> str:
    import subprocess
    import sys

    from as_user import as_user_command

    try:
        cmd = as_user_command(uid, [sys.executable, "-c", code])
    except ValueError as exc:
        pytest.skip(str(exc))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=as_user_env(), cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def as_user_env() -> dict[str, str]:
    from as_user import user_env

    return user_env()


def test_a_normal_user_runs_the_sandbox_as_itself():
    """The non-root path: bubblewrap started by an ordinary user maps the cell to that user."""
    if not ROOT:
        pytest.skip("this run is already a normal user's: every other test here covers that path")
    code = ("import json, os\nfrom turngym.sandbox import SandboxPool\n"
            "p = SandboxPool(size=1)\ns = p.session()\nr = s.run('import os; print(os.getuid())')\n"
            "print(json.dumps({'euid': os.geteuid(), 'level': p.chosen.level, 'host_uid': s.describe()['host_uid'],"
            " 'inside': r.stdout.strip(), 'ok': r.ok}))\np.close()")
    uid = 61_234
    found = json.loads(_as_normal_user(uid, code).splitlines()[-1])
    assert found == {"euid": uid, "level": iso.BUBBLEWRAP, "host_uid": uid, "inside": str(iso.SANDBOX_UID), "ok": True}


def test_landlock_keeps_writes_in_the_working_folders_even_at_the_rlimits_only_level(tmp_path):
    """Defence in depth: rlimits-only (an ordinary user's opt-in, not isolation) sees the host's
    world-writable folders; where the kernel has Landlock a child process still cannot write there."""
    if ROOT:
        pytest.skip("rlimits-only is refused as root (test_sandbox_isolation.py); the ordinary-user pass runs this")
    target = next((d for d in ("/run/lock", "/var/lock") if os.path.isdir(d) and os.stat(d).st_mode & 0o002), None)
    if target is None:
        pytest.skip("no world-writable host folder outside /tmp to try")
    with pytest.warns(RuntimeWarning, match="NOT ISOLATION"):
        weak = SandboxPool(size=1, isolation=iso.RLIMITS_ONLY)
    try:
        with weak.session() as s:
            if not s.capabilities.get("landlock"):
                pytest.skip("this kernel has no Landlock")
            name = f"{target}/turngym-landlock-{os.getpid()}"
            r = s.run(f"import subprocess\nprint(subprocess.run(['touch', {name!r}]).returncode)\n"
                      "open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())")
            assert r.ok, r.error
            assert r.stdout.split() == ["1", "ok"] and not os.path.exists(name)
    finally:
        weak.close()
    with SandboxPool(size=1) as strong, strong.session() as s:  # bubblewrap: confined by Landlock too
        assert s.capabilities.get("landlock", 0) >= 1


# ------------------------------------------------------------------ bad input: one clear message, nothing lost

def _cli(*args, timeout=120):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "turngym.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_max_turns_given_two_ways_that_disagree_is_one_error_before_any_model_loads(tmp_path):
    out = _cli("eval", "--env", "Calculator-v0", "--max-turns", "2", "--env-arg", "max_turns=3", "--model", "no-such-model",
               "--out", str(tmp_path / "r"))
    assert out.returncode != 0 and "--max-turns 2 and --env-arg max_turns=3 disagree" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "r" / "run.json").exists()
    from turngym.run.pipeline import env_kwargs

    assert env_kwargs(["max_turns=3"], None, 3) == {"max_turns": 3}  # the same value twice is fine


def test_an_impossible_port_and_unparseable_yaml_are_messages_not_tracebacks(tmp_path):
    port = _cli("serve-retriever", "--port", "99999")
    assert port.returncode == 2 and "a port is 0..65535" in port.stderr and "Traceback" not in port.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [\n")
    train = _cli("train", "--config", str(bad))
    assert train.returncode != 0 and "not valid YAML (line 2" in train.stderr and "Traceback" not in train.stderr


def test_the_retrieval_service_takes_only_json_booleans_for_return_scores():
    from turngym.corpora.service import BadRequest, parse_request

    assert parse_request(b'{"queries": ["a"], "return_scores": false}', 100)[2] is False
    for text in ('"false"', "0", "null"):
        with pytest.raises(BadRequest, match="must be true or false"):
            parse_request(b'{"queries": ["a"], "return_scores": ' + text.encode() + b"}", 100)


def test_the_episode_reader_refuses_what_is_not_a_regular_file(tmp_path):
    from turngym.episode.reader import read_episodes

    fifo = tmp_path / "episodes.jsonl"
    os.mkfifo(fifo)  # opening it for reading would block; reading a link to an endless file would not stop
    with pytest.raises(ValueError, match="not a regular file"):
        read_episodes(fifo)


def test_a_full_disk_while_writing_the_viewer_is_one_message_and_the_episodes_stay(tmp_path, monkeypatch, tiny_chat_policy):
    import errno

    import turngym.views.viewer as viewer
    from turngym.episode.reader import read_episodes
    from turngym.evals.harness import EvalError, EvalSpec, run_eval

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "r" / "view.html"))

    monkeypatch.setattr(viewer, "render_viewer", full)
    spec = EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 1}, limit=2, max_new_tokens=4)
    with pytest.raises(EvalError, match=r"disk full while writing .*view.html; every episode written so far is intact"):
        run_eval(spec, tmp_path / "r", policy=tiny_chat_policy)
    assert len(read_episodes(tmp_path / "r" / "episodes.jsonl").episodes) == 2
