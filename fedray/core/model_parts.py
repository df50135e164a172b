"""Named parts of a model: which parameters are its head, its body, its normalization layers.

Personalized FL splits a model: FedPer and FedRep keep the head (the last layers) with the
client and share the body, LG-FedAvg the other way round, FedBN keeps the normalization
layers. A client part names what stays local, or what trains in a phase, by parameter-name
prefixes (``ClientWork.local``, ``Phase.trainable``); a selector lets it name a *role*
instead, resolved against whatever model the job trains:

``@head``  the model's head: the prefixes in its ``fedray_head`` attribute (a tuple of
           parameter-name prefixes, or a method returning one) when it has one, else the
           last module (in registration order) that holds parameters of its own -- the
           output layer of every network in the zoo but ``logreg``, whose one layer would
           leave no body: its head is its bias (the per-class offsets), its body the weights.
``@body``  every parameter (and buffer) that is not the head.
``@norm``  the normalization layers: the prefixes in the model's ``fedray_norm`` attribute
           when it has one, else every BatchNorm, GroupNorm, LayerNorm and InstanceNorm
           module -- their affine parameters and their running statistics.
``!X``     everything but X (a prefix or a selector): LG-FedAvg's local part is
           ``!@head``, or ``!3.`` for a head given as the prefix ``3.``.

A spec is a tuple of such entries: the names it selects are those matching any positive
entry (every name, when it has none) and no ``!`` entry. Plain prefixes mean what they
always have (``"3."``, ``"classifier.3.weight"``, ``"bn1"``), so a spec without selectors
selects exactly as before. Resolved by ``fedray.core.flat_model.FlatModel`` (``positions``,
``trainable``), the one place every part's prefixes reach a model: on the driver (its
template) and on every worker alike, so both sides agree on the same flat positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from torch import nn

SELECTORS = ("@head", "@body", "@norm")
NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def _attr(module: nn.Module, name: str) -> tuple[str, ...] | None:
    value = getattr(module, name, None)
    if value is None:
        return None
    if callable(value):
        value = value()
    if isinstance(value, str):
        value = (value,)
    return tuple(str(v) for v in value)


def _own_modules(module: nn.Module) -> list[str]:
    """The qualified names (with a trailing dot) of the modules that hold parameters of
    their own, in registration order."""
    return [f"{name}." if name else "" for name, m in module.named_modules()
            if any(True for _ in m.parameters(recurse=False))]


def head_prefixes(module: nn.Module) -> tuple[str, ...]:
    """The model's head (``@head``), as parameter-name prefixes."""
    own = _attr(module, "fedray_head")
    if own is not None:
        return own
    owners = _own_modules(module)
    if not owners:
        return ()
    if len(owners) == 1 and len(list(module.parameters())) > 1:  # one layer: logreg
        names = [n for n, _ in module.named_parameters()]
        if any(n.endswith("bias") for n in names):
            return tuple(n for n in names if n.endswith("bias"))
    return (owners[-1],)


def norm_prefixes(module: nn.Module) -> tuple[str, ...]:
    """The model's normalization layers (``@norm``), as prefixes."""
    own = _attr(module, "fedray_norm")
    if own is not None:
        return own
    return tuple(f"{name}." for name, m in module.named_modules()
                 if name and isinstance(m, NORM_TYPES))


def _matches(name: str, entry: str, module: nn.Module, cache: dict[str, tuple[str, ...]]
             ) -> bool:
    if entry.startswith("@"):
        if entry not in SELECTORS:
            raise ValueError(f"unknown selector {entry!r} (selectors: {', '.join(SELECTORS)})")
        if entry not in cache:
            cache[entry] = norm_prefixes(module) if entry == "@norm" else head_prefixes(module)
        hit = bool(cache[entry]) and name.startswith(cache[entry])
        return not hit if entry == "@body" else hit
    return name.startswith(entry)


def select(module: nn.Module, names: Iterable[str], spec: Sequence[str]) -> list[bool]:
    """Per name (parameters' and buffers' qualified names, in the caller's order), whether
    ``spec`` selects it (see the module docstring)."""
    spec = tuple(spec)
    plain = all(not e.startswith(("@", "!")) for e in spec)
    if plain:  # the common case, as prefixes always were
        return [n.startswith(spec) for n in names]
    positive = [e for e in spec if not e.startswith("!")]
    negative = [e[1:] for e in spec if e.startswith("!")]
    cache: dict[str, tuple[str, ...]] = {}
    out = []
    for n in names:
        hit = not positive or any(_matches(n, e, module, cache) for e in positive)
        out.append(hit and not any(_matches(n, e, module, cache) for e in negative))
    return out


def describe(module: nn.Module) -> dict[str, tuple[str, ...]]:
    """The model's head and normalization prefixes, as errors and docs name them."""
    return {"@head": head_prefixes(module), "@norm": norm_prefixes(module)}
