"""Docs and job files stay true to the code."""

import pathlib
import re

import pytest
from omegaconf import OmegaConf

from fedray.api import prepare
from fedray.cluster.sweep import SweepConfig, check_trials, load_sweep
from fedray.config import load_config
from fedray.errors import FedrayError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _keys(node, prefix=""):
    for k, v in node.items():
        if isinstance(v, dict) and v:  # an empty mapping (sweep parameters) is one key
            yield from _keys(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_config_doc_lists_every_key_and_no_other():
    doc = (ROOT / "docs" / "config.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", doc, flags=re.M))
    actual = set(_keys(OmegaConf.to_container(load_config())))
    assert documented == actual


def test_config_doc_gives_every_key_its_real_default():
    """The default column of docs/config.md is the schema's default, value for value (a
    check of the key's name alone let a documented default drift from the code)."""
    import yaml

    doc = (ROOT / "docs" / "config.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9_.]+)` \| `([^`]*)` \|", doc, flags=re.M)
    assert len(rows) == len(re.findall(r"^\| `[a-z0-9_.]+` \|", doc, flags=re.M))
    cfg = OmegaConf.to_container(load_config())
    for key, text in rows:
        if key == "output.dir":  # null: a fresh runs/<name>-<time>, filled in at load
            assert text == "null"
            continue
        value = cfg
        for part in key.split("."):
            value = value[part]
        documented = yaml.safe_load(text)
        if isinstance(documented, str) and isinstance(value, float):
            documented = float(documented)  # YAML 1.1 reads 2.5e6 as a string
        assert documented == value and type(documented) is not bool or value is documented, (
            key, text, value)


