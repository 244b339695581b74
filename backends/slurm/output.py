"""A Slurm job's output as `isthmus logs` reads it: the file `--output=<work_dir>/<name>-%j.out`
(one file in which srun interleaves every rank), read where the broker runs: the head node
shares the work directory with the cluster. Ranks are not labelled in it, so a rank asks for
the same file, said so."""

from __future__ import annotations

from backends.base import RankLog, tail_lines


def read_output(work_dir: str, name: str, job_id: str, rank: int | None,
                tail: int | None) -> list[RankLog]:
    path = f"{work_dir.rstrip('/') or ''}/{name}-{job_id}.out"
    note = "" if rank is None else "Slurm writes every rank to this one file"
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except FileNotFoundError:
        return [RankLog(None, "", path, "no output file yet (the job has not started, or "
                                        "the work directory is not shared with this host)")]
    except OSError as exc:
        return [RankLog(None, "", path, f"cannot read it here: {exc.strerror}")]
    return [RankLog(None, tail_lines(text, tail), path, note)]
