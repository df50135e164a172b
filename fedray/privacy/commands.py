"""``fedray privacy``: the epsilon a DP-FedAvg configuration spends, or the noise a target
epsilon needs, from the shell -- the numbers a researcher wants before starting a run.

A thin layer over fedray.privacy.accountant: every check names the option a user typed.
The parser is built for every ``fedray`` command, so this module imports nothing heavy at
the top: dp_accounting (and matplotlib, for --plot) load only when a ``privacy`` command
runs. The accountants' and samplings' names are therefore spelt out here;
tests/privacy/test_privacy_command.py checks that they are the accountant module's.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from fedray.errors import FedrayError, one_line

ACCOUNTANTS = ("rdp", "pld")  # fedray.privacy.accountant.ACCOUNTANTS
SAMPLINGS = ("poisson", "fixed", "local")  # fedray.privacy.accountant.SAMPLINGS
# points of the --plot curve: an RDP point costs microseconds, a PLD point a composition
# (a tenth of a second or more)
PLOT_POINTS = {"rdp": 400, "pld": 40}
SHOWN_DIGITS = 4  # significant digits of the noise multiplier `noise` prints
INT64_MAX = 2 ** 63 - 1

PRIVACY_HELP = """Privacy accounting for user-level DP-FedAvg: the epsilon a noise multiplier
spends, or the noise multiplier a target epsilon needs.

examples:
  fedray privacy epsilon --noise-multiplier 1.0 --rounds 1000 --population 100000 \\
      --clients-per-round 1000
  fedray privacy epsilon --noise-multiplier 1.0 --rounds 1000 --population 100000 \\
      --clients-per-round 1000 --accountant pld --plot epsilon.png
  # what noise gives epsilon 2 at delta 1/N^1.1 after 1000 rounds with 1000 of 100,000
  # clients a round
  fedray privacy noise --epsilon 2 --rounds 1000 --population 100000 \\
      --clients-per-round 1000
  fedray privacy noise --epsilon 8 --rounds 200 --population 3400 --clients-per-round 50 \\
      --sampling fixed --delta 1e-5

The mechanism: every client's update is clipped to norm C and Gaussian noise of standard
deviation Z * C (Z: the noise multiplier) is added. --sampling says where and to whom:
  poisson  (default) each client takes part with probability K/N, noise on the round's sum
           (DP-FedAvg's accounting; neighbours add or remove one client)
  fixed    exactly K of N clients a round, noise on the sum (neighbours replace one
           client, which moves the sum twice as far; --accountant rdp only)
  local    each client noises its own update; no amplification by sampling: a bound for
           a client that reports every round
--delta defaults to 1/N^1.1, fedray's choice (well below 1/N). --accountant rdp (Renyi DP,
the default) is fast and an upper bound; pld (privacy loss distributions) is tighter and
slower. Accounting by Google's dp-accounting library; details: docs/privacy.md."""

EPSILON_HELP = """The epsilon, at delta, that ROUNDS rounds of noise multiplier Z spend
for every client; one line with the inputs. --plot also writes epsilon against the round.

examples:
  fedray privacy epsilon --noise-multiplier 1.0 --rounds 1000 --population 100000 \\
      --clients-per-round 1000
  fedray privacy epsilon --noise-multiplier 1.2 --rounds 500 --population 3400 \\
      --clients-per-round 50 --accountant pld --plot eps.png
  fedray privacy epsilon --noise-multiplier 1.0 --rounds 100 --population 3400 \\
      --clients-per-round 50 --sampling fixed --delta 1e-5

See fedray privacy --help for the samplings and accountants."""

NOISE_HELP = """The smallest noise multiplier whose epsilon after ROUNDS rounds is at most
E (to 4 significant digits, rounded up), and the epsilon it gives.

examples:
  # what noise gives epsilon 2 at delta 1/N^1.1 after 1000 rounds with 1000 of 100,000
  # clients a round
  fedray privacy noise --epsilon 2 --rounds 1000 --population 100000 \\
      --clients-per-round 1000
  fedray privacy noise --epsilon 2 --rounds 1000 --population 100000 \\
      --clients-per-round 1000 --accountant pld

See fedray privacy --help for the samplings and accountants."""

Command = Callable[[Any, str, str, str], argparse.ArgumentParser]


