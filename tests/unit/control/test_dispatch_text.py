"""The rendering kept on an attempt (`dispatch.as_text`): the YAML a person reads of what was
sent, written with libyaml's emitter where PyYAML has it. It must read back as the manifests
and be the text the pure-Python SafeDumper writes (the dashboard and `isthmus show` print it)."""

from __future__ import annotations

import yaml

from backends.base import masked
from backends.k8s.manifests import render
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from broker.control import dispatch
from tests.harness.k8s_requests import request

H100 = K8sPoolBinding(name="h100", flavor="h100-80g", node_selector={"isthmus.io/pool": "h100"})


def _manifests() -> list[dict[str, object]]:
    long_line = "x" * 300
    req = request(env={"NOTE": "crème brûlée ✓", "LONG": long_line},
                  spec_env={"MULTI": "line one\nline two: with colon\n"})
    return render(masked(req), H100, K8sSettings(namespace="train"))


def test_the_text_reads_back_as_the_manifests_and_equals_the_safe_dumpers() -> None:
    manifests = _manifests()
    text = dispatch.as_text(manifests)
    assert text is not None
    assert list(yaml.safe_load_all(text)) == manifests
    assert text == yaml.safe_dump_all(manifests, sort_keys=False)
    assert dispatch._DUMPER is yaml.CSafeDumper  # the wheels carry libyaml: the fast path runs


def test_a_script_or_nothing_is_kept_as_it_is() -> None:
    assert dispatch.as_text("#!/bin/bash\nsrun train.py\n") == "#!/bin/bash\nsrun train.py\n"
    assert dispatch.as_text(None) is None
