"""Tables of the engine: jobs, completed jobs, partition leases, worker liveness, shared
pause state, per-key version counters, hourly run statistics and the operators' audit
trail.

The indexes are named after the query they serve; ``store/`` holds those queries. Jobs,
completed jobs, flows, statistics and audit records carry the tenant they belong to
(``tenancy``): NULL, or '' where a unique constraint needs a value, is the platform's own.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from jobs_engine.states import DeliveryMode, FlowState, JobStatus, Lane, StepRole, StepState

# The engine's permission: operators who hold it see and act on jobs and schedules.
MANAGE_PERMISSION = "jobs_engine.manage_jobs"
VIEW_FLOWS_PERMISSION = "jobs_engine.view_flow"  # Django's own view permission of ``Flow``
MANAGE_FLOWS_PERMISSION = "jobs_engine.manage_flows"

PENDING = Q(status=JobStatus.PENDING)
TRIES_HELP = ("Long lane: one entry per try that ended: the worker, its start and end, and "
              "the exception's class and traceback when it raised.")
RUNNING = Q(status=JobStatus.RUNNING)
TENANT_HELP = "The tenant it belongs to; empty: the platform's own (tenancy)."
HAS_TENANT = Q(tenant_id__isnull=False)
# A row of a target without limits. The rows of limited targets are in their own index
# (``jobs_limited_pending``): a backlog their limits hold back is never walked by the
# reserve of the other targets.
NO_LIMITS = Q(limit_key__isnull=True)


def tenant_field() -> models.CharField[str | None, str | None]:
    return models.CharField(max_length=200, null=True, blank=True, help_text=TENANT_HELP)


class Job(models.Model):
    id = models.BigAutoField(primary_key=True)
    code = models.CharField(max_length=200, help_text="Business name; defaults to the target.")
    target = models.CharField(max_length=200)
    lane = models.CharField(max_length=8, choices=Lane.choices)
    key = models.CharField(max_length=255, null=True, blank=True, help_text="Ordering key.")
    partition = models.SmallIntegerField()
    version = models.BigIntegerField(default=0, help_text="Order inside a key.")
    payload = models.JSONField(null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    dedupe_key = models.CharField(max_length=255)  # unique: see Meta.constraints
    status = models.CharField(max_length=8, choices=JobStatus.choices, default=JobStatus.PENDING)
    delivery_mode = models.CharField(max_length=16, choices=DeliveryMode.choices,
                                     default=DeliveryMode.AT_MOST_ONCE)
    attempts = models.IntegerField(default=0, help_text="Tries made so far.")
    next_run_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")
    # Long lane claim: every write by the holder is guarded on its token (fencing).
    claimed_by = models.CharField(max_length=200, null=True, blank=True)
    claim_token = models.CharField(max_length=32, null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    running_code = models.CharField(max_length=200, null=True, blank=True)
    # Fast lane: the in-flight token under which this row's outcome was written.
    outcome_token = models.CharField(max_length=32, null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    trace_id = models.CharField(max_length=64, blank=True, default="")
    actor = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Long lane: among due jobs a higher priority runs first. A database-side default as
    # well: an insert in SQL that leaves the column out (the bench's bulk loads) gets 0.
    priority = models.SmallIntegerField(default=0, db_default=0,
                                        help_text="Long lane: -100..100, higher runs first.")
    tries = models.JSONField(null=True, blank=True, help_text=TRIES_HELP)
    tenant_id = tenant_field()
    # The key of its target's limits (``jobs_engine.limits``): '' for a target limited as a
    # whole; NULL for a target without limits, whose rows the limits' indexes never hold.
    limit_key = models.CharField(max_length=200, null=True, blank=True,
                                 help_text="Its key under its target's limits.")

    class Meta:
        indexes = [
            # Limits' admission: the due rows of one key of a limited target, in run order;
            # a skip scan over it finds the keys that have rows waiting.
            models.Index(fields=["target", "limit_key", "-priority", "next_run_at", "id"],
                         condition=PENDING & Q(limit_key__isnull=False),
                         name="jobs_limited_pending"),
            # Limits' admission: the rows of a key running now (its used slots).
            models.Index(fields=["target", "limit_key"],
                         condition=RUNNING & Q(limit_key__isnull=False),
                         name="jobs_limited_running"),
            # Fair shares: the long lane's due rows of one tenant, in run order; a skip
            # scan over it finds the tenants that have rows waiting. Rows without a tenant
            # (every row of a single-tenant project) write no entry.
            models.Index(fields=["tenant_id", "-priority", "next_run_at", "id"],
                         condition=PENDING & Q(lane=Lane.LONG) & HAS_TENANT & NO_LIMITS,
                         name="jobs_long_pending_tenant"),
            # Long lane reserve: due rows in run order, the highest priority first. Long
            # lane only, so a fast-lane poll can only read its own target's index, never
            # walk other targets' rows.
            models.Index(fields=["-priority", "next_run_at", "id"],
                         condition=PENDING & Q(lane=Lane.LONG) & NO_LIMITS,
                         name="jobs_long_pending_due"),
            # Fast lane poll: due rows of one target in run order.
            models.Index(fields=["target", "next_run_at", "id"],
                         condition=PENDING & Q(lane=Lane.FAST), name="jobs_fast_pending_due"),
            # Fast lane key hold: is there an earlier PENDING row of this key?
            models.Index(fields=["partition", "target", "key", "version", "id"],
                         condition=PENDING & Q(key__isnull=False), name="jobs_pending_key_order"),
            # Long lane reclaim of expired leases.
            models.Index(fields=["lease_until"], condition=RUNNING, name="jobs_running_lease"),
            # Retention: DEAD rows closed before a cutoff, oldest first. Partial: a PENDING
            # or RUNNING row writes no entry, and a statement that finds its RUNNING rows by
            # id is never planned through the entries of every RUNNING version an old
            # snapshot still sees.
            models.Index(fields=["closed_at"], condition=Q(status="DEAD"), name="jobs_dead_closed"),
            # Retention: the newest DEAD rows of a target are kept (keep_failed).
            models.Index(fields=["target", "closed_at", "id"], condition=Q(status="DEAD"),
                         name="jobs_dead_by_target"),
            # Admin and API: exact search and filter by key.
            models.Index(fields=["key"], condition=Q(key__isnull=False), name="jobs_key"),
            # Admin and API of a tenant: its jobs, newest first. Partial: a job without a
            # tenant (every job of a single-tenant project) writes no entry.
            models.Index(fields=["tenant_id", "-id"], condition=HAS_TENANT,
                         name="jobs_by_tenant"),
        ]
        constraints = [
            # The enqueue's ON CONFLICT target. A constraint, not ``unique=True``: for that,
            # Django adds a second, varchar_pattern_ops index no query uses, which every
            # insert and every status change would write.
            models.UniqueConstraint(fields=["dedupe_key"], name="jobs_one_per_dedupe_key"),
            # At most one RUNNING row per exclusive code, across every worker.
            models.UniqueConstraint(fields=["running_code"],
                                    condition=RUNNING & Q(running_code__isnull=False),
                                    name="jobs_one_running_per_code"),
        ]
        permissions = [("manage_jobs", "Can manage jobs and schedules")]

    def __str__(self) -> str:
        return f"{self.target} #{self.id} ({self.status})"


class CompletedJob(models.Model):
    """A job that completed, kept with its result because its target's policy keeps
    completed jobs (``keep_completed``): status DONE. Apart from the hot ``Job`` table, so
    thousands of kept rows never weigh on a lane's statements, and a completion is one
    move (delete there, append here) rather than an update of every index of the hot
    table. The id is the job's own."""

    id = models.BigIntegerField(primary_key=True)
    target = models.CharField(max_length=200)
    lane = models.CharField(max_length=8, choices=Lane.choices)
    code = models.CharField(max_length=200)
    key = models.CharField(max_length=255, null=True, blank=True)
    version = models.BigIntegerField(default=0)
    partition = models.SmallIntegerField(default=0)
    dedupe_key = models.CharField(max_length=255)
    delivery_mode = models.CharField(max_length=16, choices=DeliveryMode.choices)
    payload = models.JSONField(null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True, help_text="What the handler returned.")
    attempts = models.IntegerField(default=1, help_text="Tries made, this one included.")
    trace_id = models.CharField(max_length=64, blank=True, default="")
    actor = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField()
    duration_ms = models.FloatField(default=0.0)
    tries = models.JSONField(null=True, blank=True, help_text=TRIES_HELP)
    tenant_id = tenant_field()

    class Meta:
        db_table = "jobs_engine_done"
        indexes = [
            # Retention: the newest keep_completed of a target stay (also the admin filter).
            models.Index(fields=["target", "finished_at", "id"], name="jobs_done_by_target"),
            models.Index(fields=["tenant_id", "-id"], condition=HAS_TENANT,
                         name="jobs_done_by_tenant"),
        ]

    @property
    def status(self) -> str:
        return JobStatus.DONE.value

    def __str__(self) -> str:
        return f"{self.target} #{self.id} (DONE)"


