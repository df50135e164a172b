"""Mutation testing of fedray's core math: are the tests able to fail?

    make mutation                                    # every module below
    .venv/bin/python tools/mutation.py fedray/core/seeding.py   # one module
    .venv/bin/python tools/mutation.py --list fedray/core/seeding.py  # its mutants only

For each module of ``TARGETS`` it makes small deliberate bugs ("mutants"), one at a time,
and runs that module's fast, Ray-free tests against each. A mutant the tests fail on is
*killed*; one they pass on *survived*: either the tests cannot see that change (a weak
test: strengthen it), or the change does not change behaviour (an *equivalent* mutant:
``EQUIVALENT`` below lists each, with the reason). The score of a module is killed /
(mutants - equivalent). docs/testing.md has the scores and what they led to.

Why a runner of our own and not mutmut or cosmic-ray: the bugs the project cares about
include module constants (colliding stream tags in fedray.core.seeding) and documented
defaults (dataclass fields, keyword defaults), which mutmut 3 does not mutate (it only
mutates inside functions, through a trampoline in a copy of the tree under mutants/), and
both tools run a test command per mutant from scratch, which here means seconds of torch
import per mutant. This runner imports the heavy libraries once and forks per mutant; the
mutated module is served by an import hook in the child, so the working tree is never
written (other people and tests may be using it at the same time).

The mutations (Python's ``ast``, one site at a time): arithmetic operators swapped
(``+ -``, ``* /``, ``// /``, ``%``, ``**``, shifts, bit operators), a term dropped from a sum
or a factor from a product, comparisons moved across their boundary (``< <=``, ``== !=``,
``is``, ``in``), ``and``/``or`` swapped, a ``not`` or a unary minus removed, an ``if``/
``while``/conditional expression negated, a number changed (an int by +1, a float doubled,
0.0 to 1.0), a bool flipped, a returned value replaced by None, the first two positional
arguments of a call swapped, and a call made for its effect (``x.add_(...)``) deleted.
Docstrings, type annotations, ``raise`` statements (their messages) and f-strings are not
mutated, nor a line that ends with ``# pragma: no mutate``.

Not part of the test suite (tools/ is outside pytest's testpaths, and CI runs ``make
test``): a full run takes tens of minutes. It runs one mutant at a time, niced.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.abc
import importlib.util
import json
import os
import random
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# module -> the pytest arguments of its fast tests (no Ray, no whole runs): the tests that
# are *about* that module, so a survivor points at a weakness of them
TARGETS: dict[str, list[str]] = {
    "fedray/core/seeding.py": ["tests/core/test_seeding.py"],
    "fedray/core/sampling.py": ["tests/core/test_sampling.py"],
    "fedray/algorithms/privacy.py": [
        "tests/algorithms/test_privacy.py", "-k",
        "not resume and not run_reports and not local_noise_is and not sequential_and "
        "and not refuses_parts and not ray_workers"],
    "fedray/timing/clock.py": ["tests/timing/test_clock.py"],
    "fedray/data/partitioners/dirichlet.py": ["tests/data/test_dirichlet_lognormal.py",
                                              "tests/data/test_partitioners.py", "-k",
                                              "dirichlet"],
    "fedray/algorithms/server_opt.py": ["tests/algorithms/test_server_optimizer.py"],
    "fedray/algorithms/reduction.py": ["tests/algorithms/test_reduction.py"],
    "fedray/algorithms/scaffold.py": ["tests/algorithms/test_algorithms_numeric.py", "-k",
                                      "scaffold and not one_vs_three and not global_optimum"],
    "fedray/kernels/sequential.py": ["tests/kernels/test_sequential.py"],
}

# the reason shared by every non_blocking mutant of a host-side copy
_NON_BLOCKING = (
    "non_blocking, as in scaffold.py: the tensor's next use is ordered after the copy")

# (module, line, description) -> why the mutant cannot change behaviour; where one line has
# two mutants of one description, a fourth item says which (0: the first in --list order)
EQUIVALENT: dict[tuple, str] = {
    ("fedray/kernels/sequential.py", 58, "1 -> 2", 1):
        "max(2, n) for max(1, n) (full_batch's batch size) differs only at n = 1, where the "
        "slice [0:2] of a one-example permutation is still that one example",
    ("fedray/core/seeding.py", 37, "2 -> 3"):
        "SeedSequence.generate_state(3)'s first two words are generate_state(2)'s: only "
        "those two are read",
    ("fedray/core/sampling.py", 112, ">= -> >"):
        "random() is a multiple of 2^-53 in [0, 1): it equals the dropout rate with "
        "probability 2^-53 at most, so >= and > keep the same clients (in every test)",
    ("fedray/core/sampling.py", 111, "> -> >="):
        "with dropout 0 the mutant filters with random() >= 0, true of every value in [0, 1): "
        "the same ids, only more draws",
    ("fedray/core/sampling.py", 115, "> -> >="):
        "with exactly k survivors the branch keeps all k (the first k of k to finish), sorted "
        "as they already are, and late = 0; it only asks sizes, which over-selection requires",
    ("fedray/core/sampling.py", 116, "0.0 -> 1.0"):
        "LogNormal(1, 1) is e times LogNormal(0, 1) from the same normal draw: every finish "
        "time scales by one factor and only their order is used (exp is monotone; two finish "
        "times within an ulp of each other could tie differently, no test's or job's do)",
    ("fedray/algorithms/scaffold.py", 61, "True -> False"):
        "non_blocking only lets a host-to-GPU copy overlap other work (the stream orders "
        "the next use after it either way); on the CPU the tensor is not even copied",
    ("fedray/kernels/sequential.py", 62, "0 -> 1"):
        "the first permutation is never read: pos starts at n, so the first step draws a "
        "fresh one (and n = 0 takes no step)",
    ("fedray/kernels/sequential.py", 99, "True -> False"):
        _NON_BLOCKING,
    ("fedray/kernels/sequential.py", 100, "True -> False"):
        _NON_BLOCKING,
    ("fedray/kernels/sequential.py", 122, "True -> False"):
        "zip's strict only checks the lengths: grads and params are the model's parameters, "
        "anchors and linears are split by the same model (or [None] * their count)",
    ("fedray/kernels/sequential.py", 66, "True -> False"):
        "non_blocking, as in scaffold.py: the permutation's next use is ordered after the copy",
    ("fedray/kernels/sequential.py", 150, "True -> False"):
        _NON_BLOCKING,
    ("fedray/kernels/sequential.py", 151, "True -> False"):
        _NON_BLOCKING,
    ("fedray/data/partitioners/dirichlet.py", 42, "<= -> <"):
        "a donor with no spare is reached only once enough moved: the spares of the donors "
        "before it add up to at least the need (n >= min_examples * clients is checked), so "
        "got >= need breaks there all the same",
    ("fedray/timing/clock.py", 51, "> -> >="):
        "a client of n = 0 examples has touched = (s // 1) * 0 + (s % 1) * b = 0 already (its "
        "per_epoch is max(0, 1) = 1): where(n >= 0, touched, 0) gives the same 0",
    ("fedray/data/partitioners/dirichlet.py", 34, "< -> <="):
        "a client at exactly the minimum joins the short ones with a shortfall of 0: it adds "
        "0 to the need and is repeated 0 times among the receivers",
    ("fedray/data/partitioners/dirichlet.py", 74, "clip(a, b, ...) -> clip(b, a, ...)"):
        "np.clip(0, cuts, n) is min(max(0, cuts), n), as np.clip(cuts, 0, n) is: clip's value "
        "and lower bound play the same part",
    ("fedray/data/partitioners/dirichlet.py", 65, "x / y -> x (drop the factor)"):
        "the targets only enter normalized (w / w.sum(), and the fallback w = targets): "
        "scaling them all by one constant changes nothing",
    ("fedray/algorithms/privacy.py", 105, "1 -> 2"):
        "the extra sum dp_unclipped of 2 numbers instead of 1: every worker and the driver "
        "size it alike, and only its first is ever written or read",
    ("fedray/algorithms/privacy.py", 143, "> -> >="):
        "local mode with z = 0 then adds N(0, 0) noise to each update: exact zeros, and "
        "x + 0.0 is x (a -0.0 entry becomes +0.0, which compares and sums the same)",
    ("fedray/algorithms/privacy.py", 206, "> -> >="):
        "E = clients_per_round * (1 - dropout) is never 0: the config checks clients_per_round "
        ">= 1 and sampling.dropout in [0, 1), so E > 0 and >= 0 take the same branch",
    ("fedray/algorithms/privacy.py", 175, "1 -> 2"):
        "the rounds counter as 2 numbers instead of 1: only its first is ever written or read "
        "(a checkpoint holds it whole and gives it back whole)",
    ("fedray/algorithms/privacy.py", 201, "1 -> 2", 0):
        "gaussian(2, ...)[0] is gaussian(1, ...)[0]: torch draws a vector shorter than 16 "
        "normals one by one from the seeded generator, so the first is the same (2,000 seeds "
        "checked); only [0] is read",
    ("fedray/algorithms/privacy.py", 194, "> -> >="):
        "with z = 0 the noise added is N(0, 0): exact zeros, and x + 0.0 is x",
    ("fedray/algorithms/reduction.py", 58, "> -> >="):
        "at equal scales the branch multiplies by exp(0) = 1 and returns 1.0, as the other "
        "branch's exp(0) does",
}

# imported once in the runner, so the children inherit them: the libraries, and the fedray
# modules the tests import (then dropped from sys.modules, so each child imports fedray anew
# -- with the mutant -- but none of the libraries fedray pulls in)
PRELOAD = ("numpy", "torch", "pytest", "omegaconf", "pyarrow", "fsspec", "safetensors.torch",
           "fedray.api", "fedray.config", "fedray.state.run_dir", "fedray.tracking.tensorboard",
           "fedray.privacy.accountant", "fedray.data.partitioners", *(
               m.removesuffix(".py").replace("/", ".") for m in TARGETS))


# -- the mutants -----------------------------------------------------------------------------

@dataclass
class Mutant:
    index: int  # position of the node in ast.walk order (stable for one source)
    op: str  # which mutation
    line: int
    description: str


BINOP_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
              ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
              ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr,
              ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr, ast.MatMult: ast.Mult}
CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
            ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
            ast.In: ast.NotIn, ast.NotIn: ast.In}
SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
          ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&",
          ast.BitOr: "|", ast.BitXor: "^", ast.MatMult: "@", ast.Lt: "<", ast.LtE: "<=",
          ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
          ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
# swapping their arguments changes nothing
SYMMETRIC_CALLS = {"min", "max", "maximum", "minimum", "isclose", "allclose", "equal",
                   "array_equal", "hypot", "add", "mul", "multiply", "zip"}


def _skipped(tree: ast.AST, lines: list[str]) -> set[int]:
    """ids of the nodes never mutated: docstrings, annotations, raise statements,
    f-strings, ``__all__`` and lines marked ``# pragma: no mutate``."""
    skip: set[int] = set()

    def all_of(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            all_of(body[0])
        if isinstance(node, ast.arg | ast.AnnAssign):
            all_of(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            all_of(node.returns)
        if isinstance(node, ast.Raise | ast.JoinedStr):
            all_of(node)
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            all_of(node)
        line = getattr(node, "lineno", None)
        if line is not None and lines[line - 1].rstrip().endswith("# pragma: no mutate"):
            skip.add(id(node))
    return skip


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def _ops(node: ast.AST, parent: ast.AST | None) -> Iterator[tuple[str, str]]:
    """(op, description) of the mutations that apply at ``node``."""
    if isinstance(node, ast.BinOp) and type(node.op) in BINOP_SWAP:
        a, b = SYMBOL[type(node.op)], SYMBOL[BINOP_SWAP[type(node.op)]]
        yield "binop", f"{a} -> {b}"
        if isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
            yield "left", f"x {a} y -> x (drop the {'term' if a in '+-' else 'factor'})"
        if isinstance(node.op, ast.Add | ast.Mult):
            yield "right", f"x {a} y -> y (drop the {'term' if a == '+' else 'factor'})"
    elif isinstance(node, ast.AugAssign) and type(node.op) in BINOP_SWAP:
        a, b = SYMBOL[type(node.op)], SYMBOL[BINOP_SWAP[type(node.op)]]
        yield "augop", f"{a}= -> {b}="
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in CMP_SWAP:
                yield f"cmp{i}", f"{SYMBOL[type(op)]} -> {SYMBOL[CMP_SWAP[type(op)]]}"
    elif isinstance(node, ast.BoolOp):
        yield "boolop", "and -> or" if isinstance(node.op, ast.And) else "or -> and"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub | ast.Invert):
        yield "unary", {ast.Not: "not x -> x", ast.USub: "-x -> x",
                        ast.Invert: "~x -> x"}[type(node.op)]
    elif isinstance(node, ast.Constant) and not isinstance(node.value, str | bytes):
        v = node.value
        if isinstance(v, bool):
            yield "const", f"{v} -> {not v}"
        elif isinstance(v, int):
            yield "const", f"{v} -> {v + 1}"
        elif isinstance(v, float):
            yield "const", f"{v!r} -> {(v * 2 if v else 1.0)!r}"
    elif isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        yield "return", "return x -> return None"
    elif (isinstance(node, ast.Call) and len(node.args) >= 2
          and not any(isinstance(a, ast.Starred) for a in node.args[:2])
          and _call_name(node) not in SYMMETRIC_CALLS
          and ast.dump(node.args[0]) != ast.dump(node.args[1])):
        yield "swap", f"{_call_name(node)}(a, b, ...) -> {_call_name(node)}(b, a, ...)"
    if isinstance(node, ast.If | ast.While | ast.IfExp):
        yield "negate", f"{type(node).__name__.lower()} c -> {type(node).__name__.lower()} not c"
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        yield "drop", f"{_call_name(node.value)}(...) deleted"


def _replace(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for field, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, field, new)
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is old:
                    value[i] = new
                    return
    raise AssertionError("node not found in its parent")


def _apply(node: ast.AST, parent: ast.AST, op: str) -> None:
    if op == "binop":
        node.op = BINOP_SWAP[type(node.op)]()
    elif op == "left":
        _replace(parent, node, node.left)
    elif op == "right":
        _replace(parent, node, node.right)
    elif op == "augop":
        node.op = BINOP_SWAP[type(node.op)]()
    elif op.startswith("cmp"):
        i = int(op[3:])
        node.ops[i] = CMP_SWAP[type(node.ops[i])]()
    elif op == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif op == "unary":
        _replace(parent, node, node.operand)
    elif op == "const":
        v = node.value
        node.value = (not v if isinstance(v, bool) else v + 1 if isinstance(v, int)
                      else v * 2 if v else 1.0)
    elif op == "return":
        node.value = ast.Constant(None)
    elif op == "swap":
        node.args[0], node.args[1] = node.args[1], node.args[0]
    elif op == "negate":
        node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
    elif op == "drop":
        _replace(parent, node, ast.Pass())
    else:
        raise ValueError(op)


def _walk(tree: ast.AST) -> tuple[list[ast.AST], dict[int, ast.AST]]:
    nodes = list(ast.walk(tree))
    parents = {id(c): p for p in nodes for c in ast.iter_child_nodes(p)}
    return nodes, parents


def mutants(source: str) -> list[Mutant]:
    """Every mutant of ``source``, in a stable order."""
    tree = ast.parse(source)
    skip = _skipped(tree, source.splitlines())
    nodes, parents = _walk(tree)
    out = []
    for i, node in enumerate(nodes):
        if id(node) in skip:
            continue
        for op, desc in _ops(node, parents.get(id(node))):
            out.append(Mutant(i, op, node.lineno, desc))
    return out


def mutate(source: str, m: Mutant) -> ast.Module:
    tree = ast.parse(source)
    nodes, parents = _walk(tree)
    node = nodes[m.index]
    _apply(node, parents.get(id(node)), m.op)
    return ast.fix_missing_locations(tree)


# -- running the tests against one mutant ------------------------------------------------------

class _Serve(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import hook that serves one module's mutated code instead of its file."""

    def __init__(self, name: str, path: str, code):
        self.name, self.path, self.code = name, path, code

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(self.code, module.__dict__)


def _purge() -> None:
    for name in list(sys.modules):
        if name == "fedray" or name.startswith("fedray.") or name == "conftest":
            del sys.modules[name]


def run_tests(module: str, code, pytest_args: list[str], timeout_s: float,
              verbose: bool = False) -> tuple[str, float]:
    """'killed', 'survived' or 'timeout' (counted as killed), and the seconds it took; a
    forked child runs pytest with ``code`` as ``module``'s code (None: the file itself)."""
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: its own process group, so a timeout ends all it started
        rc = 3
        try:
            os.setpgid(0, 0)
            if not verbose:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
            _purge()
            if code is not None:
                name = module.removesuffix(".py").replace("/", ".")
                sys.meta_path.insert(0, _Serve(name, str(ROOT / module), code))
            import pytest

            # no plugins from entry points (Ray's and others' cost ~20 s a start), and none
            # of pytest's own that only tidy up at exit (gc.collect() several times over)
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
            rc = int(pytest.main([*pytest_args, "-x", "-q", "-p", "no:cacheprovider",
                                  "-p", "no:unraisableexception", "-p", "no:threadexception",
                                  "-p", "no:faulthandler", "-m", "not cluster",
                                  "-W", "ignore"]))
        finally:
            os._exit(rc)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t0 > timeout_s:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - t0
        time.sleep(0.02)
    rc = os.waitstatus_to_exitcode(status)
    took = time.monotonic() - t0
    if rc == 0:
        return "survived", took
    if rc in (1, 2):  # a test failed, or the mutant broke the import / collection
        return "killed", took
    raise SystemExit(f"mutation: pytest exited {rc} on {module} {pytest_args} (no tests?)")


def sample(module: str, count: int, at_most: int | None) -> list[int]:
    """The mutant numbers to run: all, or the first ``at_most`` of a random order of them
    seeded by the module's path (the same sample every time, whoever runs it; a larger
    ``at_most`` adds mutants to the sample, it never swaps any)."""
    if at_most is None or at_most >= count:
        return list(range(count))
    seed = int.from_bytes(hashlib.sha256(module.encode()).digest()[:8], "little")
    return sorted(random.Random(seed).sample(range(count), count)[:at_most])


def run_module(module: str, only: list[int] | None, progress: Callable[[str], None],
               before: dict | None = None) -> dict:
    """Every mutant of ``module`` against its tests; ``before`` (a previous report of the
    same source): only its survivors are run again, the killed stay killed (tests added
    since can only kill more)."""
    source = (ROOT / module).read_text()
    args = TARGETS[module]
    total = len(mutants(source))
    baseline, took = run_tests(module, None, args, timeout_s=1200)
    if baseline != "survived":
        raise SystemExit(f"mutation: the tests of {module} fail without any mutant: {args}")
    timeout = max(30.0, 3 * took + 10)
    lines = source.splitlines()
    results = []
    previous = {}
    if before is not None:
        if before["source_sha256"] != hashlib.sha256(source.encode()).hexdigest():
            raise SystemExit(f"mutation: {module} changed since that report: run it whole")
        previous = {r["n"]: r for r in before["results"]
                    if r["outcome"] in ("killed", "timeout")}
    everyone = mutants(source)
    seen: dict[tuple[int, str], int] = {}
    for n, m in enumerate(everyone):
        occurrence = seen[m.line, m.description] = seen.get((m.line, m.description), -1) + 1
        if only is not None and n not in only:
            continue
        if n in previous:
            results.append(previous[n])
            continue
        tree = mutate(source, m)
        code = compile(tree, str(ROOT / module), "exec")
        outcome, secs = run_tests(module, code, args, timeout)
        twins = sum((x.line, x.description) == (m.line, m.description) for x in everyone)
        why = EQUIVALENT.get((module, m.line, m.description, occurrence)) or (
            EQUIVALENT.get((module, m.line, m.description)) if twins == 1 else None)
        if outcome == "survived" and why:
            outcome = "equivalent"
        results.append({**asdict(m), "n": n, "outcome": outcome, "seconds": round(secs, 2),
                        "source": lines[m.line - 1].strip(), "why": why})
        progress(f"  #{n:3d} {outcome:10s} {module}:{m.line} {m.description}")
    counts = {k: sum(r["outcome"] == k for r in results)
              for k in ("killed", "timeout", "survived", "equivalent")}
    scored = len(results) - counts["equivalent"]
    score = (counts["killed"] + counts["timeout"]) / scored if scored else 1.0
    return {"module": module, "tests": " ".join(args), "baseline_s": round(took, 2),
            "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
            "mutants": len(results), "of_total": total, **counts, "score": round(score, 4),
            "results": results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="module paths (default: all of TARGETS)")
    ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    ap.add_argument("--only", type=int, nargs="*", help="run these mutant numbers only")
    ap.add_argument("--max", type=int, dest="at_most",
                    help="a seeded uniform sample of at most this many mutants per module "
                         "(default: every mutant)")
    ap.add_argument("--json", help="write every mutant's outcome here (JSON)")
    ap.add_argument("--rerun", help="a --json report: run only its survivors again")
    ap.add_argument("--tests", help="pytest arguments (one string) to use instead of TARGETS' "
                                    "(one module only): e.g. older tests, to see what they miss")
    ap.add_argument("--min-score", type=float, default=0.9,
                    help="exit 1 if a module scores below this (default 0.9)")
    a = ap.parse_args(argv)
    modules = a.modules or list(TARGETS)
    unknown = [m for m in modules if m not in TARGETS]
    if unknown:
        ap.error(f"not in tools/mutation.py's TARGETS: {', '.join(unknown)}")
    if a.tests:
        if len(modules) != 1:
            ap.error("--tests needs exactly one module")
        TARGETS[modules[0]] = shlex.split(a.tests)
    if a.list:
        for module in modules:
            for n, m in enumerate(mutants((ROOT / module).read_text())):
                print(f"#{n:3d} {module}:{m.line} {m.description}")
        return 0
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    for name in PRELOAD:  # once here, not once per mutant: the children inherit them
        try:
            __import__(name)
        except ImportError:
            pass
    _purge()
    import gc

    gc.freeze()  # the preloaded objects: a child's collections never walk them
    reports = []
    for module in modules:
        print(f"{module}: {' '.join(TARGETS[module])}", flush=True)
        before = None
        if a.rerun:
            before = next((r for r in json.loads(Path(a.rerun).read_text())
                           if r["module"] == module), None)
        only = a.only
        if a.at_most is not None:
            count = len(mutants((ROOT / module).read_text()))
            only = [n for n in sample(module, count, a.at_most) if only is None or n in only]
        rep = run_module(module, only, lambda s: print(s, flush=True), before)
        reports.append(rep)
    print("\nmodule | mutants (of all) | killed | survived | equivalent | score")
    for r in reports:
        print(f"{r['module']} | {r['mutants']} ({r['of_total']}) | {r['killed'] + r['timeout']} | "
              f"{r['survived']} | {r['equivalent']} | {r['score']:.0%}")
    for r in reports:
        for x in r["results"]:
            if x["outcome"] in ("survived", "equivalent"):
                print(f"{x['outcome']}: {r['module']}:{x['line']} #{x['n']} {x['description']}"
                      f"  | {x['source']}" + (f"  ({x['why']})" if x["why"] else ""))
    if a.json:
        Path(a.json).write_text(json.dumps(reports, indent=1))
    return 1 if any(r["score"] < a.min_score for r in reports) else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    sys.exit(main())
