"""Errors that name the algorithm part they come from, as the job named it.

A job composes its algorithm from parts (a client part, an aggregator, update stages, a
server optimizer), any of them a user's class by import path. When one of them fails or
returns what the runtime cannot use, the error must say which one: otherwise the wrong
part is blamed (an aggregator's wrong-length update surfaced as the server optimizer's
shape error), and on Ray the user saw a RayTaskError traceback from another process.

Two mechanisms, both free on the normal path:

* results are checked where a part hands them over (``check_delta``, ``check_update``,
  ``check_sum``): O(1) checks of type, shape and dtype; a non-finite result is looked for
  only once the global model has gone non-finite (the driver's diagnosis);
* an exception escaping a worker or driver entry point (``names_part_errors``) is traced
  back to the outermost frame of a user's part in its traceback, and becomes a one-line
  ``PartError``: ``algorithm.aggregator my_algos:Robust: finish() raised ValueError: ...``.
  fedray's own parts are left alone: their exception is a bug, and keeps its traceback.
  The ``inline`` backend, whose point is debugging in the caller's process (pdb's
  post-mortem in the part's code), keeps the exception as it is and adds the part's name
  to it as a note.
"""

from __future__ import annotations

import functools
import math
import traceback
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from fedray.algorithms.base import LocalUpdate
from fedray.errors import FedrayError, PartError, one_line

KEYS = ("algorithm.client", "algorithm.aggregator")  # then one "algorithm.stages" per stage
STAGES = "algorithm.stages"
SELECTOR = "algorithm.selector"
SERVER_OPT = "algorithm.server_opt"


def label_of(part: Any) -> str:
    """A part's name when the job's own spelling is not at hand: fedray's registered name
    for its own parts, else the class's import path ``module:Qualname``."""
    cls = type(part)
    if _is_fedray(cls) and getattr(cls, "name", ""):
        return cls.name
    return f"{cls.__module__}:{cls.__qualname__}"


def _is_fedray(cls: type) -> bool:
    return cls.__module__.partition(".")[0] == "fedray"


def is_users(part: Any) -> bool:
    """A part whose class is not fedray's own (a user's, or a user's subclass of one)."""
    return not _is_fedray(type(part))


class PartNames:
    """The parts of one process (a worker's copies, or the driver's), each with its config
    key and label: who an error names."""

    def __init__(self, entries: Iterable[tuple[Any, str, str]]):
        self.entries = [(part, key, label) for part, key, label in entries if part is not None]

    @classmethod
    def of(cls, client: Any, aggregator: Any, stages: Iterable[Any] = (),
           labels: Iterable[str] = (), server_opt: Any = None,
           server_label: str | None = None, selector: Any = None,
           selector_label: str | None = None) -> PartNames:
        """``labels``: the job's names of client, aggregator and stages, in that order
        (fewer, or none: the rest from their classes, ``label_of``)."""
        parts = [client, aggregator, *stages]
        given = list(labels)
        keys = [*KEYS, *([STAGES] * (len(parts) - 2))]
        out = [(p, k, given[i] if i < len(given) and given[i] else label_of(p))
               for i, (p, k) in enumerate(zip(parts, keys, strict=True))]
        if server_opt is not None:
            out.append((server_opt, SERVER_OPT, server_label or label_of(server_opt)))
        if selector is not None:
            out.append((selector, SELECTOR, selector_label or label_of(selector)))
        return cls(out)

    def who(self, part: Any) -> str:
        """``algorithm.<kind> <label>``: how a message names ``part``."""
        for p, key, label in self.entries:
            if p is part:
                return f"{key} {label}"
        return f"part {label_of(part)}"

    def _owner(self, frame: Any) -> Any:
        """The part a traceback frame runs a method of: the frame's ``self`` (a method a
        user's class inherits from fedray's base classes counts too), else a function
        defined in the class of a user's part (a static method, say)."""
        me = frame.f_locals.get("self")
        for p, _, _ in self.entries:
            if me is p and is_users(p):
                return p
        code = frame.f_code
        for p, _, _ in self.entries:
            if is_users(p) and any(getattr(getattr(f, "__func__", f), "__code__", None) is code
                                   for c in type(p).__mro__ if not _is_fedray(c)
                                   for f in vars(c).values()):
                return p
        return None

    def error(self, exc: BaseException) -> PartError | None:
        """``exc`` as a one-line PartError naming the user's part it was raised in (the
        outermost frame of one in its traceback: the hook fedray called), with where
        (round, client) when that frame has a ClientContext; None for an exception no
        user's part raised, and for a FedrayError, which is already meant for the user."""
        if isinstance(exc, FedrayError) or not isinstance(exc, Exception):
            return None
        tb, r = exc.__traceback__, None
        while tb is not None:
            part = self._owner(tb.tb_frame)
            if part is not None:
                return PartError(f"{self.who(part)}: {tb.tb_frame.f_code.co_name}() raised "
                                 f"{type(exc).__name__}: {one_line(exc)}"
                                 f"{_where(tb.tb_frame.f_locals, r)}",
                                 "".join(traceback.format_exception(exc)))
            r = _round(tb.tb_frame) or r
            tb = tb.tb_next
        return None


