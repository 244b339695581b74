"""Every backend adapter implements the backend protocol with the protocol's own signatures:
each method the protocol declares, with the same parameters (names, kinds, defaults) and the
same types, and the attributes it declares. A runtime ``isinstance`` on a Protocol checks member
names only; this compares signatures, and mypy (which also checks tests) checks the
assignments at the bottom structurally."""

from __future__ import annotations

import collections.abc
import inspect
import typing
from datetime import UTC, datetime
from typing import Any

import pytest

from backends.base import Backend, LogReader
from backends.k8s import K8sBackend
from backends.sim import LiveSimBackend, SimBackend, SimClock, SimPoolSpec
from backends.slurm import SlurmBackend
from broker.control.gate import GatedBackend, UnavailableBackend
from tests.harness.slurm_fakes import FakeTransport, make

ADAPTERS: list[type[Any]] = [SimBackend, LiveSimBackend, SlurmBackend, K8sBackend, GatedBackend,
                             UnavailableBackend]
READERS: list[type[Any]] = [SimBackend, SlurmBackend, K8sBackend]


def _methods(protocol: type[Any]) -> list[str]:
    return sorted(n for n, v in vars(protocol).items()
                  if callable(v) and not n.startswith("_"))


def _shape(cls: type[Any], name: str) -> tuple[list[tuple[str, Any, Any, Any]], Any]:
    fn = getattr(cls, name)
    hints = typing.get_type_hints(fn)
    params = [(p.name, p.kind, p.default, hints.get(p.name))
              for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    return params, hints.get("return")


def _narrows(returns: Any, declared: Any) -> bool:
    """The same return type, or one member of the protocol's union (an adapter may promise
    more: Slurm renders a script, never manifests), or a list where the protocol declares a
    Sequence of the same items (Slurm's observe builds a list, the simulator's does not)."""
    if (typing.get_origin(declared) is collections.abc.Sequence
            and typing.get_origin(returns) is list):
        return typing.get_args(returns) == typing.get_args(declared)
    return bool(returns == declared or returns in typing.get_args(declared))


def _differences(protocol: type[Any], cls: type[Any]) -> list[str]:
    out = []
    for name in _methods(protocol):
        if not callable(getattr(cls, name, None)):
            out.append(f"{cls.__name__} has no method {name}")
            continue
        (params, returns), (want, declared) = _shape(cls, name), _shape(protocol, name)
        if params != want or not _narrows(returns, declared):
            out.append(f"{cls.__name__}.{name}{_shape(cls, name)} != "
                       f"{protocol.__name__}.{name}{_shape(protocol, name)}")
    return out


def test_the_protocol_declares_the_calls_the_control_loop_makes() -> None:
    assert {"inventory", "submit", "lookup", "cancel", "observe"} <= set(_methods(Backend))
    assert set(typing.get_type_hints(Backend)) >= {"name", "kind"}


@pytest.mark.parametrize("cls", ADAPTERS, ids=lambda c: c.__name__)
def test_adapter_methods_have_the_protocol_signatures(cls: type[Any]) -> None:
    assert _differences(Backend, cls) == []


@pytest.mark.parametrize("cls", READERS, ids=lambda c: c.__name__)
def test_log_readers_have_the_protocol_signature(cls: type[Any]) -> None:
    assert _differences(LogReader, cls) == []


def test_a_signature_that_drifts_is_seen() -> None:
    class Drifted:
        def inventory(self) -> None: ...
        def submit(self, req: object) -> None: ...  # renamed parameter, other types
        def lookup(self, name: str) -> str:  # not a Fact or None
            return name
        def cancel(self, name: str, grace_seconds: int = 30) -> None: ...  # default added

    found = " ".join(_differences(Backend, Drifted))
    for word in ("Drifted.inventory", "Drifted.submit", "Drifted.lookup", "Drifted.cancel",
                 "no method observe"):
        assert word in found


def _sim() -> SimBackend:
    return SimBackend("sim-a", "slurm", [SimPoolSpec("p1", "h100")],
                      SimClock(datetime(2025, 1, 1, tzinfo=UTC)))


@pytest.mark.parametrize("backend", [_sim(), make(FakeTransport())],
                         ids=["sim", "slurm"])
def test_adapters_carry_the_declared_attributes(backend: Backend) -> None:
    hints = typing.get_type_hints(Backend)
    for attr in ("name", "kind"):
        assert isinstance(getattr(backend, attr), hints[attr]), attr


# checked by mypy: each adapter is structurally a Backend (and a LogReader where it reads logs)
_SIM: Backend = _sim()
_SLURM: Backend = make(FakeTransport())
_SIM_LOGS: LogReader = _sim()
