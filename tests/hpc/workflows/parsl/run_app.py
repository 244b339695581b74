"""A Parsl python_app through SlurmProvider, as a user writes it; run by
tests/hpc/test_real_tools_sim.py and test_real_tools_slurm.py with the shims first on PATH.
Prints the app's result."""

import sys

import parsl
from parsl.app.app import python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import SlurmProvider


@python_app
def add(a: int, b: int) -> int:
    import os

    return a + b + 0 * len(os.environ["SLURM_JOB_ID"])


def main(run_dir: str, worker_init: str = "") -> None:
    config = Config(
        executors=[HighThroughputExecutor(
            label="slurm", address="127.0.0.1", max_workers_per_node=1,
            provider=SlurmProvider(
                partition="a100", nodes_per_block=1, init_blocks=1, max_blocks=1,
                walltime="00:10:00", exclusive=False, worker_init=worker_init,
                # a GPU (Isthmus runs GPU gangs); the simulated job outlasts the run, so
                # Parsl cancels it at the end
                scheduler_options="#SBATCH --gres=gpu:1\n"
                                  "#SBATCH --export=ISTHMUS_SIM_DURATION=36000",
            ),
        )],
        run_dir=run_dir, strategy="none",
    )
    with parsl.load(config):
        print("RESULT", add(40, 2).result(timeout=600), flush=True)


if __name__ == "__main__":
    # the second argument: the usual worker_init of a site (activate the Python that has Parsl)
    main(*sys.argv[1:3])
