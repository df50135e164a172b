"""The ``fedray`` command as a user runs it: exit codes, one-line errors, files written."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from conftest import tiny_job

FEDRAY = [sys.executable, "-m", "fedray.cli"]


def _run(args, **kw):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(FEDRAY + args, capture_output=True, text=True, env=env, timeout=300,
                          **kw)


def test_help():
    out = _run(["--help"])
    assert out.returncode == 0 and "run" in out.stdout
    out = _run(["run", "--help"])
    assert out.returncode == 0 and "key=value" in out.stdout and "--quiet" in out.stdout



def test_a_reader_that_goes_away_ends_the_command_quietly():
    """``fedray jobs | head -1``: the reader closes the pipe before fedray has written all
    it prints. The command ends as one killed by SIGPIPE does (exit 141), with nothing on
    stderr: before, a BrokenPipeError traceback. The pipe's read end is closed before the
    command starts, so every write fails, whatever the timing."""
    read, write = os.pipe()
    os.close(read)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    try:
        out = subprocess.run(FEDRAY + ["jobs"], stdout=write, stderr=subprocess.PIPE,
                             text=True, env=env, timeout=120)
    finally:
        os.close(write)
    assert out.returncode == 141 and out.stderr == ""

def test_config_error_is_one_line_and_writes_nothing(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tiny_job(tmp_path)))
    for override, key in [("client.lrr=0.1", "client.lrr"), ("client.lr=-1", "client.lr"),
                          ("sampling.clients_per_round=41", "sampling.clients_per_round")]:
        out = _run(["run", str(job), override])
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fedray: error: ") and key in lines[0]
        assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()
    out = _run(["run", str(tmp_path / "missing.yaml")])
    assert out.returncode == 2 and "job file not found" in out.stderr


def test_config_and_store_errors_come_before_torch_is_imported(tmp_path):
    """A typo fails in a fraction of a second: the checks before a run starts (config keys,
    the store's manifest) and the error path do not import torch (1-2 s)."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tiny_job(tmp_path)))
    code = ("import sys; from fedray.cli import main; rc = main(sys.argv[1:]); "
            "print('torch' in sys.modules); sys.exit(rc)")
    for args in (["run", str(job), "client.lr=-1"],
                 ["run", str(job), f"data.partition={tmp_path / 'nostore'}"]):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2 and "fedray: error: " in out.stderr, out.stderr
        assert out.stdout.strip() == "False", args


def test_run_job_end_to_end(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tiny_job(tmp_path, runtime={"num_cpus": 2})))
    out = _run(["run", str(job), "rounds=2", "--quiet"])
    assert out.returncode == 0, out.stderr
    assert "done: 2 rounds, test accuracy" in out.stdout
    assert "round" not in out.stderr  # --quiet: no progress
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["num_workers"] == 2
    out = _run(["run", str(job), "rounds=2"])  # same output.dir again: refused, kept intact
    assert out.returncode == 2 and "already holds files" in out.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary


def test_options_and_overrides_in_any_order(tmp_path):
    """argparse ends a verb's key=value list at its first option; fedray takes the words
    after it too, for every verb with overrides (run here; partition in test_recipe.py)."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tiny_job(tmp_path)))
    out = _run(["run", str(job), "--quiet", "rounds=1", "client.lr=-1"])
    assert out.returncode == 2, out.stderr  # both overrides were read: the second is refused
    assert out.stderr.strip() == ("fedray: error: config key 'client.lr': must be >= 0 (0 only "
                                  "for a client part that allows it, e.g. local_update), got -1.0")
    out = _run(["run", "--quiet", str(job), "rounds=1", "--debug", "sampling.clients_per_round=0"])
    assert out.returncode != 0 and "sampling.clients_per_round" in out.stderr
    out = _run(["run", str(job), "--quiet", "--quite"])
    assert out.returncode == 2 and out.stderr.splitlines()[-1] == (
        "fedray: error: unrecognized arguments: --quite")


def _tree(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children(recursive=True)


def _gone(procs, within_s: float) -> list:
    """The processes of ``procs`` still running after ``within_s`` seconds."""
    import time

    import psutil

    deadline = time.monotonic() + within_s
    while True:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _start_long_run(tmp_path, name: str, **runtime):
    """A CLI run printing a progress line every round, in its own session (as a shell runs
    a job), and its stderr file; returns once the first round is done."""
    return _first_round(*_launch_long_run(tmp_path, name, **runtime))


def _launch_long_run(tmp_path, name: str, backend: str = "ray", **runtime):
    """On Ray from its first round by default (what must end with the CLI is Ray's
    processes); ``backend="auto"`` with a large ``auto_inline_s`` stays in the CLI's."""
    job = tmp_path / f"{name}.yaml"
    # one worker: a Ray of its own, its driver and a worker are what must end with the CLI;
    # a second worker would only be one more process to start
    job.write_text(yaml.safe_dump(tiny_job(tmp_path, name=name, rounds=500,
                                           eval={"every": 1}, runtime__num_workers=1,
                                           runtime__backend=backend,
                                           **{f"runtime__{k}": v for k, v in runtime.items()},
                                           output={"dir": str(tmp_path / name)})))
    err = open(tmp_path / f"{name}.err", "w+")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(FEDRAY + ["run", str(job)], stdout=err, stderr=err, env=env,
                            start_new_session=True)
    return proc, tmp_path / f"{name}.err"


