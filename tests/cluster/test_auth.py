"""A Ray cluster with token authentication, and `fedray submit --resume`, against one local
head (tests/clusters.py starts it with a token of its own, RAY_AUTH_MODE=token).

A client that sends no token, or another cluster's, gets one line with the fix from `fedray
submit`, `status`, `logs` (with and without --follow) and `stop`, and a run joining the
cluster gets it from the probe, before Ray's 20 s of retries; docs/errors.md's section
"Against a Ray cluster" lists each message, and every row of it is run here. A job stopped
mid-run is continued by `fedray submit --resume` from its checkpoint, to the weights of an
uninterrupted run.
"""

import json
import os
import pathlib
import re
import secrets
import subprocess
import sys
import time

import pytest
import torch
import yaml
from clusters import LocalHead, client_env
from conftest import tiny_job

import fedray
from fedray.cluster import job_files
from fedray.cluster import submit as submit_mod
from fedray.cluster.job_files import JOB_FILE, OVERRIDES_FILE
from fedray.state.run_dir import load_weights, read_metrics

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
FEDRAY = [sys.executable, "-m", "fedray.cli"]
# the addresses and the shared directory docs/errors.md's rows name, replaced by the head's
DOC_JOBS, DOC_GCS, DOC_RUNS = "http://127.0.0.1:8265", "127.0.0.1:6379", "/shared/runs"
CLUSTER_ROW = re.compile(r"^\| ([a-z0-9-]+) \| (.+?) \| `(fedray [^`]*)` \| `([^`]+)` \| (\d+) \|$",
                         flags=re.M)
WRONG = secrets.token_hex(32)  # another cluster's token


def _cluster_rows() -> dict[str, tuple[str, str, int]]:
    """{id: (command, message, exit code)} of docs/errors.md's "Against a Ray cluster"."""
    text = (ROOT / "docs" / "errors.md").read_text()
    section = text.split("## Against a Ray cluster", 1)[1].split("\n## ", 1)[0]
    return {m[0]: (m[2], m[3], int(m[4])) for m in CLUSTER_ROW.findall(section)}


ROWS = _cluster_rows()


@pytest.fixture(scope="module")
def head():
    with LocalHead(num_cpus=2, dashboard=True) as h:
        yield h


def _client(home: pathlib.Path, *, mode: str | None = None, token: str | None = None,
            token_file: str | None = None, **extra: str) -> dict[str, str]:
    """A client's environment: the test's, less every token setting and RAY_ADDRESS, with a
    HOME of its own (so ~/.ray/auth_token is the test's), then ``mode`` (RAY_AUTH_MODE),
    ``token`` (RAY_AUTH_TOKEN) and ``token_file`` (written to ~/.ray/auth_token)."""
    env = client_env()  # without RAY_ADDRESS
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)
    env.update(extra)
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    if mode is not None:
        env["RAY_AUTH_MODE"] = mode
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    if token_file is not None:
        (home / ".ray").mkdir(exist_ok=True)
        (home / ".ray" / "auth_token").write_text(token_file)
    return env