SWEEPS = sorted((ROOT / "jobs" / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("job", sorted(set((ROOT / "jobs").glob("**/*.yaml")) - set(SWEEPS)),
                         ids=lambda p: p.name)
def test_every_job_file_validates(job):
    if load_config(job).data.partition != "synthetic":  # a store built by a recipe first:
        with pytest.raises(FedrayError, match="no partition store"):  # named when missing
            prepare(job, ["data.partition=/nonexistent/store"])
        job = load_config(job, ["data.partition=synthetic", "data.synthetic.num_clients=1000"])
    prepare(job)


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_file_validates(sweep):
    """Checked the same way whether or not this checkout has built the job's store (a local
    stores/ once hid from the suite that a clean clone has none): the missing store is named,
    then every trial validates on synthetic data of the same job."""
    sweep_cfg, job = load_sweep(str(sweep))
    if job.data.partition != "synthetic":
        with pytest.raises(FedrayError, match="no partition store"):
            check_trials(*load_sweep(str(sweep), ["job.data.partition=/nonexistent/store"]))
        sweep_cfg, job = load_sweep(str(sweep), ["job.data.partition=synthetic",
                                                 "job.data.synthetic.num_clients=1000"])
    assert check_trials(sweep_cfg, job) >= 1


def test_cluster_doc_lists_every_sweep_key_and_no_other():
    doc = (ROOT / "docs" / "cluster.md").read_text()
    doc = doc[doc.index("## 3. Sweeps"):doc.index("## 4. Logging")]
    documented = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", doc, flags=re.M))
    actual = set(_keys(OmegaConf.to_container(OmegaConf.structured(SweepConfig))))
    assert documented == actual


def test_readme_commands_exist_in_makefile():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", readme, flags=re.M):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def _marked_table(doc: str, mark: str) -> list[list[str]]:
    """The rows (cells) of the table right after ``<!-- readme: MARK ...-->`` in ``doc``."""
    at = doc.index(f"<!-- readme: {mark} ")
    lines = doc[at:].splitlines()[2:]  # past the marker and the header
    rows = []
    for line in lines[1:]:  # past the |---| line
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def _ratio(cell: str) -> str:
    """A bold ratio as the table writes it (``**3.88x**`` -> "3.88", ``**47x**`` -> "47")."""
    return re.search(r"\*\*([0-9.]+)x\*\*", cell)[1]


def _span(values: list[str]) -> str:
    """The README's way of giving a range of table ratios: one decimal where the table has
    decimals (3.88 -> 3.9), whole numbers where it has none."""
    nums = sorted(values, key=float)
    def fmt(v): return f"{float(v):.1f}" if "." in v else v  # noqa: E704
    lo, hi = fmt(nums[0]), fmt(nums[-1])
    return f"{lo}x" if lo == hi else f"{lo}–{hi}x"


def test_readme_speed_ups_are_the_current_tables():
    """The README's speed-ups are the marked (latest) tables' figures, per model: a new
    measurement that moves the table without the README fails here (issue 39: the README
    once quoted the oldest table)."""
    doc = (ROOT / "docs" / "performance.md").read_text()
    readme = " ".join((ROOT / "README.md").read_text().split())
    raw = _marked_table(doc, "raw loop")
    flower = _marked_table(doc, "Flower")
    assert len(raw) >= 3 and len(flower) >= 3

    def of(rows, model, col):
        return [_ratio(r[col]) for r in rows if r[0].startswith(model)]

    claims = {
        "raw loop, logistic regression": (_span(of(raw, "logistic regression", 4)),
                                          "as a plain single-process PyTorch loop on "
                                          "logistic regression"),
        "raw loop, MLP": (_span(of(raw, "MLP", 4)), "on a small MLP"),
        "raw loop, CNN": (_span(of(raw, "LEAF CNN", 4)), "on the LEAF CNN"),
        "Flower, logreg and MLP": (_span(of(flower, "logistic regression", 4)
                                         + of(flower, "MLP", 4)),
                                   "as many updates per second on logistic regression and a "
                                   "small MLP"),
        "Flower, CNN": (_span(of(flower, "LEAF CNN", 4)), "as many on the LEAF CNN"),
    }
    for what, (span, phrase) in claims.items():
        assert re.search(re.escape(span) + r"[^.]{0,120}?" + re.escape(phrase), readme), \
            f"README: {what} should read {span}"


def test_run_help_names_every_file_of_the_run_directory():
    """``fedray run --help`` lists the files the README says a run directory holds."""
    from fedray.cli import RUN_HELP

    readme = (ROOT / "README.md").read_text()
    part = readme[readme.index("Each run directory"):readme.index("The algorithms, their")]
    files = re.findall(r"^- `([^`]+)`", part, flags=re.M)
    assert len(files) >= 8
    text = " ".join(RUN_HELP.split())
    for name in files:
        assert name.rstrip("/") in text, name


def test_api_doc_says_model_loss_applies_to_model_fn():
    doc = (ROOT / "docs" / "api.md").read_text()
    row = next(ln for ln in doc.splitlines() if ln.startswith("| `model_fn` |"))
    assert "model.loss" in row and "the loss is cross-entropy" not in row


def test_every_preset_and_part_parameter_is_documented():
    """Every registered preset is in docs/config.md's `algorithm.name` row and in
    docs/algorithms.md's presets table, and every hyper-parameter of every registered part
    has its row (`algorithm.<section>.<field>`) in config.md, and a client part's or an
    aggregator's is also named in algorithms.md, so a new family cannot land with
    undocumented keys."""
    import dataclasses

    from fedray.algorithms import registry

    registry.load_builtins()
    config = (ROOT / "docs" / "config.md").read_text()
    algorithms = (ROOT / "docs" / "algorithms.md").read_text()
    # the stages' keys are described in privacy.md and algorithms.md by their YAML, in
    # config.md by their full name
    described = {"client": algorithms, "aggregator": algorithms, "stage": config,
                 "selector": algorithms}
    name_row = next(line for line in config.splitlines() if line.startswith("| `algorithm.name`"))
    presets = algorithms[algorithms.index("## Presets"):algorithms.index("## The families")]
    for preset in registry.PRESETS:
        assert f"`{preset}`" in name_row, preset
        assert f"`{preset}`" in presets, preset
    for kind in ("client", "aggregator", "server_opt", "stage", "selector"):
        for cls in registry.registered(kind).values():
            if cls.section is None or cls.Params is None or kind == "server_opt":
                continue  # the server optimizers' keys are the server section's
            for f in dataclasses.fields(cls.Params):
                key = f"algorithm.{cls.section}.{f.name}"
                assert f"`{key}`" in config, (cls.name, key)
                assert key in described[kind], (cls.name, key)
    # the attacks' keys: config.md's adversary sections, and robustness.md names each
    robustness = (ROOT / "docs" / "robustness.md").read_text()
    for cls in registry.registered("attack").values():
        assert f"`{cls.name}`" in robustness, cls.name
        for f in dataclasses.fields(cls.Params):
            key = f"adversary.{cls.section}.{f.name}"
            assert f"`{key}`" in config, (cls.name, key)


def test_datasets_doc_covers_every_source_partitioner_recipe_and_model():
    """docs/datasets.md is where a researcher looks for a data set: every source, every
    partitioner and every recipe the code has is in it, and every recipe, job and model it
    names exists (a job named with a trailing ``/*`` is a folder of jobs)."""
    from fedray import bundled
    from fedray.core.models import MODELS
    from fedray.data.partitioners import PARTITIONERS
    from fedray.data.sources.loaders import SOURCE_OPTIONS

    text = (ROOT / "docs" / "datasets.md").read_text(encoding="utf-8")
    sources_table, partitioners_table = text.split("## Partitioners")
    rows = [r for r in sources_table.splitlines() if r.startswith("| ") and "(`" in r]
    named = {m for r in rows for m in re.findall(r"\(`(\w+)`", r.split(" | ")[0])}
    assert named == set(SOURCE_OPTIONS)
    listed = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", partitioners_table, re.M)}
    assert listed == set(PARTITIONERS)
    recipes = {b.name for b in bundled.listing("partitions")}
    jobs = {b.name for b in bundled.listing("jobs")}
    recipe_cells = [r.split(" | ")[6] for r in rows] + \
        [r.split(" | ")[3] for r in partitioners_table.splitlines() if r.startswith("| `")]
    cited_recipes = {m for cell in recipe_cells for m in re.findall(r"`([\w/*]+)`", cell)}
    for name in cited_recipes:
        pattern = re.compile(name.replace("*", r"\w+") + "$")
        assert any(pattern.match(r) for r in recipes), f"recipe {name} does not exist"
    assert recipes <= {r for r in recipes if any(re.match(n.replace("*", r"\w+") + "$", r)
                                                  for n in cited_recipes)}, \
        "a bundled recipe is missing from docs/datasets.md"
    for cell in (r.split(" | ")[7] for r in rows):
        for name in re.findall(r"`([\w/*]+)`", cell):
            if name.endswith("/*"):
                assert any(j.startswith(name[:-1]) for j in jobs), f"no jobs in {name}"
            else:
                assert name in jobs, f"job {name} does not exist"
    for cell in (r.split(" | ")[5] for r in rows):
        for name in re.findall(r"`(\w+)`", cell):
            assert name in MODELS or name == "multi_label_bce", f"model {name} does not exist"
