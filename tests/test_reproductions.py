"""docs/reproductions.md keeps its own books: the summary table equals the sections, each
section's fidelity line equals its setup table, each section's verdict follows from its claim
rows by the criteria stated at the top of the document, and every seed line a section cites
exists and is not blank in ../shared/seeds.

Pure text parsing: no Ray, no torch. The seed-line checks need ../shared/seeds beside the
repository (or FEDRAY_SHARED_SEEDS, or the seeds folder beside FEDRAY_SHARED_DATA); they skip
when it is missing, unless FEDRAY_REQUIRE_SHARED_DATA=1, as for tests/conftest.py's
shared_data fixture.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reproductions.md"

SECTION_VERDICTS = ("reproduced", "partly reproduced", "not reproduced", "not testable here")
ROW_VERDICTS = ("holds", "does not hold", "not shown", "not run", "not testable here")
FIDELITY = re.compile(r"^Fidelity: matching (\d+) / stated (\d+), open (\d+)\.$", re.M)
VERDICT = re.compile(r"^\*\*Verdict: ([a-z ]+?)[.*(]", re.M)
SETUP_HEADER = re.compile(r"^\| setting \| seed[^|]*\| fedray \| why different \|$")
CLAIMS_HEADER = "| claim | seed line | fedray's evidence | verdict |"
# "line 12", "lines 12-14", "lines 47, 59 and 60", "lines 127–138"
NUMBERS = r"\d+(?:\s*[-–]\s*\d+)?(?:(?:\s*,\s*|\s+and\s+)\d+(?:\s*[-–]\s*\d+)?)*"
CITATION = re.compile(rf"\blines? ({NUMBERS})")
# a bare "(55)" or "(55-57)" in a setup table's seed column
BARE = re.compile(rf"(?:(?<=\s)|^)\(({NUMBERS})\)")


def seeds_dir() -> Path:
    if os.environ.get("FEDRAY_SHARED_SEEDS"):
        return Path(os.environ["FEDRAY_SHARED_SEEDS"])
    if os.environ.get("FEDRAY_SHARED_DATA"):
        return Path(os.environ["FEDRAY_SHARED_DATA"]).parent / "seeds"
    return ROOT.parent / "shared" / "seeds"


def cells(row: str) -> list[str]:
    """A markdown table row's cells; an escaped pipe (\\|) stays inside its cell."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def tables(text: str, header) -> list[list[list[str]]]:
    """Every table whose header line matches ``header`` (a string or a compiled pattern),
    as its body rows' cells."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        if header.match(line) if isinstance(header, re.Pattern) else line == header:
            body = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                body.append(cells(row))
            found.append(body)
    return found


def sections() -> dict[int, tuple[str, str]]:
    """Numbered sections: number -> (heading, text up to the next numbered section)."""
    text = DOC.read_text()
    parts = re.split(r"(?m)^(?=## \d+\. )", text)
    out = {}
    for part in parts[1:]:
        heading = part.splitlines()[0]
        out[int(re.match(r"## (\d+)\.", heading).group(1))] = heading, part
    return out


def summary() -> dict[int, list[str]]:
    text = DOC.read_text()
    head = text[:text.index("\n## 1. ")]
    rows = tables(head, "| # | experiment (seed) | settings matching / stated | open | verdict |")
    assert len(rows) == 1, "the summary table is missing or doubled"
    return {int(r[0]): r for r in rows[0]}


def judged() -> list[int]:
    """The sections that carry a setup table, claim rows and a verdict (5 is a pointer)."""
    return [n for n, row in summary().items() if row[2] != "—"]


def fidelity(text: str) -> tuple[int, int, int]:
    found = FIDELITY.findall(text)
    assert len(found) == 1, (
        f"expected one 'Fidelity: matching M / stated S, open O.' line, got {found}")
    return tuple(int(x) for x in found[0])


def section_verdict(text: str) -> str:
    """The verdict line after the claims table (section 9 also has one per figure above it)."""
    after = text[text.index(CLAIMS_HEADER):]
    found = VERDICT.findall(after)
    assert found, "no '**Verdict: ...' line after the claims table"
    assert found[0] in SECTION_VERDICTS, found[0]
    return found[0]


def row_verdict(cell: str) -> str:
    for verdict in sorted(ROW_VERDICTS, key=len, reverse=True):
        if cell == verdict or cell.startswith(verdict + " ("):
            return verdict
    raise AssertionError(f"claim verdict {cell!r} is none of {ROW_VERDICTS}")


def follows(rows: list[str]) -> str:
    """A section's verdict from its rows' verdicts, by the document's criteria."""
    if all(r == "holds" for r in rows):
        return "reproduced"
    if any(r == "holds" for r in rows):
        return "partly reproduced"
    if all(r == "not testable here" for r in rows):
        return "not testable here"
    return "not reproduced"