def _fedray(args: list[str], env: dict[str, str], cwd=None, timeout: float = 400):
    return subprocess.run(FEDRAY + args, env=env, cwd=cwd or ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _one_line(out: subprocess.CompletedProcess, message: str, *secret: str) -> None:
    """The command failed with exactly ``message`` as the last and only error line: no
    traceback, no Ray retry log, no token."""
    printed = out.stdout + out.stderr
    assert out.returncode == 2, (out.returncode, printed[-3000:])
    assert out.stderr.splitlines()[-1] == message, out.stderr[-3000:]
    assert out.stderr.count("fedray: error:") == 1, out.stderr[-3000:]
    assert "Traceback" not in printed and "Failed to get cluster ID" not in printed, printed
    assert not [s for s in secret if s and s in printed]


NO_TOKEN = ("fedray: error: the Ray cluster at {url} requires token authentication and this "
            "machine sent no token; export RAY_AUTH_MODE=token and put the cluster's token (ray "
            "get-auth-token prints it on the head) in ~/.ray/auth_token or RAY_AUTH_TOKEN "
            "(docs/cluster.md)")
WRONG_TOKEN = ("fedray: error: the Ray cluster at {url} refused this machine's token (from "
               "RAY_AUTH_TOKEN): it is not the cluster's; set RAY_AUTH_TOKEN to the cluster's "
               "token (ray get-auth-token prints it on the head; docs/cluster.md)")


@pytest.mark.parametrize("verb", [["submit", "jobs/quickstart.yaml",
                                   "output.dir=/shared/runs/x"],
                                  ["status", "raysubmit_0"], ["logs", "raysubmit_0"],
                                  ["logs", "raysubmit_0", "--follow"], ["stop", "raysubmit_0"]],
                         ids=["submit", "status", "logs", "logs-follow", "stop"])
@pytest.mark.parametrize("case", ["no-token", "wrong-token"])
def test_every_job_command_says_a_refused_token_in_one_line(head, tmp_path, verb, case):
    env = (_client(tmp_path / "home") if case == "no-token" else
           _client(tmp_path / "home", mode="token", token=WRONG))
    out = _fedray([*verb, "--address", head.job_server], env)
    message = NO_TOKEN if case == "no-token" else WRONG_TOKEN
    _one_line(out, message.format(url=head.job_server), head.env["RAY_AUTH_TOKEN"], WRONG)


def _row_env(rid: str, head: LocalHead, home: pathlib.Path) -> dict[str, str]:
    """The client's side of a row's precondition (docs/errors.md names it in words)."""
    right = head.env["RAY_AUTH_TOKEN"]
    return {
        "token-not-sent": lambda: _client(home),
        "token-in-file-not-sent": lambda: _client(home, token_file=right),
        "token-wrong": lambda: _client(home, mode="token", token=WRONG),
        "token-wrong-file": lambda: _client(home, mode="token", token_file=WRONG),
        "token-path-missing": lambda: _client(home, mode="token",
                                              RAY_AUTH_TOKEN_PATH=f"{DOC_RUNS}/token"),
        "token-none-here": lambda: _client(home, mode="token"),
        "run-token-not-sent": lambda: _client(home),
        "run-token-wrong-env": lambda: _client(home, mode="token", token_file=WRONG,
                                               RAY_ADDRESS=DOC_GCS),
    }.get(rid, lambda: _client(home, mode="token", token=right))()


def _resume_dirs(runs: pathlib.Path) -> None:
    """The run directories the --resume rows name: ``notarun`` (empty), ``fresh`` (a run's
    config.yaml, no checkpoint yet) and ``masked`` (a checkpointed run whose config.yaml
    holds a masked credential, as fedray writes one)."""
    from fedray.config import load_config, to_yaml
    from fedray.state.checkpoint import CHECKPOINT_FILE, Checkpoint, encode
    from fedray.state.redact import mask

    for name in ("notarun", "fresh", "masked"):
        (runs / name).mkdir(parents=True)
    job = ROOT / "jobs" / "quickstart.yaml"
    (runs / "fresh" / "config.yaml").write_text(to_yaml(load_config(job, [
        f"output.dir={runs / 'fresh'}"])))
    masked = load_config(job, ["output.dir=s3://KEYID:SECRET@bucket/runs/masked"])
    (runs / "masked" / "config.yaml").write_text(mask(to_yaml(masked)))  # as a run writes it
    (runs / "masked" / CHECKPOINT_FILE).write_bytes(encode(Checkpoint(
        round=2, weights=torch.zeros(1), server_state={}, client_versions=None,
        metrics_lines=['{"round": 1}\n', '{"round": 2}\n'])))


@pytest.mark.parametrize("rid", sorted(ROWS))
def test_each_documented_cluster_error(head, tmp_path, rid):
    """docs/errors.md's section "Against a Ray cluster", row by row: the command, with the
    head's addresses for the documented ones, ends with the documented line."""
    command, message, code = ROWS[rid]
    runs = tmp_path / "runs"
    _resume_dirs(runs)
    jobs_url, gcs = head.job_server, head.address

    def here(text: str) -> str:
        return text.replace(DOC_JOBS, jobs_url).replace(DOC_GCS, gcs).replace(
            DOC_RUNS, str(runs))

    env = {k: here(v) for k, v in _row_env(rid, head, tmp_path / "home").items()}
    args = here(command).split()[1:]
    started = time.monotonic()
    out = _fedray(args, env)
    assert out.returncode == code
    _one_line(out, here(message), head.env["RAY_AUTH_TOKEN"], WRONG)
    # the probe answers before Ray's own 20 s of retries would have ended
    assert time.monotonic() - started < 60


def test_the_rows_cover_every_case():
    assert {"token-not-sent", "token-in-file-not-sent", "token-wrong", "token-wrong-file",
            "token-path-missing", "token-none-here", "run-token-not-sent",
            "run-token-wrong-env", "submit-resume-not-a-run", "submit-resume-no-checkpoint",
            "submit-resume-masked"} <= set(ROWS)


SLOW_CALLBACK = '''"""Rounds a second longer: a test stops the job between two."""
import time

from fedray.tracking.callbacks import Callback


class Slow(Callback):
    def on_round_end(self, round, metrics, weights):
        time.sleep(1.0)
'''


def _wait_for(what: str, ready, timeout_s: float = 300.0, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = ready()
        if got:
            return got
        time.sleep(poll_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f}s")


def test_a_stopped_job_is_resumed_on_the_cluster_to_the_uninterrupted_weights(head, tmp_path):
    """`fedray stop` ends the job after its checkpoint of round 4 or later; `fedray submit
    --resume` continues the run from it on the cluster (shipping the run's callback module
    again, named by a relative .py path in its config.yaml) and ends with the weights an
    uninterrupted run of the same config gives (inline, in this process: bit for bit Ray's
    at the same worker count)."""
    rounds = 12
    job = tiny_job(tmp_path, rounds=rounds, runtime__num_workers=1,
                   runtime__worker__num_cpus=1, checkpoint__every=2,
                   output__callbacks=["slow.py:Slow"])
    job["output"].pop("dir")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "slow.py").write_text(SLOW_CALLBACK)
    run = tmp_path / "on-cluster"
    url = f"file://{run}"
    env = _client(tmp_path / "home", mode="token", token=head.env["RAY_AUTH_TOKEN"])
    sub = _fedray(["submit", "job.yaml", f"output.dir={url}", "--address", head.job_server],
                  env, cwd=tmp_path)
    assert sub.returncode == 0, sub.stdout[-3000:] + sub.stderr[-3000:]
    job_id = sub.stdout.split()[1]
    # the hint is copyable as printed: it names the job server given
    assert (f"follow it with: fedray logs {job_id} --follow --address {head.job_server}\n"
            in sub.stdout)

    def checkpointed() -> bool:
        if not (run / "checkpoint.safetensors").exists():
            return False
        done = read_metrics(url) if (run / "metrics.jsonl").exists() else []
        return len(done) >= 5  # the checkpoint of round 4 is written, and round 5 ran
    _wait_for("a checkpoint after round 4", checkpointed)
    stop = _fedray(["stop", job_id, "--address", head.job_server], env)
    assert stop.returncode == 0 and f"{job_id}: stop requested" in stop.stdout, stop.stderr
    _wait_for("the job stopped", lambda: "STOPPED" in _fedray(
        ["status", job_id, "--address", head.job_server], env).stdout, timeout_s=120, poll_s=2)
    cut = len(read_metrics(url))
    assert cut < rounds and not (run / "summary.json").exists()

    res = _fedray(["submit", "--resume", url, "--address", head.job_server, "--wait"], env,
                  cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    resumed_id = res.stdout.split()[1]
    assert re.search(rf"submitted {resumed_id} to {re.escape(head.job_server)}: it continues "
                     rf"{re.escape(url)} from its checkpoint after round \d+; follow it with: "
                     rf"fedray logs {resumed_id} --follow --address "
                     rf"{re.escape(head.job_server)}\n", res.stdout), res.stdout[-3000:]
    assert f"job {resumed_id}: SUCCEEDED" in res.stdout and f"done: {rounds} rounds" in res.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] == rounds and 4 <= summary["resumed_from_round"] <= cut
    assert [m["round"] for m in read_metrics(url)] == list(range(1, rounds + 1))

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["output"].update(dir=str(tmp_path / "fresh"), callbacks=[])
    cfg["runtime"]["backend"] = "inline"
    fresh = fedray.run(cfg)
    got = load_weights(url)
    assert got.keys() == fresh.weights.keys()
    assert all(torch.equal(got[k], fresh.weights[k]) for k in got)


def test_a_resumed_job_carries_the_run_directory_out_of_sight(tmp_path, monkeypatch):
    """What `submit --resume` shows the cluster (the entrypoint, the metadata) holds no
    credential of the run directory's URL or of an override: they travel in files of the
    job's working directory, which the resumed job's entrypoint reads back."""
    from fedray.config import load_config, to_yaml
    from fedray.state.checkpoint import CHECKPOINT_FILE, Checkpoint, encode

    url = "s3://KEYID:SECRET@bucket/runs/a"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(load_config(ROOT / "jobs" / "quickstart.yaml",
                                                         [f"output.dir={run}"])))
    (run / CHECKPOINT_FILE).write_bytes(encode(Checkpoint(
        round=3, weights=torch.zeros(1), server_state={}, client_versions=None,
        metrics_lines=['{"round": 1}\n'] * 3)))
    seen: dict = {}

    class Server:
        def submit_job(self, **kwargs):
            staging = kwargs["runtime_env"]["working_dir"]
            seen.update(kwargs, files={n: (pathlib.Path(staging) / n).read_text()
                                       for n in os.listdir(staging)})
            return "raysubmit_9"

    # the run is read from a local copy here; the URL is what the cluster is told
    monkeypatch.setattr(submit_mod, "client", lambda address: Server())
    for name in ("saved_config", "read_checkpoint_header"):  # what submit_resume reads with
        original = getattr(submit_mod, name)
        monkeypatch.setattr(submit_mod, name, lambda u, f=original: f(str(run)))
    resumed = submit_mod.submit_resume(url, None, ["rounds=30", "output.tensorboard=false"],
                                       ["rounds"], "http://head:8265")
    assert (resumed.job_id, resumed.round) == ("raysubmit_9", 3)
    shown = json.dumps({k: seen[k] for k in ("entrypoint", "runtime_env", "metadata")})
    assert "SECRET" not in shown
    assert seen["entrypoint"] == "python -m fedray.cluster.entrypoint"
    assert JOB_FILE not in seen["files"]  # the run's own config.yaml is resumed
    assert json.loads(seen["files"][OVERRIDES_FILE]) == ["rounds=30", "output.tensorboard=false"]
    work = tmp_path / "work"
    work.mkdir()
    for name, text in seen["files"].items():
        (work / name).write_text(text)
    monkeypatch.chdir(work)
    assert job_files.resume_argv() == ["run", "--resume", url, "rounds=30",
                                        "output.tensorboard=false", "--allow-change", "rounds",
                                        "--quiet"]


@pytest.mark.parametrize("address,hint", [
    ("http://127.0.0.1:8265", " --address http://127.0.0.1:8265\n"),
    ("127.0.0.1:8265", " --address 127.0.0.1:8265\n"),  # as typed: it works as typed
    (None, "\n"),  # RAY_ADDRESS or the default: the next command finds it again
    ("http://alice:hunter2@head:8265", " --address ADDRESS, ADDRESS being the --address "
     "given here (not printed: it holds a credential)\n"),
])
def test_the_follow_hint_repeats_the_address_given(address, hint, monkeypatch, capsys):
    from fedray import cli

    class Server:
        def submit_job(self, **kwargs):
            return "raysubmit_1"

    monkeypatch.setattr(submit_mod, "client", lambda address: Server())
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    argv = ["submit", str(ROOT / "jobs" / "quickstart.yaml"), "output.dir=/shared/runs/x"]
    assert cli.main(argv + (["--address", address] if address else [])) == 0
    out = capsys.readouterr().out
    assert out.endswith(f"follow it with: fedray logs raysubmit_1 --follow{hint}"), out
    assert "hunter2" not in out
