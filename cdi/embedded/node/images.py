"""What an image name means on the local node: no registry is contacted; the name of one of this
package's component images (any registry prefix, tag or digest) stands for that component's
program, run with the Python that runs `cdi up`. A container with an explicit `command` runs that
command whatever its image; anything else cannot be "pulled"."""

from __future__ import annotations

import sys
from dataclasses import dataclass

# image base name -> argv prefix after the interpreter
PROGRAMS: dict[str, tuple[str, ...]] = {
    "cdi-importer": ("-m", "cdi.importer"),
    "cdi-uploadserver": ("-m", "cdi.uploadserver"),
    "cdi-cloner": ("-m", "cdi.cloner"),
    "cdi-uploadproxy": ("-m", "cdi.cli.main", "uploadproxy"),
    "cdi-apiserver": ("-m", "cdi.cli.main", "apiserver"),
    "cdi-controller": ("-m", "cdi.cli.main", "controller"),
}


class ImagePullError(Exception):
    """The image maps to no program and the container gives no command (reason ErrImagePull)."""


def base_name(image: str) -> str:
    """`quay.io/kubevirt/cdi-importer:v1.60@sha256:...` -> `cdi-importer`."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


@dataclass(frozen=True)
class Entrypoint:
    argv: list[str]


def entrypoint(image: str, command: list[str] | None, args: list[str] | None,
               python: str = sys.executable) -> Entrypoint:
    """The argv a container runs, as a container runtime combines image entrypoint, command and args."""
    if command:
        return Entrypoint([*command, *(args or [])])
    program = PROGRAMS.get(base_name(image))
    if program is None:
        raise ImagePullError(f'Failed to pull image "{image}": the local node runs only cdi component images '
                             f"({', '.join(sorted(PROGRAMS))}) or containers with an explicit command")
    return Entrypoint([python, *program, *(args or [])])