class Flow(models.Model):
    """Several jobs run as one unit (``jobs_engine.flows``): a chain of steps, or a batch of
    jobs and a callback with all their results. Written with every step in the caller's
    transaction; kept ``FLOW_RETENTION_DAYS`` after it finished."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=[("chain", "Chain"), ("batch", "Batch")])
    state = models.CharField(max_length=10, choices=FlowState.choices,
                             default=FlowState.RUNNING)
    definition = models.CharField(max_length=200, blank=True, default="",
                                  help_text="The defined flow it was started from, if any.")
    tenant_id = tenant_field()
    steps_total = models.IntegerField()
    steps_done = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "jobs_engine_flow"
        verbose_name = "job flow"
        indexes = [
            models.Index(fields=["tenant_id", "state", "id"], name="jobs_flow_by_tenant"),
            # Retention: finished flows older than FLOW_RETENTION_DAYS.
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False),
                         name="jobs_flow_finished"),
        ]
        permissions = [("manage_flows", "Can start, retry and cancel job flows")]

    def __str__(self) -> str:
        return f"{self.name} #{self.id} ({self.state})"


class FlowStep(models.Model):
    """One step of a flow: its place, the target that runs it, its data, and once run its
    result or error. ``job_id`` is the job that runs it now (a retry makes a new one)."""

    id = models.BigAutoField(primary_key=True)
    flow = models.ForeignKey(Flow, on_delete=models.CASCADE, related_name="steps")
    position = models.IntegerField(help_text="Order in the chain, or in the batch's results.")
    role = models.CharField(max_length=8, choices=StepRole.choices)
    name = models.CharField(max_length=200)
    target = models.CharField(max_length=200)
    data = models.JSONField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=StepState.choices,
                             default=StepState.WAITING)
    job_id = models.BigIntegerField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    attempts = models.IntegerField(default=0, help_text="Tries made, over every retry.")
    last_error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "jobs_engine_flowstep"
        constraints = [models.UniqueConstraint(fields=["flow", "position"],
                                               name="jobs_flowstep_place")]
        indexes = [models.Index(fields=["job_id"], condition=Q(job_id__isnull=False),
                                name="jobs_flowstep_by_job")]

    def __str__(self) -> str:
        return f"{self.name} (step {self.position} of flow {self.flow_id})"


class RegisteredTarget(models.Model):
    """No table: the admin lists the targets registered in the serving process, with their
    lane, delivery mode and policy, from the registry (``operators.admin``)."""

    name = models.CharField(max_length=200, primary_key=True)

    class Meta:
        managed = False
        db_table = "jobs_engine_registered_target"  # never created, never queried
        verbose_name = "target"

    def __str__(self) -> str:
        return self.name


class Partition(models.Model):
    """A fast-lane partition lease: one owner at a time, renewed by heartbeat. The
    in-flight marks of its rows are ``InflightMark`` rows."""

    partition = models.SmallIntegerField(primary_key=True)
    owner = models.CharField(max_length=200, null=True, blank=True, db_index=True)
    lease_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"partition {self.partition}"


class InflightMark(models.Model):
    """Fast-lane rows of one partition about to be handed to their target: written before
    the hand-off, under the poll's token and while its owner holds the partition's lease,
    removed with the poll's outcomes. A worker that takes the partition over judges the
    marks left of it by their rows' delivery mode (``store.inflight_close_after_takeover``).

    Rows of their own, inserted and deleted, never updated: a mark kept on the partition's
    row updated it twice a poll, and while another session holds an old snapshot every
    update leaves a version that later reads of the row walk past, and every drain made
    the read of the partition rows slower."""

    id = models.BigAutoField(primary_key=True)
    token = models.CharField(max_length=32, help_text="The poll's token.")
    partition = models.SmallIntegerField()
    owner = models.CharField(max_length=200)
    ids = models.JSONField(help_text="The rows of the send in this partition.")
    marked_at = models.DateTimeField()

    class Meta:
        db_table = "jobs_engine_inflight"
        indexes = [
            # The poll's clear, with its outcomes.
            models.Index(fields=["token"], name="jobs_inflight_by_token"),
            # A takeover's judgement of the partition's marks.
            models.Index(fields=["partition"], name="jobs_inflight_by_partition"),
        ]

    def __str__(self) -> str:
        return f"{len(self.ids or [])} row(s) of partition {self.partition} in flight"


class Worker(models.Model):
    """A live worker process; live while ``heartbeat_at`` is within the partition lease."""

    worker_id = models.CharField(max_length=200, primary_key=True)
    heartbeat_at = models.DateTimeField(db_index=True)
    started_at = models.DateTimeField()
    hostname = models.CharField(max_length=200, blank=True, default="")
    pid = models.IntegerField(default=0)
    lanes = models.CharField(max_length=50, blank=True, default="")
    # Database outages this process rode out (written at its first beat after each one).
    # Database-side defaults as well: a row inserted in SQL that leaves them out is valid.
    db_outages = models.IntegerField(default=0, db_default=0)
    last_db_outage_at = models.DateTimeField(null=True, blank=True)
    last_db_outage_s = models.FloatField(default=0.0, db_default=0.0)
    last_db_error = models.TextField(blank=True, default="", db_default="")

    def __str__(self) -> str:
        return self.worker_id


class TargetPause(models.Model):
    """A paused target, shared by every worker so one probe goes out per ``PROBE_S``."""

    target = models.CharField(max_length=200, primary_key=True)
    paused_until = models.DateTimeField()
    reason = models.TextField(blank=True, default="")
    paused_at = models.DateTimeField()
    probe_by = models.CharField(max_length=200, null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.target} paused until {self.paused_until}"


class LimitBucket(models.Model):
    """One key of one limit of a target (``jobs_engine.limits``): its rate tokens as of
    ``refilled_at``, the time until which a ``RateLimited`` answer blocks it, and its
    counts. Every admission locks the buckets of the keys it admits, so two workers never
    admit the same slot or token."""

    target = models.CharField(max_length=200)
    name = models.CharField(max_length=60, help_text="The limit's name on its target.")
    key = models.CharField(max_length=200, blank=True, default="",
                           help_text="Its key; empty: the target as a whole.")
    tokens = models.FloatField(default=0.0, help_text="Rate: starts it may make now.")
    refilled_at = models.DateTimeField(null=True, blank=True)
    blocked_until = models.DateTimeField(null=True, blank=True,
                                         help_text="A handler said wait (RateLimited).")
    admitted = models.BigIntegerField(default=0, help_text="Jobs started under it.")
    throttled = models.BigIntegerField(default=0, help_text="Times it held a due job back.")
    used_at = models.DateTimeField(help_text="Its last admission.")

    class Meta:
        db_table = "jobs_engine_limit_bucket"
        constraints = [models.UniqueConstraint(fields=["target", "name", "key"],
                                               name="jobs_limit_bucket_key")]
        indexes = [models.Index(fields=["used_at"], name="jobs_limit_bucket_used")]

    def __str__(self) -> str:
        return f"{self.target} {self.name}[{self.key or '*'}]"


class LimitOverride(models.Model):
    """An operator's value for a declared limit, in force from the next admission until
    removed: every worker reads it with the buckets, so no deploy is needed."""

    target = models.CharField(max_length=200)
    name = models.CharField(max_length=60)
    slots = models.IntegerField(null=True, blank=True, help_text="Concurrency: slots.")
    starts = models.IntegerField(null=True, blank=True, help_text="Rate: starts a period.")
    period_s = models.FloatField(null=True, blank=True, help_text="Rate: the period.")
    burst = models.IntegerField(null=True, blank=True, help_text="Rate: the burst.")
    updated_at = models.DateTimeField()
    updated_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        db_table = "jobs_engine_limit_override"
        constraints = [models.UniqueConstraint(fields=["target", "name"],
                                               name="jobs_limit_override_one")]

    def __str__(self) -> str:
        return f"{self.target} {self.name} (overridden)"


class TenantWeight(models.Model):
    """A tenant's weight in the long lane's fair shares (default 1): a tenant of weight 3
    gets three rows of a reserve for each row of a tenant of weight 1, while both wait."""

    tenant_id = models.CharField(max_length=200, primary_key=True)
    weight = models.IntegerField(default=1)
    updated_at = models.DateTimeField()
    updated_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        db_table = "jobs_engine_tenant_weight"

    def __str__(self) -> str:
        return f"{self.tenant_id}: weight {self.weight}"


class TargetLimit(models.Model):
    """No table: the admin's Limits page (each limited target's limits and their keys, the
    operators' overrides, the tenants' weights), computed from ``LimitBucket``,
    ``LimitOverride`` and ``TenantWeight`` and the registry (``operators.limits_admin``),
    like ``JobStat``: a model gives the page its place, URL and view permission."""

    class Meta:
        managed = False
        db_table = "jobs_engine_target_limit"  # never created, never queried
        verbose_name = "limit"
        verbose_name_plural = "limits"

    def __str__(self) -> str:
        return "limits"


class VersionCounter(models.Model):
    """Backs ``next_version(key)``: an atomic per-key counter."""

    key = models.CharField(max_length=255, primary_key=True)
    value = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


class JobStat(models.Model):
    """No table: the admin's statistics page (runs per hour, target and outcome), computed
    from ``JobStatShard`` (``operators.admin``), like ``RegisteredTarget``'s list of targets:
    a model gives the page its place, URL and view permission among the engine's others."""

    class Meta:
        managed = False
        db_table = "jobs_engine_jobstat"  # never created, never queried

    def __str__(self) -> str:
        return "job runs"


