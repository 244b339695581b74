"""isthmus.yaml -> backend adapters, one translation per kind: a `backends[]` entry's settings
become the adapter's own settings type, and the pools that name the backend become its pool
bindings. The adapter packages know neither `broker.config` nor each other; each kind's
package is imported only when a backend of that kind is configured.

Every kind, the simulator included, is built by `build_adapter` and checked by
`adapter_problems`: a file the check passes is one the factory builds."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from backends.base import Backend, SettingsError, Unsupported
from broker.config import Backend as BackendConfig
from broker.config import IsthmusConfig, Pool
from broker.domain.spec import BackendKind

if TYPE_CHECKING:
    from backends.k8s.adapter import K8sBackend
    from backends.sim.live import LiveSimBackend
    from backends.slurm.adapter import SlurmBackend
    from backends.slurm.transport import Transport

Problems = list[tuple[str, str]]
"""(path from the top of isthmus.yaml, message), e.g. (`pools[2].partition`, `...`)."""

_NEEDS_SELECTOR = "a Kubernetes pool needs a node selector (e.g. {isthmus.io/pool: h100})"
_NEEDS_SHAPE = ("a simulated pool needs its shape "
                "(e.g. {nodes: 4, gpus_per_node: 8, nodes_per_rack: 2})")


def _settings(parse: Callable[[Any], Any], backend: BackendConfig) -> Any:
    try:
        return parse(dict(backend.settings))
    except (TypeError, ValueError) as exc:
        raise Unsupported(f"backends[{backend.name}].settings: {exc}") from None


def _mine(backend: BackendConfig, pools: Sequence[Pool]) -> list[Pool]:
    return [p for p in pools if p.backend == backend.name]


def slurm_adapter(backend: BackendConfig, pools: Sequence[Pool] = (),
                  transport: Transport | None = None) -> SlurmBackend:
    """A `kind: slurm` entry and its pools (each with a `partition`) -> SlurmBackend."""
    from backends.slurm import SlurmBackend, SlurmPoolBinding, SlurmSettings, make_transport

    settings = _settings(SlurmSettings.from_dict, backend)
    bindings = []
    for pool in _mine(backend, pools):
        if not pool.partition:
            raise Unsupported(f"pools[{pool.name}].partition: a Slurm pool needs a partition")
        bindings.append(SlurmPoolBinding(
            name=pool.name, partition=pool.partition, flavor=pool.flavor,
            cost_weight=pool.cost_weight, shared=pool.shared, drained=pool.drained))
    return SlurmBackend(backend.name, bindings, settings, transport or make_transport(settings))


def k8s_adapter(backend: BackendConfig, pools: Sequence[Pool] = (),
                api_client: Any | None = None) -> K8sBackend:
    """A `kind: k8s` entry and its pools (each with a `node_selector`) -> K8sBackend."""
    from backends.k8s import K8sBackend, K8sPoolBinding, K8sSettings

    settings = _settings(K8sSettings.from_dict, backend)
    bindings = []
    for pool in _mine(backend, pools):
        if not pool.node_selector:
            raise Unsupported(f"pools[{pool.name}].node_selector: {_NEEDS_SELECTOR}")
        bindings.append(K8sPoolBinding(
            name=pool.name, flavor=pool.flavor, node_selector=dict(pool.node_selector),
            cost_weight=pool.cost_weight, shared=pool.shared, drained=pool.drained))
    unknown = sorted(set(settings.modes) - {b.name for b in bindings})
    if unknown:
        raise Unsupported(f"backends[{backend.name}].settings.modes: no pool(s) {unknown} "
                          "on this backend")
    return K8sBackend(backend.name, bindings, settings, api_client=api_client)


def sim_adapter(backend: BackendConfig, pools: Sequence[Pool] = ()) -> LiveSimBackend:
    """A `kind: sim` entry and its pools (each with a `capacity`) -> LiveSimBackend (wall
    time, `speed` x faster). The wiring sets `progress_url` to the broker's own listener when
    the file leaves it out."""
    from backends.sim import SimPoolSpec, SimSettings, build

    settings = _settings(SimSettings.from_dict, backend)
    specs = []
    for p in _mine(backend, pools):
        cap = p.capacity
        if cap is None:
            raise Unsupported(f"pools[{p.name}].capacity: {_NEEDS_SHAPE}")
        per_rack = cap.nodes_per_rack or cap.nodes
        extras = settings.pools.get(p.name)
        specs.append(SimPoolSpec(
            name=p.name, flavor=p.flavor,
            blocks=-(-cap.nodes // (per_rack * (cap.racks_per_block or 1))),
            racks_per_block=cap.racks_per_block or 1, nodes_per_rack=per_rack,
            gpus_per_node=cap.gpus_per_node, cost_weight=p.cost_weight, shared=p.shared,
            node_count=cap.nodes,
            cpus_per_node=extras.cpus_per_node if extras else 0,
            memory_per_node=extras.memory_per_node if extras else 0,
            runs_images=settings.runs_images,
        ))
    return build(backend.name, specs, settings, settings.progress_url)


_FACTORIES: dict[BackendKind, Callable[[BackendConfig, Sequence[Pool]], Backend]] = {
    BackendKind.SLURM: slurm_adapter,
    BackendKind.K8S: k8s_adapter,
    BackendKind.SIM: sim_adapter,
}


def build_adapter(backend: BackendConfig, pools: Sequence[Pool]) -> Backend:
    """The adapter of any configured kind, built from its entry and the pools that name it."""
    return _FACTORIES[backend.kind](backend, pools)


def _parse_problems(parse: Callable[[Any], Any], b: BackendConfig, index: int
                    ) -> tuple[Any, Problems]:
    where = f"backends[{index}].settings"
    try:
        return parse(dict(b.settings)), []
    except SettingsError as exc:
        return None, [(f"{where}.{key}" if key else where, msg) for key, msg in exc.problems]


def _pool_problems(config: IsthmusConfig, b: BackendConfig,
                   missing: Callable[[Pool], str | None]) -> tuple[set[str], Problems]:
    """The names of `b`'s pools, and each pool that lacks what this kind needs."""
    names: set[str] = set()
    problems: Problems = []
    for j, pool in enumerate(config.pools):
        if pool.backend != b.name:
            continue
        names.add(pool.name)
        field = missing(pool)
        if field is not None:
            problems.append((f"pools[{j}].{field}", _NEED[field]))
    return names, problems


