"""Routes `qcow2-ranges`, `vmdk-ranges`, `vdi-ranges`, `vhd-ranges`, `vhdx-ranges`: a converted
format whose block map the importer reads itself by ranges; the allocated data is then fetched in
file (host) order and written at disk (guest) offsets, resumable from its last checkpoint.

A map reader raises `qcow2.NotNative` for what it does not handle (the pipeline then lets qemu-img
convert the image instead)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from cdi.common.imageprobe import RAW, VDI, VHD, VHDX

from .. import qcow2, vdi, vhd, vhdx, vmdk
from ..formats import ImageInfo
from ..progress import RESIZE, SYNC, TRANSFER_DATA_FILE
from ..ranges import Process
from ..sparse_writer import SparseWriter
from .context import ROUTE_QCOW2, ROUTE_VDI, ROUTE_VHD, ROUTE_VHDX, ROUTE_VMDK, ImportContext

log = logging.getLogger(__name__)

ClusterWriter = Callable[[qcow2.Qcow2Map, SparseWriter], Process]

# formats whose block map the importer reads itself (besides qcow2 and vmdk): route and map reader
BLOCK_MAPS: dict[str, tuple[str, Callable[..., qcow2.Qcow2Map]]] = {
    VDI: (ROUTE_VDI, vdi.read_map),
    VHD: (ROUTE_VHD, vhd.read_map),
    VHDX: (ROUTE_VHDX, vhdx.read_map),
}


def qcow2_ranges(ctx: ImportContext, info: ImageInfo) -> tuple[int, bool] | None:
    """A qcow2 by its L1/L2 tables; None when qemu-img has to convert it."""
    ranges = ctx.origin.ranges
    assert ranges is not None
    try:
        m = qcow2.read_map(
            ranges, info.details["header"], workers=ctx.options.workers, max_piece=ctx.options.span_size
        )
        return mapped(ctx, ROUTE_QCOW2, m, qcow2.ClusterWriter)
    except qcow2.NotNative as exc:
        log.info("converting this qcow2 with qemu-img instead: %s", exc)
        return None


def vmdk_ranges(ctx: ImportContext) -> tuple[int, bool] | None:
    """A vmdk by its grain tables; None when qemu-img has to convert it."""
    ranges = ctx.origin.ranges
    assert ranges is not None
    try:
        m = vmdk.read_map(
            ranges, ctx.origin.head, workers=ctx.options.workers, max_piece=ctx.options.span_size
        )
        return mapped(ctx, ROUTE_VMDK, m, vmdk.GrainWriter)
    except qcow2.NotNative as exc:
        log.info("converting this vmdk with qemu-img instead: %s", exc)
        return None


def block_map_ranges(ctx: ImportContext, info: ImageInfo) -> tuple[int, bool] | None:
    """A vdi, vhd or vhdx (`BLOCK_MAPS`) by its block map; None when qemu-img has to convert it."""
    ranges = ctx.origin.ranges
    assert ranges is not None
    route, reader = BLOCK_MAPS[info.format]
    try:
        m = reader(ranges, ctx.origin.head, max_piece=ctx.options.span_size)
    except qcow2.NotNative as exc:
        log.info("converting this %s with qemu-img instead: %s", info.format, exc)
        return None
    return mapped(ctx, route, m, qcow2.ClusterWriter)


def fixed_vhd(ctx: ImportContext, info: ImageInfo) -> tuple[int, bool] | None:
    """A fixed vhd (raw data, then a 512-byte footer) imported without its footer; None for raw.

    Neither CDI's qemu-img nor a magic at the start recognises it, so CDI writes the footer into
    the disk; its checksummed footer at the end is what tells it from a raw disk."""
    ranges = ctx.origin.ranges
    if info.format != RAW or ranges is None or ranges.size < 2 * vhd.FOOTER:
        return None
    if ranges.size % (1 << 20) == 0:
        # raw disks are whole MiBs; a fixed vhd is its data and 512 bytes more (whole MiBs only
        # by chance): no request for the tail of a raw disk
        return None
    tail = bytearray(vhd.FOOTER)
    ranges.read_into(ranges.size - vhd.FOOTER, memoryview(tail))
    size = vhd.fixed_footer(bytes(tail), ranges.size)
    if size is None:
        return None
    ctx.format = VHD
    log.info("%s is a fixed vhd of %d bytes: importing it without its footer", ctx.origin.name, size)
    return mapped(ctx, ROUTE_VHD, vhd.fixed_map(size, ranges.size, max_piece=ctx.options.span_size),
                  qcow2.ClusterWriter)


def mapped(ctx: ImportContext, route: str, m: qcow2.Qcow2Map, cluster_writer: ClusterWriter) -> tuple[int, bool]:
    """A converted format whose map is read first: its data fetched in host order by ranges and
    written at guest offsets (qcow2, vmdk, vdi, vhd, vhdx)."""
    ranges = ctx.origin.ranges
    assert ranges is not None
    ctx.route = route
    size = m.header.size
    ctx.check_size(size, ctx.format)
    cover = True  # every byte of the file, in order: its sha256 is recorded (and checked, if one was asked for)
    spans = qcow2.plan_spans(m, ctx.options.span_size, cover_all=cover)
    plan: dict[str, object] = {
        "route": ctx.route,
        "span": ctx.options.span_size,
        "cover": cover,
        "spans": len(spans),
        "size": size,
        "target": ctx.target.kind,
    }
    log.info("%s map: %d extents, %d bytes of data in %d spans", ctx.format, len(m), m.data_bytes, len(spans))
    start, fd, done = ctx.open_resumable(plan, size)
    total = sum(s.length for s in spans)
    try:
        writer = ctx.writer(fd, ctx.target.known_zero_when_fresh)
        ctx.plan((TRANSFER_DATA_FILE, 96), (RESIZE, 1), (SYNC, 3))
        ctx.progress.begin(TRANSFER_DATA_FILE, total)
        if not writer.known_zero:
            for offset, length in m.zero_ranges():
                writer.zero_range(offset, length)
        if start and ctx.verifying:  # the image's bytes are not on the target: fetch to hash
            ctx.rehash_fetched(ranges, spans[:start], workers=ctx.options.workers, window=ctx.options.window)
        ctx.progress.update(done)
        checkpoint = ctx.checkpointer(writer, plan, start, done)
        ctx.fetch_spans(ranges, spans[start:], cluster_writer(m, writer), checkpoint, done=done)
        writer.sync()
    finally:
        os.close(fd)
    return size, ctx.finish(size)