def _round(frame: Any) -> int | None:
    """The round a frame of fedray's runtime works on (the driver's ``r``, a worker's
    task), if it says."""
    if frame.f_globals.get("__name__", "").partition(".")[0] != "fedray":
        return None
    local = frame.f_locals
    for r in (local.get("r"), local.get("round_idx"), getattr(local.get("task"), "round", None)):
        if isinstance(r, int) and not isinstance(r, bool):
            return r
    return None


def _where(local: dict[str, Any], r: int | None) -> str:
    """Where a part's frame was: the round and client of its ClientContext, else the
    round its callers worked on."""
    ctx = local.get("ctx")
    cid, own = getattr(ctx, "cid", None), getattr(ctx, "round", None)
    if isinstance(cid, int) and isinstance(own, int):
        return f" (round {own}, client {cid})"
    return f" (round {r})" if r is not None else ""


F = TypeVar("F", bound=Callable[..., Any])


def names_part_errors(names: Callable[[Any], PartNames | None]) -> Callable[[F], F]:
    """Decorate an entry point of a worker or the driver (a Ray task's method): an
    exception a user's part raised under it leaves as a one-line PartError, or, where
    ``self.one_line_part_errors`` is False (the inline backend), as itself with a note
    naming the part. ``names(self)``: the process's parts (None before they exist)."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                parts = names(self) if not getattr(exc, "_fedray_part_named", False) else None
                named = parts.error(exc) if parts is not None else None
                if named is None:
                    raise
                if getattr(self, "one_line_part_errors", True):
                    raise named from None
                exc._fedray_part_named = True  # once, whatever entry points it crosses
                if hasattr(exc, "add_note"):  # Python >= 3.11
                    exc.add_note(f"fedray: {str(named).split(' raised ', 1)[0]} raised this")
                raise

        return wrapper  # type: ignore[return-value]

    return decorate


# -- results, checked where a part hands them over --------------------------------------


Who = str | Callable[[], str]  # a part's name, or how to make it (only when it is needed)


def _name(who: Who) -> str:
    return who if isinstance(who, str) else who()


def _describe(value: Any) -> str:
    if not isinstance(value, torch.Tensor):
        return f"a {type(value).__name__}, not a tensor"
    return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"


def check_update(who: Who, method: str, update: Any, size: int,
                 what: str = "the round's update") -> torch.Tensor:
    """A round's update as the driver's aggregator (``finish``, ``aggregate``) or the
    server optimizer (``step``, ``what``: the new global weights) returns it: a flat
    float tensor of ``size`` values (one per model parameter and float buffer). Returns it;
    raises a PartError naming ``who``."""
    if (not isinstance(update, torch.Tensor) or update.dim() != 1 or update.numel() != size
            or not update.is_floating_point()):
        raise PartError(f"{_name(who)}: {method} returned {_describe(update)}; {what} "
                        f"must be a flat float tensor of {size} values (one per "
                        "model parameter and float buffer)")
    return update


def check_delta(who: Who, method: str, delta: Any, like: torch.Tensor) -> None:
    """A client's update (``LocalUpdate.delta``) as a client part's ``train`` or a stage's
    ``client_update`` leaves it: flat, the model's size, dtype and device type."""
    if (not isinstance(delta, torch.Tensor) or delta.dim() != 1
            or delta.numel() != like.numel() or delta.dtype != like.dtype
            or delta.device.type != like.device.type):
        dev = f" on {delta.device.type}" if isinstance(delta, torch.Tensor) else ""
        raise PartError(f"{_name(who)}: {method} left a client's update as {_describe(delta)}"
                        f"{dev}; it must be a flat {str(like.dtype).removeprefix('torch.')} "
                        f"tensor of {like.numel()} values on {like.device.type} (one per "
                        "model parameter and float buffer)")


def check_local_update(who: Who, update: Any, like: torch.Tensor) -> None:
    """What a client part's own ``train`` returns: a LocalUpdate with a usable delta."""
    if not isinstance(update, LocalUpdate):
        raise PartError(f"{_name(who)}: train() returned a {type(update).__name__}, not a "
                        "LocalUpdate (fedray.algorithms.base)")
    check_delta(who, "train()", update.delta, like)


def check_sum(who: Who, method: str, total: Any, weight: Any, size: int) -> None:
    """The round's merged sum after a stage's ``finish_sum``: still a flat float64 sum of
    ``size`` values, with a finite weight."""
    ok_total = (isinstance(total, torch.Tensor) and total.dim() == 1
                and total.numel() == size and total.dtype == torch.float64)
    try:
        ok_weight = math.isfinite(float(weight))
    except (TypeError, ValueError):
        ok_weight = False
    if not ok_total:
        raise PartError(f"{_name(who)}: {method} left the round's sum as {_describe(total)}; it "
                        f"must stay a flat float64 tensor of {size} values")
    if not ok_weight:
        raise PartError(f"{_name(who)}: {method} left the round's sum with weight {weight!r}; it "
                        "must be a finite number")


def finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())
