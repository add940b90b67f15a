"""The data directory of `cdi up` is private to the user who runs it.

It holds every secret of the cluster: `state.db` and its `-wal`/`-shm` (every Secret, the upload
token-signing key among them), the CAs' and serving keys, the admin `token`, the `kubeconfig`, and
container logs, which may print anything. So the directory is 0700 before anything is created in it
(no other user can open a file inside, whatever its mode, at any moment), and the files that hold
secrets are 0600 themselves, as a kube-apiserver's keys are. Their writers create them so
(`cdi.common.pki.write_private`, the store opens its database 0600, and SQLite gives the `-wal` and
`-shm` files the database's mode); `prepare` also tightens what a data directory from an older
version left readable.

What lies under `storage/` (the volumes) is left alone: volumes get the modes a kubelet gives them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
# the files that hold secrets (outside `node/`, whose container logs are found by their layout)
PRIVATE_NAMES = ("*.key", "token", "kubeconfig", "state.db", "state.db-wal", "state.db-shm")
# the node's container logs (see cdi.embedded.node.logs): running pods', then removed pods'
LOG_FILES = ("node/pods/*/containers/*/*.log", "node/terminated/*/*.log")
NOT_OURS = ("storage", "node")  # volumes (and the pods' own files): their modes are the kubelet's


class DataDirError(Exception):
    pass


def prepare(directory: Path) -> None:
    """Create `directory` 0700 (or make it so) and tighten the files in it that hold secrets."""
    directory.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    mode = directory.stat().st_mode
    if mode & (stat.S_ISVTX | stat.S_IWOTH):
        raise DataDirError(f"data directory {directory} is shared with other users (mode {stat.filemode(mode)}); "
                           "give cdi up a directory of its own")
    try:
        os.chmod(directory, PRIVATE_DIR)
    except OSError as exc:
        raise DataDirError(f"cannot make data directory {directory} private (0700): {exc}") from exc
    tighten(directory)


def tighten(directory: Path) -> None:
    """Take group and other permissions off every file that holds a secret, and off the directories
    that hold them (outside `storage/` and `node/`); a data directory an older version wrote had them
    0644 and 0755."""
    for root, dirs, files in os.walk(directory):
        here = Path(root)
        if here == directory:
            dirs[:] = [d for d in dirs if d not in NOT_OURS]
        holds_secret = False
        for name in files:
            path = here / name
            if any(path.match(pattern) for pattern in PRIVATE_NAMES):
                _restrict(path, PRIVATE_FILE)
                holds_secret = True
        if holds_secret and here != directory:
            _restrict(here, PRIVATE_DIR)
    for pattern in LOG_FILES:
        for path in directory.glob(pattern):
            _restrict(path, PRIVATE_FILE)


def _restrict(path: Path, mode: int) -> None:
    if path.is_symlink():
        return  # never follow a link out of the data directory
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~mode:
        os.chmod(path, current & mode)
