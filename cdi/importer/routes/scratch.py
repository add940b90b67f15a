"""Route `scratch-convert`: a vmdk, vhd, vhdx or vdi that cannot be read by ranges (compressed, a
server without Range support, a registry layer, an upload) is staged on the scratch volume, then
qemu-img converts it. Without a scratch volume the import stops with `ScratchSpaceRequired`."""

from __future__ import annotations

import os

from .. import formats, resume
from ..errors import ImporterError, Reason
from ..formats import ImageInfo
from ..progress import CONVERT, RESIZE, SYNC, TRANSFER_SCRATCH
from ..sparse_writer import SparseWriter
from ..streams import Stream
from .context import ROUTE_SCRATCH, ImportContext


def scratch_convert(ctx: ImportContext, stream: Stream, info: ImageInfo, why: str) -> tuple[int, bool]:
    from .. import qemu

    scratch = ctx.options.scratch_dir
    if scratch is None or ctx.scratch_file is None:
        raise ImporterError(
            Reason.SCRATCH_SPACE_REQUIRED,
            f"{ctx.origin.name} ({why}) must be staged on scratch space before qemu-img "
            "converts it, and no scratch volume is mounted",
            scratch_space_required=True,
        )
    ctx.route = ROUTE_SCRATCH
    ctx.check_size(info.virtual_size, info.format)
    resume.remove(ctx.state_path)
    ctx.remove_scratch()
    free = os.statvfs(scratch).f_bavail * os.statvfs(scratch).f_bsize
    ctx.plan((TRANSFER_SCRATCH, 48), (CONVERT, 48), (RESIZE, 1), (SYNC, 3))
    ctx.progress.begin(TRANSFER_SCRATCH, ctx.origin.wire_size)
    fd = os.open(ctx.scratch_file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        writer = SparseWriter(fd, known_zero=True, what="scratch space")
        pos = ctx.copy(stream, writer, free, "the scratch volume")
        os.ftruncate(fd, pos)
        writer.drop_cache()
        ctx.scratch_bytes = os.fstat(fd).st_blocks * 512
    finally:
        os.close(fd)
    ctx.finish_source()
    ctx.hasher.verify(ctx.origin.name)
    qinfo = qemu.info(str(ctx.scratch_file), info.qemu_format)
    size = formats.check_qemu_info(qinfo, info)
    ctx.check_size(size, info.format)
    ctx.convert(str(ctx.scratch_file), info, size)
    ctx.remove_scratch()
    return size, ctx.finish(size)
