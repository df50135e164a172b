"""Naming parts: registered names, import paths, presets and the ``algorithm`` config section.

A job names an algorithm by a preset (``algorithm.name``) and may replace any of its parts:

    algorithm:
      name: fedprox              # a preset: client fedprox, aggregator proportional, server sgd
      server_opt: momentum       # ... with server momentum instead
      fedprox: {mu: 0.01}        # the hyper-parameters of a part, under its section
      stages: [topk]             # update stages every client's update passes through
      topk: {fraction: 0.01}

Each part is a registered name (every module of this package registers its family's parts
and presets when it is imported) or an import path ``module:Class``, where module is a
dotted module name importable from the working directory or a ``.py`` file's path. A user's
part in their own file therefore runs exactly like a built-in one; its module is shipped to
the Ray workers by value (Ray's cloudpickle), so nothing needs installing on them.

This module imports no torch: the families are imported only when a job is resolved.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from fedray.errors import ConfigError, FedrayError, PartError, key_error
from fedray.section import plain

KINDS = ("client", "aggregator", "server_opt", "selector")
_BASES = {"client": "ClientWork", "aggregator": "Aggregator", "server_opt": "ServerOptimizer",
          "stage": "UpdateStage", "attack": "Attack", "selector": "Selector"}
_REGISTRY: dict[str, dict[str, type]] = {k: {} for k in _BASES}
_INTERNAL = {"base", "local_terms", "registry", "reduction"}


@dataclass(frozen=True)
class Algorithm:
    """A preset: its parts by registered name or import path, and the hyper-parameters it
    sets in their sections (``defaults``: section -> {key: value}), which a job's own
    values in those sections override."""

    client: str
    aggregator: str
    server_opt: str = "sgd"
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)
    stages: tuple[str, ...] = ()  # update stages (fedray.algorithms.base.UpdateStage)
    selector: str = "uniform"  # who takes part (fedray.algorithms.base.Selector)


PRESETS: dict[str, Algorithm] = {}

# the flat keys of fedray <= 0.x, before parts had sections: old jobs and old runs' config.yaml
LEGACY_KEYS = {"prox_mu": ("fedprox", "mu"), "scaffold_option": ("scaffold", "option"),
               "elastic_tau": ("elastic", "tau"), "elastic_mu": ("elastic", "mu"),
               "elastic_holdout": ("elastic", "holdout"), "alpha": ("expalpha", "alpha")}
PART_KEYS = ("name", *KINDS, "stages")


def _kind_of(cls: type) -> str:
    # each base class names its kind (part_kind), so the registry needs none of them
    kind = getattr(cls, "part_kind", None) if isinstance(cls, type) else None
    if kind not in _BASES:
        raise TypeError(f"{cls!r} is not a ClientWork, Aggregator, ServerOptimizer, "
                        "UpdateStage, Attack or Selector subclass")
    return kind


def register(cls: type) -> type:
    """Class decorator: name a part in jobs by its ``name`` attribute."""
    kind = _kind_of(cls)
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} needs a name to be registered")
    _REGISTRY[kind][cls.name] = cls
    return cls


def register_preset(name: str, client: str, aggregator: str, server_opt: str = "sgd",
                    defaults: dict[str, dict[str, Any]] | None = None,
                    stages: tuple[str, ...] = (), selector: str = "uniform") -> None:
    """A preset ``algorithm.name`` can select (``defaults``: see ``Algorithm``)."""
    PRESETS[name] = Algorithm(client, aggregator, server_opt, dict(defaults or {}),
                              tuple(stages), selector)


_loaded = False


def load_builtins() -> None:
    """Import every family module of this package: each registers its parts and presets."""
    global _loaded
    if _loaded:
        return
    # this package's modules, found on disk: importing the package itself (fedray.algorithms)
    # would make the registry depend on the package that re-exports it
    for info in sorted(pkgutil.iter_modules([os.path.dirname(__file__)]),
                       key=lambda m: (m.name != "fedavg", m.name)):  # its presets first
        if info.name not in _INTERNAL:
            importlib.import_module(f"{__package__}.{info.name}")
    _loaded = True


def registered(kind: str) -> dict[str, type]:
    load_builtins()
    return dict(_REGISTRY[kind])


def is_import_path(ref: str) -> bool:
    return ":" in ref


def import_object(ref: str, key: str) -> Any:
    """``module:attr`` (a dotted module importable from the working directory, or a .py
    file's path) -> the object; one line naming ``key`` when it cannot be found."""
    module_name, _, attr = ref.rpartition(":")
    if not module_name or not attr:
        raise key_error(key, "an import path must be module:Name", ref)
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = os.path.abspath(module_name)
            if not os.path.isfile(path):
                raise key_error(key, f"no such file: {path}", ref)
            name = "fedray_user_" + os.path.splitext(os.path.basename(path))[0]
            module = sys.modules.get(name)
            if module is None or getattr(module, "__file__", None) != path:
                spec = importlib.util.spec_from_file_location(name, path)
                if spec is None:  # not a Python source file
                    raise key_error(key, f"cannot import {module_name}: not a .py file", ref)
                # its sibling files import as they do for `python dir/file.py`; appended,
                # so that no installed or standard module is shadowed by a user's file
                if os.path.dirname(path) not in sys.path:
                    sys.path.append(os.path.dirname(path))
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:  # not left half-run for the next import to find
                    sys.modules.pop(name, None)
                    raise
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # as `python -m` would: modules beside the job
            module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except Exception as exc:
        raise key_error(key, f"cannot import {module_name}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}", ref) from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise key_error(key, f"module {module_name} has no {attr}", ref) from None
    _ship_by_value(module)
    return obj


def installed(path: str) -> bool:
    """Installed with Python or into it: every process, on every node, imports it by name."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    return ("site-packages" in path or "dist-packages" in path
            or any(path.startswith(r + os.sep) for r in roots))


def sibling_files(path: str) -> list[str]:
    """The ``.py`` files beside a user's module file ``path`` (itself included): what
    travels with a module that is a file rather than a package -- a ``.py`` path, or a
    top-level module such as ``my_models`` -- so that its imports of its neighbours
    (``import helpers``) work wherever it runs. Only that directory's own ``.py`` files,
    not its subdirectories, so what travels stays bounded (the cluster side also caps it:
    fedray.cluster.submit.MAX_MODULES_MB)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return [os.path.abspath(path)]
    return [os.path.join(folder, n) for n in names
            if n.endswith(".py") and not n.startswith(".")
            and os.path.isfile(os.path.join(folder, n))]


def _ship_by_value(module: Any) -> None:
    """A user's module travels to the Ray processes inside the pickled parts and models, so
    neither the driver actor nor the workers (nor a cluster's nodes) need to import it by
    name: its whole top-level package, or, for a module that is a file, every module loaded
    from the ``.py`` files beside it (``sibling_files``: a helper it imports)."""
    name = getattr(module, "__name__", "")
    if name == "fedray" or name.startswith("fedray."):
        return
    if installed(getattr(module, "__file__", "") or ""):
        return
    from ray import cloudpickle  # Ray's own copy is what pickles task arguments

    top = sys.modules.get(name.partition(".")[0], module)
    found = [top]
    if not hasattr(top, "__path__") and getattr(top, "__file__", None):  # a file, no package
        beside = set(sibling_files(top.__file__))
        found += [m for n, m in list(sys.modules.items())
                  if m is not top and "." not in n and n != "fedray"
                  and isinstance(getattr(m, "__file__", None), str)
                  and os.path.abspath(m.__file__) in beside]
    for m in found:
        try:
            cloudpickle.register_pickle_by_value(m)
        except ValueError:  # not in sys.modules under its name (already by value)
            pass


def lookup(kind: str, ref: str, key: str) -> type:
    """The class a job's ``key`` names: registered, or by import path."""
    if is_import_path(ref):
        cls = import_object(ref, key)
        try:
            if _kind_of(cls) != kind:
                raise TypeError
        except TypeError:
            article = "an" if _BASES[kind][0] in "AEIOU" else "a"
            raise key_error(key, f"must name {article} {_BASES[kind]} subclass "
                            f"(fedray.algorithms.base)", ref) from None
        return cls
    table = registered(kind)
    if ref not in table:
        raise key_error(key, f"must be one of: {', '.join(table)} (or an import path "
                        "module:Class)", ref)
    return table[ref]


def preset(name: str) -> Algorithm:
    if is_import_path(name):
        obj = import_object(name, "algorithm.name")
        if not isinstance(obj, Algorithm):
            raise key_error("algorithm.name", "an import path must name a "
                            "fedray.algorithms.Algorithm", name)
        return obj
    load_builtins()
    if name not in PRESETS:
        raise key_error("algorithm.name", f"must be one of: {', '.join(PRESETS)}", name)
    return PRESETS[name]


@dataclass
class Resolved:
    """A job's algorithm: the names (as the job gives them) and the parts, built and checked."""

    names: dict[str, str]  # kind -> registered name or import path
    client: Any  # ClientWork
    aggregator: Any  # Aggregator
    server_opt: Any  # ServerOptimizer
    sections: dict[str, dict]  # algorithm.<section> -> the parts' hyper-parameters
    stages: tuple = ()  # UpdateStage instances, in order
    stage_names: tuple[str, ...] = ()  # as the job (or its preset) names them
    selector: Any = None  # Selector (None only for a Resolved built by hand: uniform)

    @property
    def parts(self) -> tuple:
        """The worker-side parts that add to a partial sum."""
        return (self.client, self.aggregator, *self.stages)


def params_of(cls: type, section_cfg: Any, key: str, part: str = "") -> Any:
    """``cls.Params`` from the job's section (defaults filled, types checked). ``part``:
    how errors name the part (``algorithm.aggregator my_algos:Median``)."""
    import dataclasses

    from omegaconf.errors import OmegaConfBaseException

    if cls.Params is None:
        return None
    if not (isinstance(cls.Params, type) and dataclasses.is_dataclass(cls.Params)):
        what = getattr(cls.Params, "__qualname__", repr(cls.Params))
        raise ConfigError(f"{part or cls.__qualname__}: its Params ({what}) must be a "
                          f"dataclass, whose fields {key} sets")
    if isinstance(section_cfg, dict):
        _check_section(cls.Params, section_cfg, key)
    try:
        node = OmegaConf.structured(cls.Params)
        if section_cfg is not None:
            node = OmegaConf.merge(node, section_cfg)
        return OmegaConf.to_object(node)
    except OmegaConfBaseException as exc:
        sub = getattr(exc, "full_key", None) or getattr(exc, "key", None) or ""
        msg = str(getattr(exc, "msg", None) or exc).splitlines()[0].strip()
        if type(exc).__name__ == "ConfigKeyError":
            from dataclasses import fields

            allowed = ", ".join(f.name for f in fields(cls.Params))
            raise ConfigError(f"unknown config key '{key}.{sub}' (allowed under '{key}': "
                              f"{allowed})") from None
        raise key_error(f"{key}.{sub}" if sub else key, msg) from None


def _optional(hint: Any) -> tuple[Any, bool]:
    """``X | None`` (or ``Optional[X]``) -> (X, True); any other hint -> (hint, False)."""
    import types
    import typing

    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def _check_section(params: type, values: dict, key: str) -> None:
    """A part's section against its Params, where OmegaConf's merge would take a mistake
    silently (a number for a string: ``mode: 5`` read as '5') or word it in its own terms
    (a nested section's unknown key listed against the outer one, a number for a nested
    section, a value for a list): each refused in one line naming ``key.<field>``."""
    import dataclasses
    import typing

    try:
        hints = typing.get_type_hints(params)
    except Exception:  # an annotation that does not resolve: OmegaConf words what it can
        return
    fields = [f.name for f in dataclasses.fields(params)]
    for name, value in values.items():
        where = f"{key}.{name}"
        if name not in fields:
            raise ConfigError(f"unknown config key '{where}' (allowed under '{key}': "
                              f"{', '.join(fields)})")
        hint, optional = _optional(hints.get(name, Any))
        if value is None and optional:
            continue
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                inner = ", ".join(f.name for f in dataclasses.fields(hint))
                raise key_error(where, f"must be a section of keys ({inner})", value)
            _check_section(hint, value, where)
        elif hint is str and isinstance(value, bool | int | float):
            raise key_error(where, "must be a string (quote it)", value)
        elif (hint in (list, tuple) or typing.get_origin(hint) in (list, tuple)) \
                and value is not None and not isinstance(value, list | tuple):
            raise key_error(where, "must be a list", value)


def build(cls: type, params: Any, key: str, server: Any, part: str = "") -> Any:
    """The part, built from its checked ``params``. A user's class that fails otherwise
    than with ParamError (its ``check`` comparing a value it did not expect, say) is named
    in one line, ``part`` as the job names it; fedray's own keep their traceback (a bug)."""
    # imported when used, not at the top: it loads torch (start-up time)
    from fedray.algorithms.base import ParamError

    try:
        if _kind_of(cls) == "server_opt":
            return cls.from_config(server, params)
        return cls(params)
    except ParamError as exc:
        raise key_error(f"{key}.{exc.key}", exc.rule, exc.value) from None
    except FedrayError:
        raise
    except Exception as exc:
        if not part or cls.__module__.partition(".")[0] == "fedray":
            raise

        text = str(exc).strip()
        raise PartError(f"{part}: building it raised {type(exc).__name__}"
                        f"{': ' + text.splitlines()[0] if text else ''}") from exc


def check_plan(aggregator: Any, plan: Any) -> None:
    """The aggregator's ``check_plan`` (the round size its guarantee needs: Krum with
    n <= 2f + 2) against the job's ``RoundPlan``, a ``ParamError`` reported as its config
    key; before Ray starts (fedray.api) and again by the driver."""
    # imported when used, not at the top: it loads torch (start-up time)
    from fedray.algorithms.base import ParamError

    try:
        aggregator.check_plan(plan)
    except ParamError as exc:
        raise key_error(f"algorithm.{aggregator.section or aggregator.name}.{exc.key}",
                        exc.rule, exc.value) from None


def check_against_model(resolved: Resolved, make_model: Any) -> None:
    """Each part's ``check_model`` against the job's model, before anything starts; a
    ``ParamError`` is reported as its part's config key. The model is built only when a
    part has such a check (a model that cannot be built is the driver's to report, with
    the data's shape)."""
    # imported when used, not at the top: it loads torch (start-up time)
    from fedray.algorithms.base import ParamError, Part

    checking = [p for p in resolved.parts if type(p).check_model is not Part.check_model]
    if not checking:
        return
    # imported when used, not at the top: it loads torch (start-up time)
    from fedray.core.flat_model import FlatModel

    try:
        model = FlatModel(make_model())
    except (ValueError, RuntimeError, TypeError):
        return
    for part in checking:
        try:
            part.check_model(model)
        except ParamError as exc:
            raise key_error(f"algorithm.{part.section or part.name}.{exc.key}", exc.rule,
                            exc.value) from None


def resolve(algorithm: Any, server: Any = None, *, notes: list[str] | None = None) -> Resolved:
    """The parts of a job's ``algorithm`` section (and ``server`` section, for the server
    optimizer): the preset, with overrides applied, each part's hyper-parameters read from
    its section and checked. Sections no part uses are an error, except the legacy flat keys
    (``LEGACY_KEYS``), which old jobs and runs carry for every algorithm and which count
    only for a part that uses them (each such use adds a line to ``notes``)."""
    tree = plain(algorithm)
    base = preset(tree.get("name") or "fedavg")
    names = {k: tree.get(k) or getattr(base, k) for k in KINDS}
    classes = {k: lookup(k, names[k], f"algorithm.{k}" if tree.get(k) else "algorithm.name")
               for k in KINDS}
    stage_refs, stage_classes = _stage_classes(tree.get("stages"), base)
    legacy = {k: tree.pop(k) for k in list(tree) if k in LEGACY_KEYS}
    used = {cls.section for cls in (*classes.values(), *stage_classes)
            if getattr(cls, "section", None)}
    for section, values in base.defaults.items():  # the preset's, under the job's own
        own = tree.get(section)
        if section in used and (own is None or isinstance(own, dict)):
            tree[section] = {**values, **(own or {})}
    for k, v in legacy.items():
        section, field_name = LEGACY_KEYS[k]
        if section in used:
            explicit = tree.setdefault(section, {})
            if isinstance(explicit, dict) and field_name not in explicit:
                explicit[field_name] = v
                if notes is not None:
                    notes.append(f"algorithm.{k} is deprecated; it is read as "
                                 f"algorithm.{section}.{field_name}")
    # a built-in stage's section while the stage is off: kept in the job so that a sweep or
    # an override (algorithm.stages=[]) can turn the stage on and off; it has no effect
    idle = {c.section: n for n, c in registered("stage").items() if c.section}
    for k, v in tree.items():
        if k in PART_KEYS:
            continue
        if k not in used and k in idle:
            params_of(registered("stage")[idle[k]], v, f"algorithm.{k}")  # a typo still fails
            if notes is not None:
                notes.append(f"algorithm.{k} is ignored: stage {idle[k]} is not in "
                             "algorithm.stages")
            continue
        if k not in used:
            allowed = ", ".join([*PART_KEYS, *sorted(used)])
            raise ConfigError(f"unknown config key 'algorithm.{k}' (allowed under 'algorithm' "
                              f"for these parts: {allowed})")
        if not isinstance(v, dict):
            raise key_error(f"algorithm.{k}", "must be a section of keys", v)
    built: dict[str, Any] = {}
    sections: dict[str, dict] = {}
    section_params: dict[str, Any] = {}
    for kind, cls in classes.items():
        section = getattr(cls, "section", None)
        key = f"algorithm.{section}" if section else f"algorithm.{kind}"
        if section and section in section_params and \
                type(section_params[section]) is cls.Params:
            params = section_params[section]  # the parts of one family share their section
        else:
            params = params_of(cls, tree.get(section) if section else None, key,
                             f"algorithm.{kind} {names[kind]}")
        built[kind] = build(cls, params, key, server, f"algorithm.{kind} {names[kind]}")
        if section and params is not None:
            section_params[section] = params
            sections[section] = built[kind].describe() if kind != "server_opt" else \
                _asdict(params)
    client, aggregator = built["client"], built["aggregator"]
    stages = []
    for ref, cls in zip(stage_refs, stage_classes, strict=True):
        key = f"algorithm.{cls.section}" if cls.section else "algorithm.stages"
        params = params_of(cls, tree.get(cls.section) if cls.section else None, key,
                         f"algorithm.stages {ref}")
        stages.append(build(cls, params, key, server, f"algorithm.stages {ref}"))
        if cls.section and params is not None:
            sections[cls.section] = stages[-1].describe()
        _check_stage(ref, stages[-1], names, client, aggregator)
    lr = getattr(server, "lr", 1.0)  # the job's server section, a config or a dataclass
    if getattr(aggregator, "plain_server", False) and (names["server_opt"] != "sgd"
                                                       or float(lr) != 1.0):
        key, value = (("algorithm.server_opt", names["server_opt"])
                      if names["server_opt"] != "sgd" else ("server.lr", lr))
        raise key_error(key, f"aggregator {names['aggregator']} averages its other models "
                        "itself, so the global one must move by the plain average too: use "
                        "algorithm.server_opt sgd with server.lr 1", value)
    for need in client.uses_broadcast:
        if need not in aggregator.provides:
            raise key_error("algorithm.aggregator", f"client part {names['client']} needs an "
                            f"aggregator that broadcasts {need} ({_providers(need)})",
                            names["aggregator"])
    for need in getattr(aggregator, "requires_columns", ()):
        if need not in getattr(client, "columns", ()):
            users = ", ".join(n for n, c in registered("client").items()
                              if need in getattr(c, "columns", ())) or "none registered"
            raise key_error("algorithm.client", f"aggregator {names['aggregator']} needs a "
                            f"client part that records each client's {need} ({users})",
                            names["client"])
    for need in getattr(aggregator, "requires_extras", ()):
        if need not in client.extras:
            raise key_error("algorithm.client", f"aggregator {names['aggregator']} needs a "
                            f"client part that sums {need} ({_providers(need, 'client')})",
                            names["client"])
    return Resolved(names=names, client=client, aggregator=aggregator,
                    server_opt=built["server_opt"], sections=sections, stages=tuple(stages),
                    stage_names=tuple(stage_refs), selector=built["selector"])


def _stage_classes(refs: Any, base: Algorithm) -> tuple[list[str], list[type]]:
    """``algorithm.stages`` (or the preset's) as names and classes, checked."""
    key = "algorithm.stages" if refs is not None else "algorithm.name"
    refs = list(base.stages) if refs is None else refs
    if not isinstance(refs, list | tuple) or not all(isinstance(r, str) and r for r in refs):
        raise key_error("algorithm.stages", "must be a list of update stage names or import "
                        "paths, e.g. [dp]", refs)
    refs = list(refs)
    twice = sorted({r for r in refs if refs.count(r) > 1})
    if twice:
        raise key_error("algorithm.stages", f"names {twice[0]} twice", refs)
    return refs, [lookup("stage", r, key) for r in refs]


def _check_stage(ref: str, stage: Any, names: dict[str, str], client: Any,
                 aggregator: Any) -> None:
    """A stage that bounds what each client contributes needs parts that let it."""
    if stage.needs_unit_weights and not aggregator.unit_weights:
        unit = ", ".join(n for n, c in registered("aggregator").items() if c.unit_weights)
        raise key_error("algorithm.aggregator", f"stage {ref} needs an aggregator that adds "
                        f"each client's update as it is, with weight 1 ({unit}); "
                        f"{names['aggregator']} weights or extends what clients add",
                        names["aggregator"])
    if stage.needs_plain_client and (client.extras or client.state):
        raise key_error("algorithm.client", f"stage {ref} needs a client part that adds "
                        f"nothing but its update to the sum; {names['client']} also "
                        f"{'sums ' + ', '.join(client.extras) if client.extras else 'keeps '}"
                        f"{'' if client.extras else ', '.join(client.state)}", names["client"])


def _asdict(params: Any) -> dict:
    import dataclasses

    return dataclasses.asdict(params)


def _providers(need: str, kind: str = "aggregator") -> str:
    attr = "provides" if kind == "aggregator" else "extras"
    names = [n for n, c in registered(kind).items() if need in getattr(c, attr, ())]
    return ", ".join(names) or "none registered"


def canonical(algorithm: Any, server: Any = None, notes: list[str] | None = None,
              client_lr: float | None = None) -> dict:
    """The ``algorithm`` section as a run records it: the part keys as given, legacy keys
    dropped, and a section with every hyper-parameter of each part that has one.
    ``client_lr`` (the job's client.lr) may be 0 only for a client part that allows it."""
    tree = plain(algorithm)
    resolved = resolve(tree, server, notes=notes)
    if client_lr == 0 and not getattr(resolved.client, "allows_zero_lr", False):
        raise key_error("client.lr", f"must be > 0 for client part {resolved.names['client']} "
                        "(0, every gradient at the global model, needs one that allows it, "
                        "e.g. local_update)", client_lr)
    out = {k: tree.get(k) for k in PART_KEYS}
    if out["stages"] is not None:
        out["stages"] = list(resolved.stage_names)
    out.update(resolved.sections)
    return out
