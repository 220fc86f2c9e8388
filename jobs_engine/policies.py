"""Job policies: a target's failure and retention behaviour, declared beside its name.

Four knobs, deliberately. ``attempts`` is the total number of tries, not retries: 1 means
run once and give up. ``backoff_s`` is the wait before the second try, doubled before each
later one. ``keep_completed`` and ``keep_failed`` are how many completed (DONE) and failed
(DEAD) jobs of the target are kept for operators; older ones are pruned by the workers.
A job that genuinely needs a fifth knob is a job whose target deserves its own thinking,
not a wider policy.

Declare the policy in the module that names the target, the one every caller imports::

    MAIL_SEND = "mail:send"
    MAIL_SEND_POLICY = DEFAULT_POLICY       # transport failures retried; the message is the same

    CHARGE_CARD = "billing:charge-card"
    CHARGE_CARD_POLICY = RUN_ONCE_POLICY    # not idempotent: a second try could charge twice
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobs_engine.errors import InvalidPolicy

MAX_WAIT_S = 365 * 24 * 3600  # the longest wait a policy may ask for between two tries


@dataclass(frozen=True, kw_only=True)
class JobPolicy:
    """A target's failure and retention behaviour, given to ``register_target(policy=...)``.

    ``attempts``: total tries, not retries (1: run once and give up). ``backoff_s``: the wait
    before the second try, doubled before each later one. ``keep_completed`` / ``keep_failed``:
    how many DONE / DEAD jobs of the target are kept, with their results / errors. Nonsense
    (0 attempts, a negative backoff, a bool, a float count) raises ``InvalidPolicy`` naming
    the knob when the policy is built.
    """

    attempts: int = 3
    backoff_s: float = 1.0
    keep_completed: int = 100
    keep_failed: int = 1000

    def __post_init__(self) -> None:
        _whole("attempts", self.attempts, least=1)
        if isinstance(self.backoff_s, bool) or not isinstance(self.backoff_s, int | float) \
                or not math.isfinite(self.backoff_s) or self.backoff_s < 0:
            raise InvalidPolicy("backoff_s", f"must be a number of seconds >= 0, "
                                             f"got {self.backoff_s!r}")
        # The last wait, backoff_s * 2 ** (attempts - 2), in logarithms: it may be past
        # what a float holds. A policy whose waits run past a year is a mistake, and its
        # wait after the 47th try at 1 s overflowed the datetime of the next run.
        if self.attempts > 1 and self.backoff_s > 0 and (
                math.log2(self.backoff_s) + self.attempts - 2 > math.log2(MAX_WAIT_S)):
            raise InvalidPolicy("attempts", f"with backoff_s={self.backoff_s:g} the wait "
                                            f"before try {self.attempts} would pass a year "
                                            f"({MAX_WAIT_S:,} s): fewer attempts or a "
                                            "shorter backoff_s")
        _whole("keep_completed", self.keep_completed, least=0)
        _whole("keep_failed", self.keep_failed, least=0)

    def delay_s(self, tries: int) -> float:
        """The wait after try number ``tries`` failed: ``backoff_s``, doubled each time."""
        return float(self.backoff_s) * 2.0 ** (tries - 1)

    def __str__(self) -> str:
        """What an operator reads on the admin pages: the tries, the waits between them,
        and what is kept."""
        if self.attempts == 1:
            tries = "1 attempt (run once)"
        else:
            waits = ", ".join(f"{self.delay_s(n):g} s" for n in range(1, self.attempts)
                              if n <= 3)
            more = ", …" if self.attempts > 4 else ""
            tries = f"{self.attempts} attempts, waits {waits}{more}"
        return f"{tries}; keeps {self.keep_completed} completed, {self.keep_failed} failed"


def _whole(knob: str, value: object, *, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidPolicy(knob, f"must be a whole number >= {least}, got {value!r}")


# Three tries over about three seconds (waits of 1 s, then 2 s): a restart, a dropped
# connection, a provider blinking; not twenty retries against something that will never
# answer. Failed jobs are kept ten times as many as completed ones: a completed job is
# evidence of little, a failed one is the only record of what went wrong.
DEFAULT_POLICY = JobPolicy(attempts=3, backoff_s=1.0, keep_completed=100, keep_failed=1000)
"""3 attempts, waits of 1 s then 2 s; keeps 100 completed and 1,000 failed jobs. The policy
of a target registered without one."""

# For work that is not idempotent (charging a card, posting to an endpoint that does not
# deduplicate): one try, and the failed job still records that it happened.
RUN_ONCE_POLICY = JobPolicy(attempts=1, backoff_s=1.0, keep_completed=100, keep_failed=1000)
"""One attempt, for work that is not idempotent (charging a card): the failed job is kept,
and an operator decides."""
