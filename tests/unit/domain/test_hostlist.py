"""Slurm host lists both ways (broker.domain.hostlist, python-hostlist underneath)."""

from __future__ import annotations

import pytest

from broker.domain.hostlist import compress, expand


def test_both_ways_as_slurm_writes_them() -> None:
    assert expand("a100-[1-3,5],h100-2") == ("a100-1", "a100-2", "a100-3", "a100-5", "h100-2")
    assert expand("n[01-02]x") == ("n01x", "n02x")
    assert compress(["a100-4", "a100-1", "a100-2"]) == "a100-[1-2,4]"
    assert compress(["a100-02", "a100-03", "vm"]) == "a100-[02-03],vm"
    assert expand(compress(["gpu-07", "gpu-08", "gpu-10"])) == ("gpu-07", "gpu-08", "gpu-10")


@pytest.mark.parametrize("none", [None, "", "None assigned", "(null)", "None"])
def test_what_slurm_prints_for_no_nodes_is_no_nodes(none: str | None) -> None:
    assert expand(none) == ()
    assert compress([]) == ""


@pytest.mark.parametrize("bad", ["n[a-b]", "n[1-99999999]", "n[1-2"])
def test_a_bad_or_unbounded_list_is_a_value_error(bad: str) -> None:
    with pytest.raises(ValueError, match="bad host list"):
        expand(bad)
