"""Kubernetes backend: Indexed Job + headless Service per gang, watch cache, classification.

broker/wiring builds a K8sBackend from an isthmus.yaml ``backends[]`` entry of kind ``k8s``
(its settings: the fields of ``K8sSettings``) and the pools that name it (``K8sPoolBinding``s).
The ``kubernetes`` client is imported only when the backend first
talks to the API server, so importing this package needs neither the client nor a network.
"""

from __future__ import annotations

from backends.k8s.adapter import K8sBackend
from backends.k8s.classify import judge
from backends.k8s.manifests import render
from backends.k8s.pod_evidence import ClassifyPolicy
from backends.k8s.settings import K8sPoolBinding, K8sSettings

__all__ = [
    "ClassifyPolicy",
    "K8sBackend",
    "K8sPoolBinding",
    "K8sSettings",
    "judge",
    "render",
]
