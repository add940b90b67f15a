"""What a clone phase is (CDI's `Phase` interface in pkg/controller/clone): a name, recorded on the target
in `cdi.kubevirt.io/clonePhase` while the clone is in it, and a `reconcile` that moves it on by one look.

The planner returns the phases of a strategy in order; each look walks them (`execute.advance`): a phase
whose work is done answers None and the next one is asked, the first that is not done answers a `Step`
and the look ends there, in that phase. A phase decides "done" from what exists (its temporary object,
bound or ready), never from the recorded phase, so a look that comes back after any interruption
resumes where the objects say the clone is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from cdi.api import annotations as ann

# clonePhase values besides the phases' own names (CDI's PendingPhaseName, SucceededPhaseName, ErrorPhaseName)
PENDING = "Pending"
SUCCEEDED = "Succeeded"
ERROR = "Error"


@dataclass(frozen=True)
class Step:
    """A phase that is not done: the clone is in it. Its name is recorded on the target with
    `annotations` (None removes one), unless `record` is False: the phase waits without writing, because
    the target already says where the clone is (or, for a wait before anything was made, should not yet)."""

    annotations: Mapping[str, str | None] = field(default_factory=dict)
    record: bool = True


WAIT = Step(record=False)
# a phase that starts its work clears what an earlier wait said in the Running condition
STARTED = Step({ann.CONDITION_RUNNING: None, ann.CONDITION_RUNNING_REASON: None,
                ann.CONDITION_RUNNING_MESSAGE: None})


class CloneFailed(Exception):
    """The clone can never complete (CDI's Error phase); the message says why."""


class Phase(Protocol):
    @property
    def name(self) -> str:
        """The clonePhase recorded while the clone is in this phase."""

    async def reconcile(self) -> Step | None:
        """Move the phase on; None once its work is done."""