def _first_round(proc, err):
    """Wait until a launched run has finished its first round."""
    import time

    deadline = time.monotonic() + 120
    while "round " not in err.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
        time.sleep(0.2)
    return proc, err


def _stop(proc, err, signals: list, code: int, line: str | re.Pattern | None,
          on_ray: bool = True) -> None:
    """Send ``signals`` to a run started by _start_long_run (a second one 0.3 s after the
    first, as a user pressing Ctrl-C twice); check how it ended, and that every Ray process
    it had started (``on_ray``; else none) is gone within 10 s."""
    import signal
    import time

    ray_procs = _tree(proc.pid)
    assert any(p.name().startswith("ray::") for p in ray_procs) == on_ray
    for i, sig in enumerate(signals):
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C at a terminal: the whole process group
        else:
            os.kill(proc.pid, sig)
        if i + 1 < len(signals):
            time.sleep(0.3)
    assert proc.wait(timeout=60) == code, err.read_text()
    text = err.read_text()
    assert "SIGTERM received" not in text and "Traceback" not in text, text
    if isinstance(line, re.Pattern):
        assert line.fullmatch(text.splitlines()[-1]), text
    elif line is not None:
        assert text.splitlines()[-1] == line, text
    assert _gone(ray_procs, 10) == []


def test_interrupts_and_kill_leave_no_process(tmp_path):
    """A second Ctrl-C while the first is being handled exits 130 at once, with one line.
    kill -9 of the CLI leaves no Ray process behind for long: the reaper ends them. Checked
    by reverting each: the double Ctrl-C exited 1, and after kill -9 Ray's dashboard and
    runtime-env agents outlived the CLI by 30-50 s. (SIGTERM: test_two_runs_on_one_...)"""
    import signal

    # both runs start together (each its own private Ray), so their start-ups overlap
    runs = {name: _launch_long_run(tmp_path, name) for name in ("int2", "kill")}
    try:
        _stop(*_first_round(*runs["int2"]), [signal.SIGINT] * 2, 130, "fedray: interrupted")
        _stop(*_first_round(*runs["kill"]), [signal.SIGKILL], -9, None)
    finally:
        for proc, _ in runs.values():
            if proc.poll() is None:
                proc.kill()


def test_output_redirected_to_a_file_has_no_escape_codes(ray_cluster, tmp_path):
    """Lines Ray relays from actors keep their (ClientWorker pid=...) prefix but lose its
    colour codes when the output is not a terminal (reverting the fix: ESC[36m in the file).
    The script joins the session's Ray (a driver of its own, which relays its actors' lines
    as a driver that started Ray does) rather than starting one."""
    gcs = ray_cluster.get_runtime_context().gcs_address
    script = tmp_path / "noisy.py"
    script.write_text(
        "import numpy as np\n"
        "import fedray\n"
        "from torch import nn\n"
        "class Noisy(nn.Linear):\n"
        "    def forward(self, x):\n"
        "        print('forward', flush=True)\n"
        "        return super().forward(x)\n"
        "clients = {c: (np.ones((4, 3), np.float32), np.arange(4) % 2) for c in range(2)}\n"
        f"fedray.run({{'rounds': 1, 'sampling': {{'clients_per_round': 2}},\n"
        f"            'runtime': {{'address': '{gcs}', 'num_workers': 1}},\n"
        f"            'output': {{'dir': '{tmp_path}/run'}}}},\n"
        "           model_fn=lambda: Noisy(3, 2), client_data=clients)\n")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_COLOR_PREFIX", None)
    with open(tmp_path / "out.txt", "w") as f:
        done = subprocess.run([sys.executable, str(script)], stdout=f, stderr=subprocess.STDOUT,
                              env=env, timeout=300, cwd=tmp_path)
    text = (tmp_path / "out.txt").read_text()
    assert done.returncode == 0, text
    assert "pid=" in text and "forward" in text, text
    assert "\x1b[" not in text


