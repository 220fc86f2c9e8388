"""Signals the engine sends. ``job_dead(sender, job_id, target, code, reason)`` fires
once per row that goes DEAD, after the write committed."""

from django.dispatch import Signal

job_dead = Signal()