def add_privacy_command(sub: Any, command: Command) -> None:
    """Add ``fedray privacy`` to the CLI's sub-commands. ``command`` is fedray.cli's
    ``_command`` (help kept as written, --debug), used for the verbs only: argparse lets a
    sub-command's unset --debug reset one given before it, so ``privacy`` itself has none."""
    privacy = sub.add_parser("privacy", help="privacy accounting: epsilon or noise",
                             description=PRIVACY_HELP,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = privacy.add_subparsers(dest="privacy_command", required=True, metavar="VERB")
    eps = command(verbs, "epsilon", "the epsilon a noise multiplier spends", EPSILON_HELP)
    eps.add_argument("--noise-multiplier", type=float, required=True, metavar="Z",
                     help="noise standard deviation over the clipping norm")
    noise = command(verbs, "noise", "the noise multiplier an epsilon needs", NOISE_HELP)
    noise.add_argument("--epsilon", type=float, required=True, metavar="E",
                       help="the target epsilon after --rounds rounds")
    for cmd in (eps, noise):
        cmd.add_argument("--rounds", type=int, required=True, metavar="R",
                         help="rounds of the run")
        cmd.add_argument("--population", type=int, required=True, metavar="N",
                         help="clients in the population")
        cmd.add_argument("--clients-per-round", type=int, required=True, metavar="K",
                         help="clients a round (poisson: on average)")
        cmd.add_argument("--delta", type=float, metavar="D",
                         help="the delta of (epsilon, delta) (default: 1/N^1.1)")
        cmd.add_argument("--sampling", choices=SAMPLINGS, default="poisson",
                         help="poisson (default), fixed or local; see fedray privacy --help")
        cmd.add_argument("--accountant", choices=ACCOUNTANTS, default="rdp",
                         help="rdp (default: fast, an upper bound) or pld (tighter, slower)")
    eps.add_argument("--plot", metavar="PNG", help="also write epsilon against rounds "
                     "1..R to this image file")


def run_privacy(args: argparse.Namespace) -> int:
    """Run a parsed ``fedray privacy`` command; prints its result, returns the exit code."""
    # imported when used, not at the top: it loads scipy, numpy (start-up time)
    from fedray.privacy import accountant as acc

    delta, default = _check_args(args, acc.PLD_MIN_NOISE, acc.ACCOUNTED_NOISE,
                                 acc.PLD_MAX_ROUNDS)
    mechanism = {"sampling": args.sampling, "population": args.population,
                 "clients_per_round": args.clients_per_round, "accountant": args.accountant}
    where = _describe(args, delta, default)
    if args.privacy_command == "epsilon":
        z = args.noise_multiplier
        eps = acc.epsilon(z, args.rounds, delta, **mechanism)
        print(f"epsilon {eps:.4g} after {args.rounds:,} rounds of noise multiplier {z:g}; "
              f"{where}", flush=True)
        if args.plot:
            _plot(args.plot, acc.Accountant(z, delta, **mechanism), args, delta, default)
            print(f"plot: {args.plot}", flush=True)
        return 0
    target = args.epsilon
    try:
        z = acc.noise_multiplier_for(target, args.rounds, delta, **mechanism)
    except ValueError as exc:  # the target out of the search's reach
        raise FedrayError(f"--epsilon {target:g}: {one_line(exc)}") from None
    shown = _round_up(z, SHOWN_DIGITS)  # what a user will type back: it must meet the target
    eps = acc.epsilon(shown, args.rounds, delta, **mechanism)
    if eps > target:  # (a PLD's discretisation could make that happen; never seen)
        shown, eps = z, acc.epsilon(z, args.rounds, delta, **mechanism)
    print(f"noise multiplier {shown:g} gives epsilon {eps:.4g} (target {target:g}) after "
          f"{args.rounds:,} rounds; {where}", flush=True)
    return 0


def _check_args(args: argparse.Namespace, pld_min_noise: float,
                noise_range: tuple[float, float], pld_max_rounds: int) -> tuple[float, bool]:
    """Refuse bad options, naming them; the delta to use and whether it is the default.
    The bounds are the accountant's (fedray.privacy.accountant), passed in so that this
    module imports no dp_accounting until a command runs."""
    def need(ok: bool, option: str, what: str, value: object) -> None:
        if not ok:
            raise FedrayError(f"{option} must be {what}, got {value!r}")

    n, k = args.population, args.clients_per_round
    need(args.rounds >= 1, "--rounds", ">= 1", args.rounds)
    need(n >= 1, "--population", ">= 1", n)
    need(k >= 1, "--clients-per-round", ">= 1", k)
    for option, value in (("--rounds", args.rounds), ("--population", n),
                          ("--clients-per-round", k)):  # counts the library keeps as int64
        need(value <= INT64_MAX, option, f"<= {INT64_MAX:,}", value)
    need(k <= n, "--clients-per-round", f"<= --population ({n:,})", k)
    if args.privacy_command == "epsilon":
        z = args.noise_multiplier
        need(math.isfinite(z) and z >= 0, "--noise-multiplier", ">= 0 and finite", z)
        lo, hi = noise_range
        need(z == 0 or lo <= z <= hi, "--noise-multiplier", f"0 or in [{lo:g}, {hi:g}] (the "
             "range dp_accounting computes reliably)", z)
        if args.accountant == "pld" and args.sampling == "poisson" and 0 < z < pld_min_noise:
            raise FedrayError(f"--noise-multiplier below {pld_min_noise:g} is refused by "
                              f"--accountant pld (its distribution would need GBs of memory); "
                              f"use --accountant rdp, got {z:g}")
        if args.plot and z == 0:
            raise FedrayError("--plot: without noise (--noise-multiplier 0) epsilon is "
                              "infinite from the first round; nothing to plot")
        if args.plot:  # before any accounting: a type matplotlib cannot write
            # imported when used (start-up time): fsspec, which `fedray --help` does not load
            from fedray.tracking.figures import figure_format

            figure_format(args.plot, "--plot")
    else:
        e = args.epsilon
        need(math.isfinite(e) and e > 0, "--epsilon", "> 0 and finite", e)
    if args.accountant == "pld" and args.sampling == "poisson" and args.rounds > pld_max_rounds:
        raise FedrayError(f"--rounds above {pld_max_rounds:,} are refused by --accountant pld "
                          f"(its distribution grows with them); use --accountant rdp, got "
                          f"{args.rounds}")
    if args.accountant == "pld" and args.sampling == "fixed":
        raise FedrayError("--accountant pld cannot account --sampling fixed (dp-accounting's "
                          "PLD has no sampling without replacement); use --accountant rdp, or "
                          "--sampling poisson")
    if args.delta is not None:
        need(0 < args.delta < 1, "--delta", "in (0, 1)", args.delta)
        return args.delta, False
    delta = 1.0 / n ** 1.1
    if not delta < 1:
        raise FedrayError(f"--population {n}: the default --delta, 1/N^1.1, is {delta:g}; "
                          f"give --delta")
    return delta, True


def _describe(args: argparse.Namespace, delta: float, default: bool) -> str:
    """The rest of the line: delta, sampling and accountant, as used."""
    n, k = args.population, args.clients_per_round
    sampling = {
        "poisson": f"poisson sampling, {k:,} of {n:,} clients a round on average "
                   f"(q = {k / n:.4g})",
        "fixed": f"fixed sampling, {k:,} of {n:,} clients a round",
        "local": "local noise, no amplification (a client reporting every round)",
    }[args.sampling]
    return (f"delta {delta:.4g}" + (" (default 1/N^1.1)" if default else "")
            + f", {sampling}, {args.accountant} accountant")


def _round_up(x: float, digits: int) -> float:
    """``x`` rounded up to ``digits`` significant digits."""
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(x * scale) / scale


def _plot(path: str, accountant: Any, args: argparse.Namespace, delta: float,
          default: bool) -> None:
    """Epsilon against rounds 1..R, the last point marked with its value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    # imported when used (start-up time): fsspec, which `fedray --help` does not load
    from fedray.tracking.figures import plain_text, write_figure

    last = args.rounds
    half = PLOT_POINTS[args.accountant] // 2  # half evenly spaced, half denser early on,
    grid = np.concatenate([  # where epsilon rises fastest
        np.linspace(1, float(last), half), np.geomspace(1, float(last), half)])
    # Python's integers, not int64: --rounds may be past 2**63, which RDP accounts
    rounds = sorted({min(last, max(1, round(float(r)))) for r in grid})
    eps = [accountant.epsilon(r) for r in rounds]
    rounds = [float(r) for r in rounds]  # what matplotlib plots
    with plain_text():
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        few = len(rounds) <= PLOT_POINTS["pld"]  # each point an accountant's value: show them
        ax.plot(rounds, eps, color="C0", marker="o" if few else None, markersize=3)
        ax.plot([rounds[-1]], [eps[-1]], "o", color="C0")
        ax.annotate(f"epsilon {eps[-1]:.3g} after {last:,} rounds", (rounds[-1], eps[-1]),
                    xytext=(-10, 0), textcoords="offset points", ha="right", va="center",
                    fontsize="small")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(0, last * 1.02)
        ax.set_ylim(0, max(eps) * 1.08 or 1.0)  # all 0 (a huge z): still an axis
        ax.set_xlabel("round")
        ax.set_ylabel(f"epsilon at delta {delta:.3g}" + (" (1/N^1.1)" if default else ""))
        n, k = args.population, args.clients_per_round
        who = ("local noise, no amplification" if args.sampling == "local" else
               f"{args.sampling} sampling, {k:,} of {n:,} clients a round")
        ax.set_title(f"DP-FedAvg, noise multiplier {args.noise_multiplier:g}: {who} "
                     f"({args.accountant})", fontsize="medium")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
    write_figure(fig, path, "--plot", dpi=120)