def test_two_runs_on_one_output_dir_and_sigterm(tmp_path):
    """The second of two runs given one output.dir is refused while the first runs (before,
    both exited 0 and the directory mixed their files). SIGTERM then stops the first like
    Ctrl-C: one line, exit 143, its rounds kept and its lock released; before, Ray's own
    handler printed a C++ stack dump and aborted (status -6)."""
    import signal

    proc, err = _start_long_run(tmp_path, "first")
    try:
        job = tmp_path / "second.yaml"
        job.write_text(yaml.safe_dump(tiny_job(tmp_path, output={"dir": str(tmp_path / "first")},
                                               rounds=2)))
        out = _run(["run", str(job), "--quiet"])
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith(f"fedray: error: config key 'output.dir': "
                                     f"{tmp_path / 'first'} is in use by another run (pid "
                                     f"{proc.pid} on "), out.stderr
        assert yaml.safe_load((tmp_path / "first" / "config.yaml").read_text())["rounds"] == 500
        # what it keeps and how to continue, in the one line
        _stop(proc, err, [signal.SIGTERM], 143, re.compile(
            r"fedray: terminated; (its checkpoint after round \d+ is intact|it has no "
            r"checkpoint yet \(a resume starts from round 1\)); continue with: "
            f"fedray run --resume {re.escape(str(tmp_path / 'first'))}"))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "first" / "metrics.jsonl").read_text().count("\n") >= 1
    assert not (tmp_path / "first" / ".fedray.lock").exists()


def test_a_run_still_in_the_cli_process_stops_as_one_on_ray(tmp_path):
    """runtime.backend auto before any hand-over (a large auto_inline_s): the rounds run in
    the CLI's own process, which SIGTERM stops with the same line and exit status, its
    rounds kept, its lock released, no process of its own left."""
    import signal

    proc, err = _start_long_run(tmp_path, "here", backend="auto", auto_inline_s=1e9)
    try:
        _stop(proc, err, [signal.SIGTERM], 143, re.compile(
            r"fedray: terminated; (its checkpoint after round \d+ is intact|it has no "
            r"checkpoint yet \(a resume starts from round 1\)); continue with: "
            f"fedray run --resume {re.escape(str(tmp_path / 'here'))}"), on_ray=False)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "here" / "metrics.jsonl").read_text().count("\n") >= 1
    assert not (tmp_path / "here" / ".fedray.lock").exists()


def test_the_continue_hint_of_a_submitted_job_is_fedray_submit(monkeypatch):
    """A run cut short says how to continue it: in a job fedray submit sent (its log is read
    on the user's machine) that is `fedray submit --resume`, else `fedray run --resume`."""
    from fedray.api import resume_command
    from fedray.cluster.job_files import SUBMITTED_ENV

    monkeypatch.delenv(SUBMITTED_ENV, raising=False)
    assert resume_command("s3://b/runs/a") == "fedray run --resume s3://b/runs/a"
    monkeypatch.setenv(SUBMITTED_ENV, "1")
    assert resume_command("s3://b/runs/a") == "fedray submit --resume s3://b/runs/a"


_EXITS = """
import atexit, sys, threading, time
from fedray.cli import entry
atexit.register(lambda: print("atexit handler ran", flush=True))
def late():  # ends only once the main thread has: the exit must wait for it
    while threading.main_thread().is_alive():
        time.sleep(0.01)
    print("thread ended", flush=True)
threading.Thread(target=late).start()
sys.argv = ["fedray", *sys.argv[1:]]
print("started", end=" ")  # left in the buffer: the exit flushes it
entry()
"""


@pytest.mark.parametrize("args,status", [(["jobs"], 0), (["run", "no/such/job.yaml"], 2)])
def test_the_command_exits_as_the_interpreter_would(args, status):
    """fedray's console script exits without the interpreter's teardown (start-up time),
    but as the interpreter would: other threads waited for, atexit handlers run, buffered
    output written, the command's status."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    out = subprocess.run([sys.executable, "-c", _EXITS, *args], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == status, out.stderr
    assert out.stdout.startswith("started ")
    assert out.stdout.rstrip().endswith("thread ended\natexit handler ran")
