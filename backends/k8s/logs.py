"""`K8sBackend.logs`: each rank's pod log (read_namespaced_pod_log), the rank from the pod's
completion index. A node that serves no logs (a fake kwok node has no kubelet to ask) gives an
empty log with the API server's answer as the note, never an error for the others."""

from __future__ import annotations

from typing import Any

from backends.base import BackendUnavailable, RankLog
from backends.k8s.client import ApiError, Apis, call_json, translated
from backends.k8s.manifests import COMPLETION_INDEX, LABEL_NAME


def read_logs(apis: Apis, ns: str, name: str, rank: int | None,
              tail: int | None) -> list[RankLog]:
    timeout = apis.settings.request_timeout_s
    pods = call_json("list pods", apis.core.list_namespaced_pod, ns,
                     label_selector=f"{LABEL_NAME}={name}", timeout=timeout)
    out: list[RankLog] = []
    for pod in pods.get("items") or ():
        meta = pod.get("metadata") or {}
        marks = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
        index = marks.get(COMPLETION_INDEX)
        r = int(index) if isinstance(index, str) and index.isdigit() else None
        if rank is not None and r != rank:
            continue
        pod_name = str(meta.get("name", ""))
        kw: dict[str, Any] = {"tail_lines": tail} if tail is not None else {}
        try:
            with translated("read pod log"):
                resp = apis.core.read_namespaced_pod_log(
                    pod_name, ns, _preload_content=False, _request_timeout=timeout, **kw)
                text = resp.data.decode("utf-8", errors="replace") if resp.data else ""
            out.append(RankLog(r, text, f"pod {ns}/{pod_name}"))
        except (ApiError, BackendUnavailable) as exc:
            node = (pod.get("spec") or {}).get("nodeName") or "no node yet"
            out.append(RankLog(r, "", f"pod {ns}/{pod_name}",
                               f"no log from node {node}: {exc}"))
    return sorted(out, key=lambda x: (x.rank is None, x.rank or 0, x.source))
