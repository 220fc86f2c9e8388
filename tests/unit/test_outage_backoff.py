"""The worker's backoff during a database outage (``jobs_engine.lanes.outage.backoff_s``)."""

from jobs_engine.lanes.outage import BACKOFF_MAX_S, backoff_s


def test_backoff_doubles_then_stays_at_its_maximum() -> None:
    assert [backoff_s(n) for n in range(0, 7)] == [0.5, 0.5, 1, 2, 4, 5, 5]


def test_backoff_of_a_long_outage_stays_at_its_maximum() -> None:
    """The long lane's outcome write (``LongLane._record``) retries for as long as an
    outage lasts, counting its failures: at the 1025th (some 85 minutes in, at 5 s each)
    2 ** 1024 did not fit a float, backoff_s raised OverflowError, and the outcome of a
    job whose handler had run was given up (the lease rescue ran it again, or presumed an
    at-most-once one DEAD)."""
    assert backoff_s(1025) == BACKOFF_MAX_S
    assert backoff_s(10**6) == BACKOFF_MAX_S
