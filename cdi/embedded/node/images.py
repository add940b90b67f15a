"""What an image name means on the local node. The name of one of this package's component images
(any registry prefix, tag or digest) stands for that component's program, run with the Python that
runs `cdi up`, on the host's system directories; so does a container with an explicit `command`
whose image names no registry (`debian`, `reader`: a test's shell or Python). Any other image is a
real OCI image: pulled from its registry, unpacked and run with its own root file system
(`oci.py`), the container's `command` and `args` overriding its entrypoint and cmd as a runtime
does."""

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
# programs a component image holds besides its entrypoint, run by a container's `command` (as CDI runs
# `/usr/bin/cdi-image-size-detection` from the importer image): command base name -> argv prefix
IMAGE_COMMANDS: dict[str, tuple[str, ...]] = {
    "cdi-image-size-detection": ("-m", "cdi.importer.sizedetection"),
}


class ImagePullError(Exception):
    """The image cannot be had (reason ErrImagePull, or ErrImageNeverPull when `never`)."""

    def __init__(self, message: str, never: bool = False) -> None:
        super().__init__(message)
        self.never = never


def base_name(image: str) -> str:
    """`quay.io/kubevirt/cdi-importer:v1.60@sha256:...` -> `cdi-importer`."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def names_registry(image: str) -> bool:
    """Whether the name starts with a registry host (`127.0.0.1:5000/x`, `quay.io/x`, `localhost/x`)."""
    first, _, rest = image.partition("/")
    return bool(rest) and ("." in first or ":" in first or first == "localhost")


def is_oci_image(image: str, command: list[str] | None) -> bool:
    """Whether the container runs a pulled image rather than a program of this package or the host's."""
    if base_name(image) in PROGRAMS:
        return False
    return not command or names_registry(image)


def oci_argv(command: list[str] | None, args: list[str] | None, entrypoint: list[str], cmd: list[str]) -> list[str]:
    """A runtime's rule: `command` replaces the image's entrypoint (and drops its cmd), `args` its cmd."""
    if command:
        return [*command, *(args or [])]
    return [*entrypoint, *(cmd if args is None else args)]


@dataclass(frozen=True)
class Entrypoint:
    argv: list[str]


def entrypoint(image: str, command: list[str] | None, args: list[str] | None,
               python: str = sys.executable) -> Entrypoint:
    """The argv a container runs, as a container runtime combines image entrypoint, command and args."""
    if command and base_name(image) in PROGRAMS and command[0].rsplit("/", 1)[-1] in IMAGE_COMMANDS:
        return Entrypoint([python, *IMAGE_COMMANDS[command[0].rsplit("/", 1)[-1]], *command[1:], *(args or [])])
    if command:
        return Entrypoint([*command, *(args or [])])
    program = PROGRAMS.get(base_name(image))
    if program is None:
        raise ImagePullError(f'Failed to pull image "{image}": the local node runs only cdi component images '
                             f"({', '.join(sorted(PROGRAMS))}) or containers with an explicit command")
    return Entrypoint([python, *program, *(args or [])])
