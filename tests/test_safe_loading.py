"""Reading state never runs code: no module of fedray loads a file through anything that can
unpickle it (issue 39, item 10: ``fedray sweep --resume`` unpickled Tune's tuner.pkl).

The sweep's own test (tests/cluster/test_sweep.py) resumes from a directory full of pickles
that would create a file if loaded; this one guards the class: a new ``Tuner.restore``, a
``torch.load`` without ``weights_only=True``, ``np.load(allow_pickle=True)`` or any other
loader of pickles anywhere in the package fails here, naming the file and line. The two
formats that are pickles by definition (FedScale's traces, the CIFAR-10/100 python archives) go
through unpicklers whose ``find_class`` resolves nothing or a fixed few numpy names; they
are the only ``pickle.Unpickler`` subclasses allowed, and each must override ``find_class``.
"""

from __future__ import annotations

import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "fedray"

# (what, pattern): each a way to load code from a file's bytes
FORBIDDEN = [
    ("Tune's restore (unpickles tuner.pkl and its experiment state)",
     re.compile(r"\bTuner\.restore\b|\bTrainable\.restore\b|\.restore_from_dir\b")),
    ("Tune's ResultGrid / ExperimentAnalysis (unpickle trials' error.pkl, experiment state)",
     re.compile(r"\bResultGrid\b|\bExperimentAnalysis\b|get_pickled_error|\.fit\(\)")),
    ("a resume of Tune's state", re.compile(r"resume\s*=\s*(True|[\"']AUTO)")),
    ("pickle.load / loads", re.compile(r"\bc?pickle\.loads?\(|\bcloudpickle\.loads?\(")),
    ("np.load with allow_pickle=True", re.compile(r"allow_pickle\s*=\s*True")),
    ("yaml's unsafe loaders", re.compile(r"\byaml\.(unsafe_)?load\(|UnsafeLoader|FullLoader")),
    ("other loaders of pickles",
     re.compile(r"read_pickle\(|\bjoblib\.load\(|\bdill\.loads?\(|\bshelve\.open\(|"
                r"\bmarshal\.loads?\(|torch\.jit\.load\(")),
]
TORCH_LOAD = re.compile(r"\btorch\.load\(")
UNPICKLERS = {"fedray/timing/fedscale.py": "_PlainUnpickler",
              "fedray/data/sources/cifar_pickle.py": "_RestrictedUnpickler"}


def _code_lines(path: pathlib.Path) -> list[tuple[int, str]]:
    """The file's lines less comments (a docstring's prose may name what it avoids)."""
    out = []
    in_doc = False
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        quotes = stripped.count('"""') + stripped.count("'''")
        if in_doc or stripped.startswith(('"""', "'''", 'r"""')):
            if quotes % 2 == 1:
                in_doc = not in_doc
            continue
        out.append((lineno, line.split("#", 1)[0]))
    return out


def test_no_module_loads_a_pickle():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for lineno, code in _code_lines(path):
            for what, pattern in FORBIDDEN:
                if pattern.search(code):
                    found.append(f"{rel}:{lineno}: {what}: {code.strip()}")
            if TORCH_LOAD.search(code) and "weights_only=True" not in code:
                found.append(f"{rel}:{lineno}: torch.load without weights_only=True")
            if "Unpickler)" in code and UNPICKLERS.get(rel) not in code:
                found.append(f"{rel}:{lineno}: an unpickler not reviewed here: {code.strip()}")
    assert not found, "\n".join(found)


def test_the_two_unpicklers_resolve_only_what_they_list():
    for rel, name in UNPICKLERS.items():
        text = (PACKAGE.parent / rel).read_text()
        body = text[text.index(f"class {name}"):]
        body = body[:body.index("\n\n\n")]
        assert "def find_class" in body and "def persistent_load" in body, rel
        assert "super().find_class" not in body, rel  # never falls back to any global