def recount(rows: list[list[str]]) -> tuple[int, int, int]:
    """(matching, stated, open) from a setup table by the rule stated at the top of the
    document: "—" matches, "fedray's choice..." is open, anything else differs."""
    matching = stated = open_ = 0
    for r in rows:
        assert len(r) == 4, r
        why = r[3]
        if why.startswith("fedray's choice"):
            open_ += 1
        else:
            stated += 1
            matching += why.startswith("—")
    return matching, stated, open_


def cited_lines(text: str) -> list[tuple[str, int]]:
    """(the citation as written, line number) for every line a section cites: "line(s) N"
    in its prose and tables, bare "(N)" in its setup tables' seed column, and every number
    in its claim rows' seed-line column."""
    found = [m.group(1) for m in CITATION.finditer(text)]
    for table in tables(text, SETUP_HEADER):
        for r in table:
            found += [m.group(1) for m in BARE.finditer(r[1])]
    for table in tables(text, CLAIMS_HEADER):
        found += [r[1] for r in table]
    out = []
    for cite in found:
        for part in re.split(r"\s*,\s*|\s+and\s+", cite):
            for end in re.split(r"\s*[-–]\s*", part):
                out.append((cite, int(end)))
    return out


def test_summary_lists_every_numbered_section():
    assert sorted(summary()) == sorted(sections())


@pytest.mark.parametrize("number", judged())
def test_summary_counts_and_verdict_equal_the_sections(number):
    row = summary()[number]
    _, text = sections()[number]
    matching, stated, open_ = fidelity(text)
    assert row[2] == f"{matching} / {stated}", (row[2], (matching, stated))
    assert row[3] == str(open_), (row[3], open_)
    verdict = re.match(r"\*\*([a-z ]+)\*\*", row[4])
    assert verdict, f"the summary's verdict cell must start with a bold verdict: {row[4]!r}"
    assert verdict.group(1) == section_verdict(text)


@pytest.mark.parametrize("number", judged())
def test_fidelity_line_equals_the_setup_table(number):
    _, text = sections()[number]
    setup = tables(text, SETUP_HEADER)
    assert len(setup) == 1, f"expected one setup table, found {len(setup)}"
    assert recount(setup[0]) == fidelity(text)


@pytest.mark.parametrize("number", judged())
def test_verdict_follows_from_the_claim_rows(number):
    _, text = sections()[number]
    claims = tables(text, CLAIMS_HEADER)
    assert len(claims) == 1, f"expected one claims table, found {len(claims)}"
    rows = claims[0]
    assert rows, "the claims table is empty"
    for r in rows:
        assert len(r) == 4 and all(r), r
        assert re.fullmatch(NUMBERS, r[1]), f"seed line {r[1]!r} is not a line number or range"
    assert section_verdict(text) == follows([row_verdict(r[3]) for r in rows])


def test_the_rule_can_fail():
    """The checks are not vacuous: a wrong verdict, a wrong count and an unknown row verdict
    are caught."""
    assert follows(["holds", "not shown"]) == "partly reproduced"
    assert follows(["not shown", "does not hold"]) == "not reproduced"
    assert follows(["not testable here"]) == "not testable here"
    assert recount([["x", "1 (3)", "1", "—"], ["y", "not given", "2", "fedray's choice"],
                    ["z", "4 (5)", "5", "other data"]]) == (1, 2, 1)
    with pytest.raises(AssertionError):
        row_verdict("reproduced")