_NEED = {"partition": "a Slurm pool needs a partition", "node_selector": _NEEDS_SELECTOR,
         "capacity": _NEEDS_SHAPE}


def adapter_problems(config: IsthmusConfig, index: int) -> Problems:
    """What `build_adapter` would refuse for `config.backends[index]`, each problem with its
    path. No I/O."""
    b = config.backends[index]
    where = f"backends[{index}].settings"
    if b.kind is BackendKind.SLURM:
        from backends.slurm import SlurmSettings

        _, problems = _parse_problems(SlurmSettings.from_dict, b, index)
        return problems + _pool_problems(
            config, b, lambda p: None if p.partition else "partition")[1]
    if b.kind is BackendKind.K8S:
        from backends.k8s import K8sSettings

        settings, problems = _parse_problems(K8sSettings.from_dict, b, index)
        names, pool_problems = _pool_problems(
            config, b, lambda p: None if p.node_selector else "node_selector")
        named = settings.modes if settings is not None else {}
        return problems + pool_problems + _strangers(f"{where}.modes", named, names)
    from backends.sim import SimSettings

    settings, problems = _parse_problems(SimSettings.from_dict, b, index)
    names, pool_problems = _pool_problems(
        config, b, lambda p: None if p.capacity is not None else "capacity")
    named = settings.pools if settings is not None else {}
    return problems + pool_problems + _strangers(f"{where}.pools", named, names)


def _strangers(where: str, named: Iterable[str], pools: set[str]) -> Problems:
    """Settings keyed by pool that name a pool this backend does not serve."""
    return [(f"{where}.{n}", f"no pool {n} on this backend") for n in sorted(set(named) - pools)]
