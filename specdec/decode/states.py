"""A generation's states and the transitions between them.

    QUEUED --begin--> PREFILLING --prefill_fed--> DECODING --commit ... --> FINISHED
       |                  |                           |
       +------------------+------- finish(reason) ----+
"""

import enum


class State(enum.Enum):
    QUEUED = "queued"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"


NEXT = {State.QUEUED: {State.PREFILLING, State.FINISHED},
         State.PREFILLING: {State.DECODING, State.FINISHED},
         State.DECODING: {State.FINISHED},
         State.FINISHED: set()}


class IllegalTransition(RuntimeError):
    """A generation asked to move to a state it cannot reach from its current one."""
