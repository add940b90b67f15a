"""The importer: the program of importer pods (`cdi-importer`, `python -m cdi.importer`).

It fills one volume from one source, configured only by environment variables and mounts (DESIGN
§3.1), and reports through its exit status, its termination message and its metrics. It knows
nothing of the controller or of Kubernetes.

How the bytes move
------------------
A source (`source_http`, `source_s3`, `source_registry`) opens the object and hands the pipeline
an `Origin`: its first MiB, its size, a range reader when the server serves ranges, and a
sequential stream. The pipeline (`pipeline.py`) recognises the format from those first bytes
(`formats.py`, `compression.py`), refuses unsafe or oversized images before writing anything,
and picks a route (each a module of `routes/`, sharing `routes/context.py`): parallel range
reads written in place (raw), a native range-reading qcow2 converter (`qcow2.py`) and its kin
for vmdk grain tables (`vmdk.py`) and vdi/vhd/vhdx block maps (`vdi.py`, `vhd.py`, `vhdx.py`,
`blockmap.py`), decompression while downloading (gz/xz/zst raw),
qemu-img reading through nbdkit (the images those readers leave alone), or, only where no
streaming path exists, a scratch copy converted by qemu-img (`qemu.py`). Writes are sparse with a
bounded page cache (`sparse_writer.py`); range routes keep a resume checkpoint next to the image
(`resume.py`); the target is sized exactly as CDI sizes it (`target.py`). Failures carry a stable
reason code (`errors.py`) into the termination message (`termination.py`); progress is exported per
phase (`progress.py`).

Importing a plain stream (for the upload server)
------------------------------------------------
The upload server pushes a request body through the same code::

    from cdi.importer import ImportOptions, detect_target, import_stream, Paths

    target = detect_target(Paths.from_env(os.environ))  # or FileTarget(dir) / BlockTarget(device)
    options = ImportOptions(requested_size=..., filesystem_overhead="0.055", preallocation=False,
                            checksum=Checksum.parse("sha256:..."), scratch_dir=Path("/scratch"))
    body = ...                      # any object with read(n) -> bytes (b"" at the end)
    result = import_stream(body, target, options)   # run in a thread; blocking

`import_stream(stream, target, options, progress=None, stop=None, *, name="upload", size=None)`
accepts any object with `read(n)`; it raises `ImporterError` (with `.reason`, `.retryable`,
`.message`, `.scratch_space_required`) and returns an `ImportResult`. Raw and compressed raw are
written straight to the target; other formats need `options.scratch_dir` (ScratchSpaceRequired
otherwise); `content_type="archive"` extracts a tar onto a Filesystem volume.
"""

from .checksum import Checksum
from .errors import REASONS, ImporterError, Reason
from .options import ImportOptions
from .pipeline import ImportResult, import_blank, import_stream, run_import
from .progress import Progress
from .streams import Stream
from .target import BlockTarget, FileTarget, Paths, Target, detect_target

__all__ = [
    "REASONS",
    "BlockTarget",
    "Checksum",
    "FileTarget",
    "ImportOptions",
    "ImportResult",
    "ImporterError",
    "Paths",
    "Progress",
    "Reason",
    "Stream",
    "Target",
    "detect_target",
    "import_blank",
    "import_stream",
    "run_import",
]
