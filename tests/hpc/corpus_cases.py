"""The sbatch script corpus of tests/hpc/corpus and its expectations (expected.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CORPUS = Path(__file__).parent / "corpus"


@dataclass(frozen=True)
class Case:
    id: str
    script: Path | None
    args: list[str]
    env: dict[str, str]
    expect: dict[str, Any] | None
    error: str | None
    exit: int
    slurm: str  # "accept" or "refuse": what real sbatch does with it
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def argv(self, parent: str) -> list[str]:
        """The isbatch / sbatch arguments, with @PARENT@ replaced by a job id."""
        words = list(self.args)
        if self.script is not None:
            words.append(str(self.materialise(parent)))
        return words

    def materialise(self, parent: str) -> Path:
        assert self.script is not None
        text = self.script.read_text()
        if "@PARENT@" not in text:
            return self.script
        out = Path(f"/tmp/isthmus-corpus-{parent}-{self.script.name}")
        out.write_text(text.replace("@PARENT@", parent))
        return out

    def expected(self, parent: str) -> dict[str, Any]:
        assert self.expect is not None
        return {
            k: v.replace("@PARENT@", parent) if isinstance(v, str) else v
            for k, v in self.expect.items()
        }


def cases() -> list[Case]:
    data = yaml.safe_load((CORPUS / "expected.yaml").read_text())
    out = []
    for row in data["scripts"]:
        script = row.get("script")
        out.append(Case(
            id=script or "-".join(row["args"][:2]),
            script=CORPUS / script if script else None,
            args=row.get("args", []),
            env=row.get("env", {}),
            expect=row.get("expect"),
            error=row.get("error"),
            exit=row.get("exit", 1),
            slurm=row["slurm"],
            note=row.get("note", ""),
        ))
    return out
