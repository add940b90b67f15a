"""Route `nbdkit-convert`: an image the importer does not map itself (a vhdx with a log, a vdi with
block extra data, ...) whose server serves ranges: qemu-img reads it through nbdkit-curl, and a
checksum is computed by a second, in-order pass over the source next to the conversion."""

from __future__ import annotations

import threading

from .. import formats, resume
from ..formats import ImageInfo
from ..progress import CONVERT, RESIZE, SYNC
from ..ranges import PrefetchStream
from ..source import NbdSpec
from .context import CHUNK, ROUTE_NBDKIT, ImportContext


def nbdkit_convert(ctx: ImportContext, info: ImageInfo, spec: NbdSpec) -> tuple[int, bool]:
    from .. import qemu

    ctx.route = ROUTE_NBDKIT
    resume.remove(ctx.state_path)
    ctx.plan((CONVERT, 96), (RESIZE, 1), (SYNC, 3))
    with qemu.nbdkit(spec) as server:
        qinfo = qemu.info(server.uri, info.qemu_format)
        size = formats.check_qemu_info(qinfo, info)
        ctx.check_size(size, info.format)
        # qemu-img reads out of order: a second pass hashes the source, worth it only for a checksum asked
        # for (without one, this route records no sha256: `ImportContext.source_sha256`)
        hashing = _HashPass(ctx) if ctx.verifying else None
        try:
            ctx.convert(server.uri, info, size, extra_error=lambda: f" (nbdkit: {server.log()})")
        finally:
            if hashing is not None:
                hashing.join()
    ctx.origin.meter.add(server.bytes_read)  # fetched by nbdkit-curl, not through the origin
    return size, ctx.finish(size)


class _HashPass:
    """Hashes the whole source in order next to a conversion that reads it out of order."""

    def __init__(self, ctx: ImportContext) -> None:
        self.ctx = ctx
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="hash-pass", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            ranges = self.ctx.origin.ranges
            assert ranges is not None
            stream = PrefetchStream(
                ranges, 0, ranges.size, workers=2, stop=self.ctx.stop, on_cancel=self.ctx.origin.abort
            )
            while True:
                chunk = stream.read(CHUNK)
                if not chunk:
                    break
                self.ctx.hasher.update(chunk)
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error
