"""How a gang is asked of Slurm: one rule for the batch script, the slurmrestd body and srun.

Every replica is one Slurm task (one rank) with its own GPUs. The placement lists one node per
replica (``("n1", "n1")`` for 2 x 4 GPUs packed on one node); ``gang_shape`` turns that into
Slurm's request:

| placement                         | request                                               |
|-----------------------------------|-------------------------------------------------------|
| k replicas on each of N nodes     | ``--nodes=N --ntasks=R --ntasks-per-node=k`` and k*G  |
| (1x8; 2x4, 4x2 on one node; 2x8)  | GPUs per node (``--gres=gpu:T:kG`` or                 |
|                                   | ``--gpus-per-node=T:kG``), ``--nodelist`` the nodes   |
| mixed (3x4 as n1, n1, n2)         | ``--nodes=N --ntasks=R --gpus-per-task=T:G`` on the   |
|                                   | named nodes; Slurm splits the tasks among them by     |
|                                   | their free GPUs                                       |
| no nodes (waits in Slurm's queue) | ``--ntasks=R --gpus-per-task=T:G``; ``--nodes=1``     |
|                                   | (k = R on it) when the gang must stay in one node     |

Memory follows the same split: per node (k x the replica's) when the layout is uniform, else
per GPU (``--mem-per-gpu``), which scales with the replicas a node gets.

Seen on Slurm 22.05 (the local cluster): ``--distribution=arbitrary`` with a hostfile on sbatch
picks the nodes but not the GPUs per node (its step then failed with "Insufficient GRES"), so a
mixed layout is left to Slurm within the named nodes; a node with room for fewer replicas gets
fewer. A typed ``--gpus-per-task=a100:4`` does not bind GPUs to tasks by itself (the tasks saw
an empty CUDA_VISIBLE_DEVICES), so srun always binds with ``--gpu-bind=per_task:G``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from backends.base import Unsupported


@dataclass(frozen=True, slots=True)
class GangShape:
    replicas: int
    """Tasks: one per replica, each one rank."""
    gpus_per_replica: int
    nodes: int | None
    """Exact node count; None: as many as Slurm needs."""
    tasks_per_node: int | None
    """k replicas on every node (uniform layouts); None: GPUs are asked per task."""
    nodelist: tuple[str, ...] = ()
    """The distinct nodes the placement named, in its order."""

    @property
    def per_task(self) -> bool:
        """GPUs (and memory) are asked per task, not per node."""
        return self.tasks_per_node is None

    @property
    def gpus_per_node(self) -> int:
        """GPUs on every node of a uniform layout; 0 when asked per task."""
        return 0 if self.tasks_per_node is None else self.tasks_per_node * self.gpus_per_replica

    def memory(self, mb_per_replica: int) -> tuple[int | None, int | None]:
        """(MiB per node, MiB per GPU): exactly one is set."""
        if self.tasks_per_node is not None:
            return mb_per_replica * self.tasks_per_node, None
        return None, -(-mb_per_replica // self.gpus_per_replica)

    def srun_options(self) -> list[str]:
        """srun starts one task per replica in the same layout, each bound to its own GPUs."""
        opts = [f"--ntasks={self.replicas}"]
        if self.nodes is not None:
            opts.append(f"--nodes={self.nodes}")
        if self.tasks_per_node is not None:
            opts.append(f"--ntasks-per-node={self.tasks_per_node}")
        opts.append(f"--gpu-bind=per_task:{self.gpus_per_replica}")
        return opts


def gang_shape(replicas: int, gpus_per_replica: int, nodes: Sequence[str] = (), *,
               one_node: bool = False) -> GangShape:
    """The request for ``replicas`` x ``gpus_per_replica`` GPUs on the placement's ``nodes``
    (one entry per replica, or none); ``one_node``: the gang must stay inside one node."""
    if replicas < 1 or gpus_per_replica < 1:
        raise Unsupported(f"a gang of {replicas} x {gpus_per_replica} GPUs cannot be asked for")
    if not nodes:
        if one_node or replicas == 1:
            return GangShape(replicas, gpus_per_replica, 1, replicas)
        return GangShape(replicas, gpus_per_replica, None, None)
    if len(nodes) != replicas:
        raise Unsupported(f"placement names {len(nodes)} node(s) for a gang of {replicas}")
    counts = Counter(nodes)
    distinct = tuple(counts)  # first-seen order
    if one_node and len(distinct) > 1:
        raise Unsupported(f"placement spreads a one-node gang over {len(distinct)} nodes")
    per_node = set(counts.values())
    k = per_node.pop() if len(per_node) == 1 else None
    return GangShape(replicas, gpus_per_replica, len(distinct), k, distinct)
