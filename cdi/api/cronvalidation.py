"""DataImportCron admission rules as pure functions, with CDI's field paths and messages
(pkg/apiserver/webhooks/dataimportcron-validate.go). Beyond CDI, HTTP and S3 sources are accepted
(the controller detects their changes by ETag / Last-Modified); CDI takes only registry and PVC."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from croniter import CroniterBadDateError, croniter

from cdi.api.validation import Cause, validate_datavolume_spec

Body = Mapping[str, Any]
NAME_MAX = 63  # DNS-1035 label
CRON_SOURCES = ("registry", "pvc", "http", "s3")
ALREADY_MANAGED_MESSAGE = "DataSource {} is already managed by DataImportCron {}"


def next_schedule_time(schedule: str, after: datetime.datetime) -> datetime.datetime | None:
    """The first time after `after` that a standard five-field `schedule` names, or None when it names
    none that ever comes (`0 0 31 2 *`: the 31st of February). CDI's parser accepts such a schedule and
    its controller then never imports; here admission refuses it and the controller treats one admitted
    before (an older webhook, a restored backup) as a schedule without runs, instead of failing on it."""
    try:
        found: datetime.datetime = croniter(schedule, after).get_next(datetime.datetime)
    except CroniterBadDateError:
        return None
    return found


def _name_cause(name: str) -> list[Cause]:
    return [Cause("", f"Name cannot be longer than {NAME_MAX} characters")] if len(name) > NAME_MAX else []


def validate_dataimportcron(cron: Body, old: Body | None = None) -> list[Cause]:
    """Everything the validating webhook checks that needs no API lookups; CDI stops at the first problem."""
    causes = _name_cause(str((cron.get("metadata") or {}).get("name", "")))
    if causes:
        return causes
    if old is not None:  # the spec is immutable after creation (metadata is not)
        if dict(cron.get("spec") or {}) != dict(old.get("spec") or {}):
            return [Cause("DataImportCron.Spec", "Cannot update DataImportCron Spec", "FieldValueDuplicate")]
        return []
    spec: Body = cron.get("spec") or {}
    template: Body = (spec.get("template") or {}).get("spec") or {}
    source: Body = template.get("source") or {}
    if not any(source.get(kind) is not None for kind in CRON_SOURCES):
        return [Cause("spec.Template", "Missing source")]
    if template.get("sourceRef") is not None or template.get("contentType") or template.get("checkpoints") or \
            template.get("finalCheckpoint"):
        return [Cause("spec.Template", "Unsettable fields: SourceRef, ContentType, Checkpoints, FinalCheckpoint")]
    causes = validate_datavolume_spec(template)
    if causes:
        return causes
    schedule = spec.get("schedule") or ""
    if schedule and (len(str(schedule).split()) != 5 or not croniter.is_valid(str(schedule))):
        return [Cause("spec.Schedule", "Illegal cron schedule")]
    if schedule and next_schedule_time(str(schedule), datetime.datetime.now(datetime.UTC)) is None:
        return [Cause("spec.Schedule", f"Illegal cron schedule: spec.schedule {str(schedule)!r} names no time "
                                       "that ever comes, so the cron would never run")]
    keep = spec.get("importsToKeep")
    if keep is not None and int(keep) < 0:
        return [Cause("spec.ImportsToKeep", "Illegal ImportsToKeep value")]
    if spec.get("garbageCollect") is not None and spec["garbageCollect"] not in ("Never", "Outdated"):
        return [Cause("spec.GarbageCollect", "Illegal GarbageCollect value")]
    managed = str(spec.get("managedDataSource") or "")
    if not managed:
        return [Cause("spec.ManagedDataSource", "Illegal ManagedDataSource value")]
    return _name_cause(managed)


def already_managed(cron: Body, others: list[Body]) -> list[Cause]:
    """One cron per managed DataSource: another cron of the namespace naming the same one refuses this."""
    meta = cron.get("metadata") or {}
    managed = (cron.get("spec") or {}).get("managedDataSource")
    for other in others:
        other_meta = other.get("metadata") or {}
        if other_meta.get("name") != meta.get("name") and not other_meta.get("deletionTimestamp") and \
                (other.get("spec") or {}).get("managedDataSource") == managed:
            return [Cause("spec.ManagedDataSource", ALREADY_MANAGED_MESSAGE.format(managed, other_meta.get("name")),
                          "FieldValueDuplicate")]
    return []