@pytest.fixture(scope="module")
def seeds() -> dict[str, list[str]]:
    folder = seeds_dir()
    if not folder.is_dir():
        if os.environ.get("FEDRAY_REQUIRE_SHARED_DATA") == "1":
            pytest.fail(f"{folder} is missing but FEDRAY_REQUIRE_SHARED_DATA=1")
        pytest.skip(f"seed papers not found at {folder} (set FEDRAY_SHARED_SEEDS)")
    return {p.name[:3]: p.read_text().splitlines() for p in folder.glob("[0-9][0-9][0-9]_*.txt")}


@pytest.mark.parametrize("number", sorted(sections()))
def test_every_cited_seed_line_exists_and_is_not_blank(number, seeds):
    heading, text = sections()[number]
    named = re.search(r"\b[Ss]eed (\d{3})\b", heading)
    assert named, f"section {number}'s heading names no seed: {heading}"
    lines = seeds[named.group(1)]
    bad = [(cite, n) for cite, n in cited_lines(text)
           if not 1 <= n <= len(lines) or not lines[n - 1].strip()]
    assert not bad, f"seed {named.group(1)}: blank or missing lines cited {bad}"


# "seed 004 line 308", "Seed 002's lines 1094 and 1121", "seed 004 (SCAFFOLD), lines 328-329"
CODE_CITATION = re.compile(rf"[Ss]eed (\d{{3}})(?:'s)?,? [^.\n]{{0,25}}?\blines? ({NUMBERS})")
# a file that says which seed its bare "line N"s are: "shared/seeds/002_ca229c69b5271fde.txt",
# or by the glob the jobs write, "seeds/003_*.txt"
SEED_FILE = re.compile(r"seeds/(\d{3})_(?:[0-9a-f]+|\*)\.txt")
CITING = ("fedray/**/*.py", "jobs/**/*.py", "jobs/**/*.yaml", "partitions/*.yaml",
          "benchmarks/**/*.py", "docs/*.md", "README.md")


def code_citations(text: str, bare: bool = True) -> list[tuple[str, str, int]]:
    """(seed, citation, line) for every seed line the text of a module, job or doc cites:
    "seed N ... line(s) K" anywhere, and, with ``bare`` (code and jobs, not the docs, whose
    sections cite several seeds), every bare "line(s) K" in a file that names exactly one
    seed file (its lines are that seed's)."""
    out = []
    for m in CODE_CITATION.finditer(text):
        out += [(m.group(1), m.group(0), n) for _, n in cited_lines(f"line {m.group(2)}")]
    named = set(SEED_FILE.findall(text))
    if bare and len(named) == 1:
        seed = named.pop()
        out += [(seed, cite, n) for cite, n in cited_lines(text.replace("\n", " "))]
    return out


def test_seed_lines_cited_in_code_jobs_and_docs_are_not_blank(seeds):
    bad = []
    for pattern in CITING:
        for path in sorted(ROOT.glob(pattern)):
            for seed, cite, n in code_citations(path.read_text(), path.suffix != ".md"):
                lines = seeds.get(seed)
                if lines is not None and not (1 <= n <= len(lines) and lines[n - 1].strip()):
                    bad.append(f"{path.relative_to(ROOT)}: seed {seed} {cite!r} -> line {n}")
    assert not bad, "blank or missing seed lines cited:\n" + "\n".join(bad)


def test_code_citations_are_found():
    """The scan is not vacuous: each form of citation is read, with its seed."""
    assert [(s, n) for s, _, n in code_citations("seed 004 line 308; Seed 002's lines "
                                                 "1094 and 1121")] == [
        ("004", 308), ("002", 1094), ("002", 1121)]
    assert [(s, n) for s, _, n in code_citations(
        "a line of shared/seeds/002_ca229c69b5271fde.txt\n(eq. 7, lines 169-\n170)")] == [
        ("002", 169), ("002", 170)]
