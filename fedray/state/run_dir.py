"""The run directory: everything a run leaves behind, at any fsspec URL.

Layout: ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one JSON object per round),
``summary.json``, ``model.safetensors`` (the final global weights as a plain state_dict),
``server_state.safetensors`` (server optimizer and aggregator state), for stateful
clients (SCAFFOLD) ``client_state/`` (fedray.state.client_state), and with federated
evaluation ``client_eval/round_NNNNNN.arrow``, the per-client table of each eval round
(fedray.tracking.client_eval). The same metrics as TensorBoard
events (``events.out.tfevents.fedray``) are written beside them by a callback in the
process that called fedray.run (fedray.tracking.tensorboard.TensorBoardCallback).
Whole files are written to a temporary name and renamed into place, so a reader never sees a
half-written summary or weights file. Only safe formats: YAML, JSON, safetensors, Arrow.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import fsspec

from fedray.state.redact import mask
from fedray.state.storage import absolute_url, filesystem, is_local, write_atomic

if TYPE_CHECKING:  # checking a run directory's path needs no torch (fedray run's errors)
    import torch

WEIGHTS_FILE = "model.safetensors"
SERVER_STATE_FILE = "server_state.safetensors"
CLIENT_STATE_DIR = "client_state"
CLIENT_EVAL_DIR = "client_eval"
PARTICIPANTS_DIR = "participants"  # each round's invited clients (fedray.runtime.participation)
MODELS_DIR = "models"  # the models an aggregator trains beside the global one (IFCA)
# written through write_bytes: may hold a killed write's .tmp
SUBDIRS = (CLIENT_EVAL_DIR, PARTICIPANTS_DIR, MODELS_DIR)


__all__ = ["RunDir", "absolute_url", "load_tensors", "load_weights", "read_metrics"]


class RunDir:
    def __init__(self, url: str):
        self.url = url
        self.fs, self.path = filesystem(url, "output.dir")
        self._local = is_local(self.fs)  # local files: appendable, with real directories
        # the lines of metrics.jsonl: a checkpoint embeds them, and object stores, which
        # cannot append, get the whole file rewritten
        self.metrics_lines: list[str] = []

    def _p(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}"

    def create(self, config_yaml: str) -> None:
        """Make the directory and write config.yaml, with credentials masked."""
        self.fs.makedirs(self.path, exist_ok=True)
        self.write_text("config.yaml", mask(config_yaml))

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``name`` (may be in a subdirectory, e.g. client_eval/...) atomically: a
        temporary file beside it, renamed into place (fedray.state.storage.write_atomic:
        a full disk leaves no half-written file, temporary or not)."""
        folder = name.rpartition("/")[0]
        if folder:
            self.fs.makedirs(self._p(folder), exist_ok=True)
        write_atomic(self.fs, [(self._p(name), data)])

    def write_text(self, name: str, text: str) -> None:
        self.write_bytes(name, text.encode())

    def write_json(self, name: str, obj: dict) -> None:
        self.write_text(name, json.dumps(obj, indent=2) + "\n")

    def append_metrics(self, record: dict) -> None:
        line = json.dumps(record) + "\n"
        self.metrics_lines.append(line)
        if self._local:
            with self.fs.open(self._p("metrics.jsonl"), "a") as f:
                f.write(line)
        else:  # object stores cannot append: rewrite the (small) file
            self.write_text("metrics.jsonl", "".join(self.metrics_lines))

    def restore_metrics(self, lines: list[str]) -> None:
        """Resuming: metrics.jsonl becomes exactly the checkpoint's rounds (a killed run may
        have logged rounds after its checkpoint; they are run again)."""
        self.metrics_lines = list(lines)
        self.write_text("metrics.jsonl", "".join(lines))

    def remove_temporaries(self) -> None:
        """Drop the temporary files of writes a killed run left half-done."""
        folders = [self.path] + [self._p(d) for d in SUBDIRS if self.fs.isdir(self._p(d))]
        leftovers = [p for folder in folders for p in self.fs.ls(folder, detail=False)
                     if p.rsplit("/", 1)[-1].startswith(".") and p.endswith(".tmp")]
        if leftovers:
            self.fs.rm(leftovers)

    def url_of(self, name: str) -> str:
        """The fsspec URL of ``name`` inside the run directory."""
        return self.fs.unstrip_protocol(self._p(name))

    def save_tensors(self, name: str, state: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save as save_safetensors

        tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
        self.write_bytes(name, save_safetensors(tensors))

    def save_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.save_tensors(WEIGHTS_FILE, state)


def load_tensors(run_dir: str, name: str = WEIGHTS_FILE) -> dict[str, torch.Tensor]:
    """A safetensors file of a run directory (no code is executed)."""
    from safetensors.torch import load as load_safetensors

    fs, path = fsspec.core.url_to_fs(run_dir)
    with fs.open(f"{path.rstrip('/')}/{name}", "rb") as f:
        return load_safetensors(f.read())


def load_weights(run_dir: str) -> dict[str, torch.Tensor]:
    """The final weights of a run directory as a state_dict."""
    return load_tensors(run_dir, WEIGHTS_FILE)


def read_metrics(run_dir: str) -> list[dict]:
    fs, path = fsspec.core.url_to_fs(run_dir)
    with fs.open(f"{path.rstrip('/')}/metrics.jsonl", "r") as f:
        return [json.loads(line) for line in f if line.strip()]