class JobStatShard(models.Model):
    """Runs per hour, target, tenant and outcome: the outcome path appends one row per
    write of outcomes (its count), and every retention pass adds a bucket's appended rows
    into the bucket's ``FOLDED`` row and removes them.

    Appended, never updated: an upsert of one row per bucket locked it until the outcome's
    commit, so every worker's outcome writes waited for the others'; and while another
    session holds an old snapshot, every update of a row leaves a version behind that each
    later update walks past, so every drain made the upsert slower."""

    FOLDED = -1  # the shard retention adds a bucket's shards into

    hour = models.DateTimeField(help_text="Start of the hour (UTC).")
    target = models.CharField(max_length=200)
    outcome = models.CharField(max_length=16)
    # '' for none: a unique constraint tells NULLs apart, so upserts of NULL never met.
    tenant_id = models.CharField(max_length=200, blank=True, default="", db_default="",
                                 help_text=TENANT_HELP)
    shard = models.SmallIntegerField(help_text="The counting session's shard; -1: folded.")
    count = models.BigIntegerField(default=0)

    class Meta:
        indexes = [
            # "The last 48 hours" of the admin's chart.
            models.Index(fields=["hour"], name="job_stat_shards_hour"),
        ]
        constraints = [
            # The fold's conflict target: one folded row per bucket.
            models.UniqueConstraint(fields=["hour", "target", "outcome", "tenant_id"],
                                    condition=Q(shard=-1), name="job_stat_shards_folded"),
        ]

    def __str__(self) -> str:
        return (f"{self.hour:%Y-%m-%d %H:00} {self.target} {self.outcome}"
                f"[{self.tenant_id or '-'}:{self.shard}]={self.count}")


class AuditRecord(models.Model):
    """One operator action (retry, skip, cancel, resume, schedule and flow actions): who,
    when, what, on which row, and whether it was done or refused; it belongs to the tenant
    the operator acted for (none: seen by the platform operator only)."""

    class Result(models.TextChoices):
        OK = "ok", "Done"
        REFUSED = "refused", "Refused"

    at = models.DateTimeField(db_index=True)
    user_id = models.BigIntegerField(null=True, blank=True)
    username = models.CharField(max_length=150, blank=True, default="")
    action = models.CharField(max_length=32)
    object_type = models.CharField(max_length=32)
    object_id = models.CharField(max_length=255)
    result = models.CharField(max_length=8, choices=Result.choices)
    message = models.TextField(blank=True, default="")
    tenant_id = tenant_field()

    class Meta:
        indexes = [models.Index(fields=["object_type", "object_id"], name="audit_object"),
                   models.Index(fields=["tenant_id", "-id"], condition=HAS_TENANT,
                                name="audit_by_tenant")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.username or '-'} {self.action} " \
               f"{self.object_type} {self.object_id}: {self.result}"
