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
    tasks_per_replica: int = 1
    """Slurm tasks (ranks) each replica runs, sharing its GPUs (gang.tasks_per_replica)."""

    @property
    def ntasks(self) -> int:
        """Slurm's --ntasks: every rank of the gang."""
        return self.replicas * self.tasks_per_replica

    @property
    def ntasks_per_node(self) -> int | None:
        """Slurm's --ntasks-per-node of a uniform layout (replicas a node x their tasks)."""
        return None if self.tasks_per_node is None else self.tasks_per_node * self.tasks_per_replica

    @property
    def gpus_per_task(self) -> int | None:
        """Each task's share of its replica's GPUs; None when they do not divide evenly."""
        g, t = self.gpus_per_replica, self.tasks_per_replica
        return g // t if g % t == 0 else None

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
        """srun starts every task in the same layout, each bound to its own GPUs (its share of
        its replica's, when they divide)."""
        opts = [f"--ntasks={self.ntasks}"]
        if self.nodes is not None:
            opts.append(f"--nodes={self.nodes}")
        if self.ntasks_per_node is not None:
            opts.append(f"--ntasks-per-node={self.ntasks_per_node}")
        if self.gpus_per_task is not None:
            opts.append(f"--gpu-bind=per_task:{self.gpus_per_task}")
        return opts


def gang_shape(replicas: int, gpus_per_replica: int, nodes: Sequence[str] = (), *,
               one_node: bool = False, one_per_node: bool = False,
               tasks_per_replica: int = 1) -> GangShape:
    """The request for ``replicas`` x ``gpus_per_replica`` GPUs on the placement's ``nodes``
    (one entry per replica, or none); ``one_node``: the gang must stay inside one node;
    ``one_per_node``: each replica on a node of its own (sbatch -N); ``tasks_per_replica``:
    the Slurm tasks each replica runs."""
    if replicas < 1 or gpus_per_replica < 1 or tasks_per_replica < 1:
        raise Unsupported(f"a gang of {replicas} x {gpus_per_replica} GPUs "
                          f"({tasks_per_replica} tasks each) cannot be asked for")
    t = tasks_per_replica
    if one_per_node and one_node and replicas > 1:
        raise Unsupported(f"{replicas} replicas on a node each cannot stay inside one node")
    if not nodes:
        if one_per_node:  # Slurm places it: a node per replica, as sbatch -N asks
            return GangShape(replicas, gpus_per_replica, replicas, 1, tasks_per_replica=t)
        if one_node or replicas == 1:
            return GangShape(replicas, gpus_per_replica, 1, replicas, tasks_per_replica=t)
        return GangShape(replicas, gpus_per_replica, None, None, tasks_per_replica=t)
    if len(nodes) != replicas:
        raise Unsupported(f"placement names {len(nodes)} node(s) for a gang of {replicas}")
    counts = Counter(nodes)
    distinct = tuple(counts)  # first-seen order
    if one_node and len(distinct) > 1:
        raise Unsupported(f"placement spreads a one-node gang over {len(distinct)} nodes")
    if one_per_node and len(distinct) < replicas:
        raise Unsupported("placement puts two replicas of a one-per-node gang on one node")
    per_node = set(counts.values())
    k = per_node.pop() if len(per_node) == 1 else None
    return GangShape(replicas, gpus_per_replica, len(distinct), k, distinct,
                     tasks_per_replica=t)
