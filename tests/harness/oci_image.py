"""A small OCI test image and a local registry, for jobs that run inside an image on Slurm.

No public registry is reachable here, so the image is made from what the machine has: the
host's `dash` (as /bin/sh), `cat` and `sleep` with the libraries they load, an
`/etc/os-release` of its own and a marker file that exists only in the image. `umoci` builds
it rootless (no daemon, no root) into an OCI layout cached under ``$ISTHMUS_CACHE`` (default
~/.cache/isthmus), keyed by its recipe; `skopeo` pushes it to a `docker-registry` (Debian's
Docker distribution) listening on a free loopback port, over plain HTTP. The testenv's ``up``
installs all three.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.harness.server import free_port
from tests.harness.wait import wait_until

CACHE = Path(os.environ.get("ISTHMUS_CACHE", str(Path.home() / ".cache" / "isthmus")))
BINARIES = ("/bin/dash", "/bin/cat", "/bin/sleep")
OS_ID = "isthmus-test"
MARKER = "/opt/isthmus/marker"


def _run(args: list[str], **kw: object) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return str(proc.stdout)


def _libraries(binary: str) -> list[str]:
    """The shared objects `binary` loads (as ldd lists them: 'lib => /path' or '/path')."""
    out = []
    for line in _run(["ldd", binary]).splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
        if path.startswith("/"):
            out.append(path)
    return out


def _files(marker: str) -> dict[str, bytes]:
    """Image path -> content: the recipe (its hash names the cached layout)."""
    files: dict[str, bytes] = {}
    for binary in BINARIES:
        target = "/bin/sh" if binary.endswith("/dash") else binary
        files[target] = Path(binary).read_bytes()
        for lib in _libraries(binary):
            files[lib] = Path(lib).read_bytes()
    files["/etc/os-release"] = (f'ID={OS_ID}\nNAME="Isthmus test image"\n'
                                f'PRETTY_NAME="Isthmus test image ({marker})"\n').encode()
    files[MARKER] = f"{marker}\n".encode()
    return files


@dataclass(frozen=True)
class Image:
    layout: Path  # an OCI image layout holding one tag, "image"
    marker: str  # the content of MARKER, what only this image can print

    @property
    def digest(self) -> str:
        """The manifest digest (sha256:...), as a registry serves it."""
        index = json.loads((self.layout / "index.json").read_text())
        return str(index["manifests"][0]["digest"])


def build_image(marker: str, cache: Path = CACHE) -> Image:
    """The test image whose marker file says `marker`, built once per recipe and cached."""
    files = _files(marker)
    key = hashlib.sha256()
    for path in sorted(files):
        key.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    out = cache / "oci-test-image" / key.hexdigest()[:16]
    if (out / "index.json").exists():
        return Image(out, marker)
    work = out.with_name(out.name + f".build-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    layout, bundle = work / "layout", work / "bundle"
    _run(["umoci", "init", "--layout", str(layout)])
    _run(["umoci", "new", "--image", f"{layout}:image"])
    _run(["umoci", "unpack", "--rootless", "--image", f"{layout}:image", str(bundle)])
    rootfs = bundle / "rootfs"
    for path, content in files.items():
        dest = rootfs / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content)
        dest.chmod(0o755 if path.startswith(("/bin/", "/lib")) else 0o644)
    _run(["umoci", "repack", "--image", f"{layout}:image", str(bundle)])
    _run(["umoci", "config", "--image", f"{layout}:image", "--config.env", "PATH=/bin",
          "--config.cmd", "/bin/sh"])
    _run(["umoci", "gc", "--layout", str(layout)])
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    layout.rename(out)
    shutil.rmtree(work, ignore_errors=True)
    return Image(out, marker)


class Registry:
    """A `docker-registry` on a free loopback port, with its storage in `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Registry:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "config.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "version": 0.1, "log": {"level": "warn"},
            "storage": {"filesystem": {"rootdirectory": str(self.root / "data")}},
            "http": {"addr": self.host},
        }))
        with open(self.root / "registry.log", "ab") as log:
            self.proc = subprocess.Popen(["docker-registry", "serve", str(config)],
                                         stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._answers, 30, f"docker-registry on {self.host}", interval=0.2)
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"docker-registry exited {self.proc.returncode}: "
                                 f"{(self.root / 'registry.log').read_text()[-2000:]}")
        probe = subprocess.run(["skopeo", "list-tags", "--tls-verify=false",
                                f"docker://{self.host}/none"], capture_output=True, timeout=10,
                               check=False)
        return b"connection refused" not in probe.stderr.lower()

    def push(self, image: Image, repo_tag: str) -> str:
        """Pushes `image` as host/repo_tag; returns the reference a job names."""
        ref = f"{self.host}/{repo_tag}"
        _run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
              f"oci:{image.layout}:image", f"docker://{ref}"])
        return ref

    def digest(self, ref: str) -> str:
        """The manifest digest the registry serves for `ref` now."""
        out = _run(["skopeo", "inspect", "--tls-verify=false", f"docker://{ref}"])
        return str(json.loads(out)["Digest"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
