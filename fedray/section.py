"""A config section once the job is resolved: an immutable typed object.

Every section of the job's schema (fedray.config) is a dataclass deriving from ``Section``.
While a job is loaded, omegaconf checks keys and types against those dataclasses; once it
is resolved and validated, ``fedray.config.typed`` makes read-only instances of them and
each subsystem receives its own section (``typed(cfg).sampling``: a SamplingConfig), not
the whole config, so a module's signature says which keys it reads. A module of its own,
below fedray.config, so that what reads a section (the algorithm registry reads the
algorithm section's part sections) need not import the loader and its validation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from omegaconf import OmegaConf


class FrozenMap(Mapping):
    """A read-only mapping: an open section's keys (``algorithm.<section>``) and a dict-valued
    key (``model.args``) in a typed config. Picklable, so a section travels to Ray actors."""

    __slots__ = ("_items",)

    def __init__(self, items: Any = ()) -> None:
        object.__setattr__(self, "_items", dict(items))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"

    def __reduce__(self) -> tuple:
        return FrozenMap, (self._items,)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a config section is read-only")


class Section:
    """The base of every schema dataclass (the module docstring says why). In a typed
    section lists are tuples and dicts FrozenMaps, and assigning to a field raises."""

    # the keys of an open section beyond its fields (FedrayConfig.OPEN_SECTIONS):
    # algorithm.<part section>, adversary.<attack section>; empty for the others
    sections: ClassVar[Mapping[str, Any]] = FrozenMap()

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_typed", False):
            raise dataclasses.FrozenInstanceError(
                f"config section {type(self).__name__} is read-only (cannot set {name!r})")
        object.__setattr__(self, name, value)


def frozen(value: Any) -> Any:
    """A config value made immutable (lists as tuples, dicts as FrozenMaps), so that a
    section handed to a subsystem cannot be changed under the others that share it."""
    if isinstance(value, dict):
        return FrozenMap({k: frozen(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(frozen(v) for v in value)
    return value


def thawed(value: Any) -> Any:
    """``frozen`` undone: the plain lists and dicts a value had in the resolved config, for
    what takes them as such (a user's model's keyword arguments, omegaconf's merge)."""
    if isinstance(value, Mapping):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thawed(v) for v in value]
    if dataclasses.is_dataclass(value):
        return section_tree(value)
    return value


def section_tree(section: Any) -> dict[str, Any]:
    """A typed section as plain containers (lists, dicts), its open keys after its fields:
    the tree the section was made from, for what reads a section as a whole (the registry
    reads the algorithm section's part sections this way)."""
    out = {f.name: thawed(getattr(section, f.name)) for f in dataclasses.fields(section)}
    out.update({k: thawed(v) for k, v in getattr(section, "sections", {}).items()})
    return out


def plain(section: Any) -> dict[str, Any]:
    """A section as a plain dict, whatever it arrives as: typed (what the driver holds), an
    omegaconf node (a job while it is checked), or a mapping (a recorded config, a test).
    What reads a section's keys by name (the registry, the adversary, the per-round and
    per-client transforms) reads them from this one form."""
    if isinstance(section, Section):
        return section_tree(section)
    if OmegaConf.is_config(section):
        return OmegaConf.to_container(section, resolve=True)  # type: ignore[return-value]
    return dict(section or {})
