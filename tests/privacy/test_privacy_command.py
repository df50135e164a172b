"""``fedray privacy``, as a user runs it (``fedray.cli.main`` in this process: the same
parsing, errors and exit codes as the ``fedray`` executable)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from fedray.cli import main
from fedray.privacy import accountant, commands

# the help's example: 1000 of 100,000 clients a round, 1000 rounds, delta 1/N^1.1
N, K, R = 100_000, 1_000, 1_000
MECH = {"sampling": "poisson", "population": N, "clients_per_round": K, "accountant": "rdp"}
SIZE = ["--rounds", str(R), "--population", str(N), "--clients-per-round", str(K)]


def _privacy(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["privacy", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _ok(capsys, *args: str) -> list[str]:
    code, out, err = _privacy(capsys, *args)
    assert code == 0 and err == "", err
    return out.splitlines()


def test_names_are_the_accountants():
    """The parser spells the names out (it imports no dp_accounting)."""
    assert commands.ACCOUNTANTS == accountant.ACCOUNTANTS
    assert commands.SAMPLINGS == accountant.SAMPLINGS


def test_the_cli_imports_nothing_heavy():
    """Every fedray command builds the parser: dp_accounting, numpy and matplotlib load
    only when ``fedray privacy`` runs."""
    code = ("import sys, fedray.cli; print(sorted(m for m in ('dp_accounting', 'numpy', "
            "'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_epsilon_prints_the_accountants_value(capsys):
    lines = _ok(capsys, "epsilon", "--noise-multiplier", "1.0", *SIZE)
    delta = accountant.default_delta(N)
    eps = accountant.epsilon(1.0, R, delta, **MECH)
    assert len(lines) == 1
    assert lines[0].startswith(f"epsilon {eps:.4g} after 1,000 rounds of noise multiplier 1;")
    assert f"delta {delta:.4g} (default 1/N^1.1)" in lines[0]
    assert "1,000 of 100,000 clients" in lines[0] and "rdp accountant" in lines[0]
    line = _ok(capsys, "epsilon", "--noise-multiplier", "1.0", *SIZE, "--delta", "1e-5",
               "--sampling", "local")[0]
    eps = accountant.epsilon(1.0, R, 1e-5, **{**MECH, "sampling": "local"})
    assert line.startswith(f"epsilon {eps:.4g} ") and "delta 1e-05," in line
    assert "default" not in line and "local noise" in line


def test_noise_for_the_helps_example(capsys):
    """What noise gives epsilon 2 at delta 1/N^1.1 after 1000 rounds with 1000 of 100,000
    clients a round: the printed z (4 digits, rounded up) meets the target and the epsilon
    printed is its own."""
    assert "fedray privacy noise --epsilon 2 --rounds 1000 --population 100000" in \
        commands.PRIVACY_HELP
    line = _ok(capsys, "noise", "--epsilon", "2", *SIZE)[0]
    m = re.match(r"noise multiplier (\S+) gives epsilon (\S+) \(target 2\) after 1,000 "
                 r"rounds; ", line)
    assert m, line
    z, delta = float(m.group(1)), accountant.default_delta(N)
    found = accountant.noise_multiplier_for(2.0, R, delta, **MECH)
    assert z == commands._round_up(found, 4) and z >= found
    eps = accountant.epsilon(z, R, delta, **MECH)
    assert m.group(2) == f"{eps:.4g}" and eps <= 2.0
    # and `epsilon` with that z says the same
    again = _ok(capsys, "epsilon", "--noise-multiplier", m.group(1), *SIZE)[0]
    assert again.startswith(f"epsilon {m.group(2)} ")


@pytest.mark.parametrize("args,named", [
    (["epsilon", "--noise-multiplier", "1", "--rounds", "10", "--population", "100",
      "--clients-per-round", "200"], "--clients-per-round must be <= --population (100)"),
    (["epsilon", "--noise-multiplier", "-1", *SIZE], "--noise-multiplier"),
    (["epsilon", "--noise-multiplier", "nan", *SIZE], "--noise-multiplier"),
    (["epsilon", "--noise-multiplier", "1", "--rounds", "0", "--population", "100",
      "--clients-per-round", "10"], "--rounds"),
    (["epsilon", "--noise-multiplier", "1", *SIZE, "--delta", "1.5"], "--delta"),
    (["epsilon", "--noise-multiplier", "1", "--rounds", "1", "--population", "1",
      "--clients-per-round", "1"], "--delta"),  # the default 1/N^1.1 is 1
    (["epsilon", "--noise-multiplier", "1", *SIZE, "--sampling", "fixed", "--accountant",
      "pld"], "--accountant pld cannot account --sampling fixed"),
    (["epsilon", "--noise-multiplier", "0.1", *SIZE, "--accountant", "pld"],
     "--noise-multiplier below 0.3"),
    (["epsilon", "--noise-multiplier", "0", *SIZE, "--plot", "x.png"], "--plot"),
    (["noise", "--epsilon", "0", *SIZE], "--epsilon"),
    (["noise", "--epsilon", "1e-6", *SIZE], "--epsilon 1e-06: no noise multiplier up to"),
])
def test_bad_options_are_one_line_naming_them(capsys, args, named):
    code, out, err = _privacy(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith("fedray: error: ") and err.count("\n") == 1, err
    assert named in err, err


def test_plot_writes_a_png(tmp_path, capsys):
    path = tmp_path / "eps.png"
    lines = _ok(capsys, "epsilon", "--noise-multiplier", "1.0", *SIZE, "--plot", str(path))
    assert lines[1] == f"plot: {path}"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = _privacy(capsys, "epsilon", "--noise-multiplier", "1.0", *SIZE, "--plot",
                            str(tmp_path / "missing" / "eps.png"))
    assert code == 2 and "--plot" in err and err.count("\n") == 1, err


def test_debug_and_help(capsys):
    _ok(capsys, "epsilon", "--debug", "--noise-multiplier", "2", *SIZE)
    with pytest.raises(SystemExit) as done:
        main(["privacy", "noise", "--help"])
    assert done.value.code == 0
    assert "--clients-per-round K" in capsys.readouterr().out
