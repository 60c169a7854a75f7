"""The Ray env pool against a real cluster (``ray start --head`` on loopback, token authentication on, as Ray's
own docs set it up): what answers at a wrong address, the client port without ``ray://``, a cluster that wants a
token, SIGTERM / Ctrl-C of ``turngym eval`` in process and under Ray, and a GCS lost mid-run (the last test: it
ends the cluster). Every process the cluster started is ended by its id at the end."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("ray")

from conftest import load_benchmark  # noqa: E402
from turngym.agents.tiny import tiny_model_dir  # noqa: E402
from turngym.episode.reader import read_episodes  # noqa: E402
from turngym.run.backends.ray_address import check_address  # noqa: E402
from turngym.run.backends.ray_faults import RayPoolError  # noqa: E402

CLI = [sys.executable, "-m", "turngym.cli"]
TOKEN = "turngym-test-token-0123456789abcdef"  # noqa: S105 - a throwaway cluster's shared secret


free_port = load_benchmark("bench_setup").free_port
pids_of = load_benchmark("bench_setup").pids_of  # processes naming the cluster's own temp folder


@dataclass
class Cluster:
    gcs: int
    client: int
    temp: str
    env: dict[str, str]  # a driver's environment that joins it (the token set)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs}"


@contextlib.contextmanager
def started_cluster():
    """A real ``ray start --head`` cluster with token authentication, on its own ports and temp folder."""
    temp = tempfile.mkdtemp(prefix="rtg")  # short: Ray's socket paths must fit in 107 bytes
    gcs, client = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={gcs}",
                    f"--ray-client-server-port={client}", "--num-cpus=2", "--include-dashboard=false",
                    f"--temp-dir={temp}", "--disable-usage-stats"], env=env, check=True, capture_output=True, timeout=300)
    try:
        yield Cluster(gcs, client, temp, env)
    finally:
        for pid in pids_of(temp):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster():
    with started_cluster() as c:
        yield c


@pytest.fixture
def no_token(monkeypatch):
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", tempfile.mkdtemp())  # no ~/.ray/auth_token either


def refused(address: str) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(RayPoolError) as err:
        check_address(address)
    assert "\n" not in str(err.value)
    return str(err.value), time.monotonic() - start


EVAL = ["eval", "--env", "Calculator-v0", "--max-turns", "2", "--max-new-tokens", "6"]


def eval_args(out: Path, limit: int, *extra: str) -> list[str]:
    return CLI + EVAL + ["--limit", str(limit), "--model", str(tiny_model_dir(chat=True)), "--out", str(out), *extra]


def test_a_token_cluster_is_named_with_the_setting_that_joins_it(cluster, no_token, tmp_path):
    text, took = refused(cluster.address)
    assert "requires token authentication: set RAY_AUTH_MODE=token" in text and took < 10
    env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = os.environ["HOME"]
    proc = subprocess.run(eval_args(tmp_path / "a", 1, "--ray", cluster.address), env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "loading model" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: the Ray cluster at {cluster.address} requires token")
    joined = subprocess.run(eval_args(tmp_path / "b", 2, "--ray", cluster.address, "--env-workers", "1"),
                            env=cluster.env, capture_output=True, text=True, timeout=300)
    assert joined.returncode == 0, joined.stderr
    assert len(read_episodes(tmp_path / "b" / "episodes.jsonl", strict=True).episodes) == 2


def test_the_client_port_and_the_gcs_port_are_told_apart(cluster, no_token):
    text, took = refused(f"127.0.0.1:{cluster.client}")
    assert f"is Ray's client port, not the GCS: give ray://127.0.0.1:{cluster.client}" in text and took < 10
    text, _ = refused(f"ray://{cluster.address}")
    assert "that port is a Ray cluster's GCS, not its client server" in text
    text, _ = refused(f"ray://127.0.0.1:{cluster.client}")  # the client wants the token too
    assert "requires token authentication: set RAY_AUTH_MODE=token" in text


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_an_address_that_is_not_ray_is_refused_within_10_s():
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog) and never answers
    try:
        text, took = refused(f"127.0.0.1:{web.server_address[1]}")
        assert "is not a Ray cluster's GCS: it answered " in text and "HTTP/1.0 501" in text and took < 10, text
        text, took = refused(f"127.0.0.1:{silent.getsockname()[1]}")
        assert "is not a Ray cluster's GCS" in text and took < 10, text
    finally:
        web.shutdown()
        silent.close()


def start_and_wait(args, env, path: Path, lines: int = 1):
    """Start ``args``; return the process once ``path`` holds ``lines`` episodes (it is running)."""
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if path.is_file() and path.read_text().count("\n") >= lines:
            return proc
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the run never wrote {lines} episodes: {proc.communicate()[1][-2000:]}")


@pytest.mark.parametrize(("where", "sig", "status", "said"), [
    ("in process", signal.SIGTERM, 143, "stopped (SIGTERM)"),
    ("in process", signal.SIGINT, 130, "interrupted (Ctrl-C)"),
    ("ray", signal.SIGTERM, 143, "stopped (SIGTERM)"),
    ("ray", signal.SIGINT, 130, "interrupted (Ctrl-C)"),
])
def test_a_stopped_eval_exits_with_its_signal_status_one_line_and_a_flushed_file(cluster, tmp_path, where, sig, status,
                                                                                 said):
    out = tmp_path / "run"
    ray = ["--ray", cluster.address, "--env-workers", "1"] if where == "ray" else []
    proc = start_and_wait(eval_args(out, 60, "--concurrency", "2", *ray), cluster.env, out / "episodes.jsonl")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(said), err[-3000:]
    kept = read_episodes(out / "episodes.jsonl", strict=True).episodes  # whole lines only
    assert 1 <= len(kept) < 60 and len({e.id for e in kept}) == len(kept)


def test_a_lost_gcs_ends_the_run_with_one_line_after_flushing(cluster, tmp_path):
    """The head's GCS killed mid-run: one turngym line within 60 s (before Ray ends the driver itself), every
    finished episode on disk; a rerun in process plays only the rest."""
    out = tmp_path / "run"
    # 400 episodes (k=10): long enough on an idle machine (about 12 a second) that the GCS dies mid-run
    proc = start_and_wait(eval_args(out, 40, "--k", "10", "--concurrency", "2", "--ray", cluster.address,
                                    "--env-workers", "1"), cluster.env, out / "episodes.jsonl", lines=2)
    [gcs] = [pid for pid in pids_of(cluster.temp) if b"gcs_server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    os.kill(gcs, signal.SIGKILL)
    start = time.monotonic()
    _, err = proc.communicate(timeout=90)
    took = time.monotonic() - start
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 1 and took < 60, (took, err[-3000:])
    assert "the Ray cluster is gone: its GCS at" in last and "Episodes already written are kept in" in last, err[-3000:]
    kept = read_episodes(out / "episodes.jsonl", strict=True).episodes
    assert 2 <= len(kept) < 400
    env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_")}
    rerun = subprocess.run(eval_args(out, 40, "--k", "10"), env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    every = read_episodes(out / "episodes.jsonl", strict=True).episodes
    assert len(every) == 400 and len({e.id for e in every}) == 400


def test_a_dead_raylet_under_a_live_gcs_ends_the_run_with_one_line_after_flushing(tmp_path):
    """The node's raylet killed mid-run while its GCS lives (a node lost from a cluster that goes on): one
    turngym line within 60 s, every finished episode on disk, none twice."""
    with started_cluster() as own:
        out = tmp_path / "run"
        proc = start_and_wait(eval_args(out, 40, "--k", "10", "--concurrency", "2", "--ray", own.address,
                                        "--env-workers", "1"), own.env, out / "episodes.jsonl", lines=2)
        [raylet] = [pid for pid in pids_of(own.temp) if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                    .endswith(b"raylet")]
        os.kill(raylet, signal.SIGKILL)
        start = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - start
        gcs_alive = any(b"gcs_server" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids_of(own.temp))
    last = err.strip().splitlines()[-1]
    print(f"dead raylet: exit {proc.returncode} after {took:.1f} s: {last}")
    assert gcs_alive, "the GCS died with the raylet: this test no longer isolates a dead node"
    assert proc.returncode == 1 and took < 60, (took, err[-3000:])
    assert last.startswith("error: ") and "Episodes already written are kept in" in last, err[-3000:]
    kept = read_episodes(out / "episodes.jsonl", strict=True).episodes
    assert 2 <= len(kept) < 400 and len({e.id for e in kept}) == len(kept)
