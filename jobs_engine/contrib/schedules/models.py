"""The schedules table: one row per declared code.

Code-owned fields (``cron``, ``timezone``, ``missed_slot_policy``, ``max_attempts``) are
overwritten by every boot sync; admin-owned fields (``enabled``, ``cron_override``) are
kept; ``next_run_at`` and the run/skip history belong to the engine.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from jobs_engine.contrib.schedules.declarations import MissedSlotPolicy


class Schedule(models.Model):
    code = models.CharField(max_length=100, unique=True)
    cron = models.CharField(max_length=200, help_text="Declared in code; read in `timezone`.")
    timezone = models.CharField(max_length=64, default="UTC", help_text="IANA time zone.")
    enabled = models.BooleanField(default=True, help_text="Admin-owned; kept by the boot sync.")
    cron_override = models.CharField(max_length=200, null=True, blank=True,
                                     help_text="Admin-owned; replaces `cron` while set.")
    missed_slot_policy = models.CharField(max_length=16, choices=MissedSlotPolicy.choices)
    max_attempts = models.IntegerField(default=3, help_text="Total runs of one slot.")
    next_run_at = models.DateTimeField(null=True, blank=True,
                                       help_text="The next slot the tick turns into a job.")
    last_run_at = models.DateTimeField(null=True, blank=True,
                                       help_text="The newest slot time whose run started.")
    last_finished_at = models.DateTimeField(null=True, blank=True,
                                            help_text="When the last run of this code ended.")
    last_skipped_at = models.DateTimeField(null=True, blank=True,
                                           help_text="The newest slot time that was skipped.")
    last_skip_reason = models.TextField(blank=True, default="")
    tenant_id = models.CharField(max_length=200, null=True, blank=True,
                                 help_text="Declared in code: the tenant its slots' jobs "
                                           "belong to; empty: the platform's own.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["code"]
        indexes = [
            # The tick: enabled schedules whose next slot is due.
            models.Index(fields=["next_run_at"], condition=Q(enabled=True),
                         name="jobs_engine_schedules_due"),
        ]

    def __str__(self) -> str:
        return self.code

    @property
    def effective_cron(self) -> str:
        return self.cron_override or self.cron
