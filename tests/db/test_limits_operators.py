"""Operators see and change limits at run time (docs/operators.md): overriding a declared
limit and clearing the override, a tenant's weight, pausing a target by hand and resuming
it; through ``operators.actions`` (validated, audited done or refused), the admin's Limits
and targets pages and the JSON API. Bad input answers 4xx and writes nothing. Who may do
what across tenants: tests/db/test_tenant_access.py; per permission: test_access.py."""

from __future__ import annotations

import json
import math
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from jobs_engine import conf, store
from jobs_engine.enqueueing import enqueue_many
from jobs_engine.errors import InvalidStatus, NotFound, OperationRefused
from jobs_engine.lanes.pauses import PauseGate
from jobs_engine.limits import MAX_PERIOD_S, MAX_SLOTS, PER_TENANT, Concurrency, Rate, per_field
from jobs_engine.models import AuditRecord, LimitBucket, LimitOverride, TargetPause, TenantWeight
from jobs_engine.models import Job as JobModel
from jobs_engine.operators import actions
from jobs_engine.operators.limits_admin import KEYS_SHOWN
from jobs_engine.registry import get_target
from jobs_engine.states import JobStatus
from tests.db.operator_helpers import make_job, manager

pytestmark = pytest.mark.django_db

API = "/jobs/api/v1"
LIMITS_PAGE = reverse("admin:jobs_engine_targetlimit_changelist")
TARGETS_PAGE = reverse("admin:jobs_engine_registeredtarget_changelist")
SECOND = timedelta(seconds=1)


@pytest.fixture
def user() -> User:
    return manager()


@pytest.fixture
def client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def limited(targets: Any) -> None:
    """``ops.render`` (long lane, 1 slot) and ``ops.pay`` (long lane, 3 starts a minute per
    tenant, named with a slash as a limit per key is by default)."""
    targets("ops.render", lane="long", limits=[Concurrency(1)])
    targets("ops.pay", lane="long", limits=[Rate(3, period_s=60, per=PER_TENANT)])


def settings_now() -> tuple[Any, ...]:
    """Every table an operator's change of the platform's settings writes, and the audit
    records done."""
    return (sorted(LimitOverride.objects.values_list("target", "name", "slots", "starts",
                                                     "period_s", "burst")),
            sorted(TenantWeight.objects.values_list("tenant_id", "weight")),
            sorted(TargetPause.objects.values_list("target", "paused_until", "reason",
                                                   "probe_by")),
            AuditRecord.objects.filter(result="ok").count())


def audits(action: str) -> list[tuple[str, str, str]]:
    return [(r.object_id, r.result, r.message)
            for r in AuditRecord.objects.filter(action=action).order_by("id")]


def reserve(target: str, now: datetime) -> int:
    got = store.jobs_long_reserve_limited(f"w-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex, now,
                                          300, 10, targets=[get_target(target)])
    return len(got.rows)


# -- overrides -------------------------------------------------------------------------------


def test_an_override_is_in_force_at_the_next_admission_and_clearing_it_restores_the_declared(
        limited: None, user: User, now: datetime) -> None:
    enqueue_many([{"target": "ops.render", "payload": n} for n in range(10)])
    assert reserve("ops.render", now) == 1  # declared: 1 slot

    setting = actions.set_limit_override("ops.render", "concurrency", {"slots": 4}, user)

    assert (setting.in_force, setting.declared) == (Concurrency(4), Concurrency(1))
    assert setting.overridden and setting.override is not None
    assert setting.override.updated_by == "manager"
    assert reserve("ops.render", now) == 3  # 4 slots, 1 taken
    [state] = store.limits_state([get_target("ops.render")], now)
    assert (state.limit, state.declared, state.overridden, state.running) == (
        Concurrency(4), Concurrency(1), True, 4)

    cleared = actions.clear_limit_override("ops.render", "concurrency", user)
    assert (cleared.in_force, cleared.overridden) == (Concurrency(1), False)
    assert not LimitOverride.objects.exists()
    JobModel.objects.filter(status=JobStatus.RUNNING).delete()  # their outcomes moved them
    assert reserve("ops.render", now) == 1
    assert [(o, r) for o, r, _ in audits("set_override") + audits("clear_override")] == [
        ("ops.render/concurrency", "ok"), ("ops.render/concurrency", "ok")]
    assert "1 at once for the target -> 4 at once" in audits("set_override")[0][2]


def test_a_rate_override_replaces_the_values_given_and_keeps_the_declared_others(
        limited: None, user: User, now: datetime) -> None:
    setting = actions.set_limit_override("ops.pay", "rate/tenant",
                                         {"starts": 10, "period_s": None}, user)
    assert setting.in_force == Rate(10, period_s=60, burst=3, per=PER_TENANT)
    again = actions.set_limit_override("ops.pay", "rate/tenant",
                                       {"period_s": 0.5, "burst": 20}, user)
    # A new override replaces the last one whole: starts is the declared one again.
    assert again.in_force == Rate(3, period_s=0.5, burst=20, per=PER_TENANT)
    row = LimitOverride.objects.get()
    assert (row.slots, row.starts, row.period_s, row.burst) == (None, None, 0.5, 20)
    enqueue_many([{"target": "ops.pay", "payload": n, "tenant_id": "acme"} for n in range(30)])
    assert reserve("ops.pay", now) == 10  # the reserve's own limit: the burst is 20 now


def test_clearing_a_limit_without_override_changes_nothing_and_is_audited(
        limited: None, user: User) -> None:
    cleared = actions.clear_limit_override("ops.render", "concurrency", user)
    assert not cleared.overridden
    assert audits("clear_override") == [("ops.render/concurrency", "ok",
                                         "had no override (1 at once for the target)")]


BAD_OVERRIDES = [
    ("ops.render", "concurrency", {"starts": 3}, "takes slots only"),
    ("ops.render", "concurrency", {"slots": 2, "burst": 3}, "takes slots only"),
    ("ops.pay", "rate/tenant", {"slots": 3}, "takes starts, period_s, burst only"),
    ("ops.render", "concurrency", {}, "give at least one of slots"),
    ("ops.render", "concurrency", {"slots": None}, "give at least one of slots"),
    ("ops.render", "concurrency", {"slots": 0}, "slots: must be a whole number from 1"),
    ("ops.render", "concurrency", {"slots": -1}, "slots: must be a whole number"),
    ("ops.render", "concurrency", {"slots": MAX_SLOTS + 1}, "slots: must be a whole number"),
    ("ops.render", "concurrency", {"slots": True}, "slots: must be a whole number"),
    ("ops.render", "concurrency", {"slots": 2.0}, "slots: must be a whole number"),
    ("ops.render", "concurrency", {"slots": "2"}, "slots: must be a whole number"),
    ("ops.render", "concurrency", {"slots": "\x00"}, "slots: must be a whole number"),
    ("ops.render", "concurrency", {"slot": 2}, "slot: unknown field"),
    ("ops.pay", "rate/tenant", {"period_s": 0}, "period_s: must be a number of seconds"),
    ("ops.pay", "rate/tenant", {"period_s": -1.5}, "period_s: must be a number of seconds"),
    ("ops.pay", "rate/tenant", {"period_s": math.nan}, "period_s: must be a number"),
    ("ops.pay", "rate/tenant", {"period_s": math.inf}, "period_s: must be a number"),
    ("ops.pay", "rate/tenant", {"period_s": MAX_PERIOD_S * 2}, "period_s: must be a number"),
    ("ops.pay", "rate/tenant", {"period_s": "1"}, "period_s: must be a number"),
    ("ops.pay", "rate/tenant", {"burst": 1.5}, "burst: must be a whole number"),
]


@pytest.mark.parametrize("target, name, values, problem", BAD_OVERRIDES)
def test_an_override_that_cannot_work_is_refused_audited_and_writes_nothing(
        limited: None, user: User, target: str, name: str, values: dict[str, Any],
        problem: str) -> None:
    before = settings_now()
    with pytest.raises(OperationRefused, match=problem.replace("(", r"\(")) as refused:
        actions.set_limit_override(target, name, values, user)
    assert refused.value.status_code == 400
    assert settings_now() == before
    assert [(o, r) for o, r, _ in audits("set_override")] == [(f"{target}/{name}", "refused")]


@pytest.mark.parametrize("target, name", [
    ("ops.nothing", "concurrency"),  # no such target
    ("ops.render", "rate"),  # no such limit
    ("ops.pay", "concurrency"),  # another target's limit
    ("ops.render", "concurrency\x00"), ("ops.render\x00", "concurrency"),
    ("ops.render\ud800", "concurrency"), (None, "concurrency"), ("ops.render", 7),
    ("x" * 5000, "y" * 5000)])
def test_an_override_of_an_unknown_target_or_limit_is_not_found(
        limited: None, user: User, target: Any, name: Any) -> None:
    before = settings_now()
    for act in (lambda: actions.set_limit_override(target, name, {"slots": 2}, user),
                lambda: actions.clear_limit_override(target, name, user)):
        with pytest.raises(NotFound):
            act()
    assert settings_now() == before
    assert AuditRecord.objects.filter(result="refused").count() == 2


def test_the_platforms_settings_are_refused_to_any_other_scope(limited: None, user: User
                                                               ) -> None:
    before = settings_now()
    changes = [
        lambda scope: actions.set_limit_override("ops.render", "concurrency", {"slots": 2},
                                                 user, scope=scope),
        lambda scope: actions.clear_limit_override("ops.render", "concurrency", user,
                                                   scope=scope),
        lambda scope: actions.set_tenant_weight("acme", 3, user, scope=scope),
        lambda scope: actions.pause_target("ops.render", user, scope=scope),
        lambda scope: actions.resume_target("ops.render", user, scope=scope)]
    for scope in ("acme", None):
        for change in changes:
            with pytest.raises(OperationRefused, match="platform operator") as refused:
                change(scope)
            assert (refused.value.status_code, refused.value.code) == (403, "forbidden")
    assert settings_now() == before
    assert {r.tenant_id for r in AuditRecord.objects.filter(result="refused")} == {"acme", None}


# -- tenants' weights ---------------------------------------------------------------------------


def test_a_tenants_weight_is_set_and_one_removes_its_row(user: User) -> None:
    row = actions.set_tenant_weight("acme", 3, user)
    assert (row.tenant_id, row.weight, row.updated_by) == ("acme", 3, "manager")
    assert TenantWeight.objects.get(tenant_id="acme").weight == 3
    assert actions.set_tenant_weight("acme", 1000, user).weight == 1000
    back = actions.set_tenant_weight("acme", 1, user)
    assert (back.weight, back.updated_at) == (1, None)
    assert not TenantWeight.objects.exists()
    assert [m for _, _, m in audits("set_weight")] == [
        "weight 1 -> 3", "weight 3 -> 1000", "weight 1000 -> 1"]


@pytest.mark.parametrize("tenant, weight, error", [
    ("acme", 0, OperationRefused), ("acme", 1001, OperationRefused),
    ("acme", True, OperationRefused), ("acme", 2.5, OperationRefused),
    ("acme", "3", OperationRefused), ("acme", None, OperationRefused),
    ("", 3, NotFound), ("a\x00b", 3, NotFound), ("a\ud800", 3, NotFound),
    ("a\nb", 3, NotFound), ("t" * 201, 3, NotFound), (7, 3, NotFound)])
def test_a_weight_or_tenant_id_that_cannot_be_is_refused_and_writes_nothing(
        user: User, tenant: Any, weight: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as refused:
        actions.set_tenant_weight(tenant, weight, user)
    assert isinstance(refused.value, OperationRefused)
    assert refused.value.status_code == (404 if error is NotFound else 400)
    assert not TenantWeight.objects.exists()
    assert [r for _, r, _ in audits("set_weight")] == ["refused"]


# -- pauses by hand -----------------------------------------------------------------------------


def test_a_pause_by_hand_holds_until_resumed_whatever_the_breaker_does(
        targets: Any, user: User, now: datetime) -> None:
    targets("ops.hand", lane="long")
    pause = actions.pause_target("ops.hand", user, now)
    assert pause.by_hand and pause.paused_until == store.HAND_PAUSE_UNTIL
    row = TargetPause.objects.get(target="ops.hand")
    assert (row.reason, row.probe_by, row.paused_at) == ("paused by hand by manager", None, now)

    # No probe is ever due, the breaker neither shortens nor clears it.
    assert not store.pause_claim_probe("ops.hand", "w-1", now + timedelta(days=3650), 30)
    store.pause_set("ops.hand", now, 30, "TargetUnreachable: down")
    assert store.pause_clear("ops.hand") == 0
    assert TargetPause.objects.get(target="ops.hand").paused_until == store.HAND_PAUSE_UNTIL
    make_job("ops.hand")
    assert store.jobs_long_reserve("A", "tok", now + timedelta(days=3650), 300, 10,
                                   targets=["ops.hand"], start=True) == []

    actions.pause_target("ops.hand", user, now)  # again: nothing changes
    actions.resume_target("ops.hand", user)
    assert not TargetPause.objects.exists()
    with pytest.raises(InvalidStatus, match="not paused") as refused:
        actions.resume_target("ops.hand", user)
    assert refused.value.status_code == 409
    assert [(r, m) for _, r, m in audits("pause")] == [
        ("ok", "was not paused"), ("ok", "was paused by hand")]
    assert [(r, m) for _, r, m in audits("resume")] == [
        ("ok", "was paused by hand"), ("refused", "target ops.hand is not paused")]


def test_the_fast_lane_sends_nothing_of_a_target_paused_by_hand_and_all_once_resumed(
        targets: Any, user: User, now: datetime) -> None:
    from tests.db.test_fast_lane import make_worker, put

    calls: list[Any] = []
    targets("ops.fast", handler=calls.append)
    worker = make_worker("A")
    worker.leases.heartbeat(now)
    put("ops.fast", now)
    actions.pause_target("ops.fast", user, now)
    later = now + timedelta(days=3650)  # long past any breaker's probe
    worker.leases.heartbeat(later)
    assert worker.lane.run_once(later) == 0 and calls == []
    assert TargetPause.objects.get(target="ops.fast").paused_until == store.HAND_PAUSE_UNTIL
    actions.resume_target("ops.fast", user)
    assert worker.lane.run_once(later) == 1 and len(calls) == 1


def test_a_pause_by_hand_replaces_the_breakers_even_while_its_probe_is_out(
        targets: Any, user: User, now: datetime) -> None:
    targets("ops.probed")
    store.pause_set("ops.probed", now - 31 * SECOND, 30, "TargetUnreachable: down")
    gate = PauseGate("w-1", conf.jobs_settings())
    assert gate.claim_probe("ops.probed", now)  # the probe is out
    actions.pause_target("ops.probed", user, now)
    gate.probe_answered("ops.probed")  # the probe got through: the breaker's pause ends...
    row = TargetPause.objects.get(target="ops.probed")  # ... not the operator's
    assert (row.paused_until, row.probe_by) == (store.HAND_PAUSE_UNTIL, None)
    assert audits("pause")[0][2] == "was paused by the breaker"  # not its reason: private


def test_a_pause_of_an_unknown_target_and_a_resume_of_one_not_paused_are_refused(
        targets: Any, user: User, now: datetime) -> None:
    with pytest.raises(NotFound, match=r"no target named 'ops\.none' is registered"):
        actions.pause_target("ops.none", user)
    with pytest.raises(NotFound, match=r"ops\.none is not paused"):
        actions.resume_target("ops.none", user)
    for name in ("a\x00b", "a\ud800b", None, ""):
        with pytest.raises(NotFound):
            actions.pause_target(name, user)
        with pytest.raises(NotFound):
            actions.resume_target(name, user)
    # A pause of a target no process registers any more is still resumed.
    store.pause_set("ops.gone", now, 30, "down")
    actions.resume_target("ops.gone", user)
    assert not TargetPause.objects.exists()


# -- the JSON API -------------------------------------------------------------------------------


def send(client: Client, method: str, url: str, body: Any = None, *, raw: bytes | str | None = None,
         content_type: str = "application/json") -> Any:
    data = raw if raw is not None else ("" if body is None else json.dumps(body))
    return client.generic(method, url, data, content_type=content_type)


def test_the_api_lists_every_limit_and_key_with_its_values_and_counts(
        limited: None, client: Client, user: User, now: datetime) -> None:
    LimitBucket.objects.create(target="ops.pay", name="rate/tenant", key="acme", tokens=1.0,
                               refilled_at=now, admitted=7, throttled=2, used_at=now)
    actions.set_limit_override("ops.render", "concurrency", {"slots": 3}, user)

    answer = client.get(f"{API}/limits")

    assert answer.status_code == 200
    lines = {(e["target"], e["limit"], e["key"]): e for e in answer.json()["data"]}
    assert set(lines) == {("ops.render", "concurrency", ""), ("ops.pay", "rate/tenant", "acme")}
    render = lines[("ops.render", "concurrency", "")]
    assert (render["kind"], render["per"], render["in_force"], render["declared"],
            render["overridden"], render["tenant_id"]) == (
        "concurrency", "target", {"slots": 3, "starts": None, "period_s": None, "burst": None},
        {"slots": 1, "starts": None, "period_s": None, "burst": None}, True, None)
    pay = lines[("ops.pay", "rate/tenant", "acme")]
    assert (pay["kind"], pay["tenant_id"], pay["admitted"], pay["throttled"],
            pay["in_force"]["starts"], pay["in_force"]["period_s"]) == (
        "rate", "acme", 7, 2, 3, 60.0)
    assert 1.0 <= pay["tokens"] <= 3.0
    only = client.get(f"{API}/limits", {"target": "ops.pay"}).json()["data"]
    assert [e["target"] for e in only] == ["ops.pay"]
    assert client.get(f"{API}/limits", {"target": "ops.nothing"}).json()["data"] == []


def test_the_api_sets_and_clears_an_override_named_with_a_slash(
        limited: None, client: Client) -> None:
    url = f"{API}/limits/ops.pay/rate/tenant"
    answer = send(client, "PUT", url, {"starts": 6, "period_s": 30})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["target"], body["limit"], body["overridden"], body["in_force"],
            body["updated_by"]) == (
        "ops.pay", "rate/tenant", True, {"slots": None, "starts": 6, "period_s": 30.0,
                                         "burst": 3}, "manager")
    cleared = send(client, "DELETE", url)
    assert cleared.status_code == 200
    assert (cleared.json()["overridden"], cleared.json()["in_force"]["starts"]) == (False, 3)
    assert not LimitOverride.objects.exists()


def test_a_path_that_spells_two_limits_is_refused(targets: Any, client: Client) -> None:
    targets("ops.a", lane="long", limits=[Concurrency(1, name="b/c")])
    targets("ops.a/b", lane="long", limits=[Concurrency(1, name="c")])
    answer = send(client, "PUT", f"{API}/limits/ops.a/b/c", {"slots": 2})
    assert (answer.status_code, answer.json()["code"]) == (400, "validation_error")
    assert "names 2 limits" in answer.json()["message"][0]
    assert not LimitOverride.objects.exists()


OVERRIDE = f"{API}/limits/ops.render/concurrency"
WEIGHT = f"{API}/tenant-weights/acme"
DEEP = '{"slots": ' + "[" * 20_000 + "]" * 20_000 + "}"  # within the body limit


@pytest.mark.parametrize("method, url, raw, content_type, status", [
    # wrong types, ranges and fields
    ("PUT", OVERRIDE, '{"slots": "2"}', "application/json", 400),
    ("PUT", OVERRIDE, '{"slots": 2.0}', "application/json", 400),
    ("PUT", OVERRIDE, '{"slots": true}', "application/json", 400),
    ("PUT", OVERRIDE, '{"slots": 0}', "application/json", 400),
    ("PUT", OVERRIDE, f'{{"slots": {MAX_SLOTS + 1}}}', "application/json", 400),
    ("PUT", OVERRIDE, '{"slots": [2]}', "application/json", 400),
    ("PUT", OVERRIDE, '{"starts": 2}', "application/json", 400),  # a Rate's field
    ("PUT", OVERRIDE, "{}", "application/json", 400),
    ("PUT", OVERRIDE, '{"slots": 2, "why": "x"}', "application/json", 400),
    ("PUT", f"{API}/limits/ops.pay/rate/tenant", '{"period_s": NaN}', "application/json", 400),
    ("PUT", f"{API}/limits/ops.pay/rate/tenant", '{"period_s": Infinity}',
     "application/json", 400),
    ("PUT", f"{API}/limits/ops.pay/rate/tenant", '{"period_s": 1e400}', "application/json",
     400),
    ("PUT", f"{API}/limits/ops.pay/rate/tenant", '{"period_s": "1"}', "application/json", 400),
    ("PUT", WEIGHT, '{"weight": 0}', "application/json", 400),
    ("PUT", WEIGHT, '{"weight": 1001}', "application/json", 400),
    ("PUT", WEIGHT, '{"weight": "3"}', "application/json", 400),
    ("PUT", WEIGHT, '{"weight": 3.5}', "application/json", 400),
    ("PUT", WEIGHT, '{"weight": null}', "application/json", 400),
    ("PUT", WEIGHT, '{"weight": 3, "tenant_id": "other"}', "application/json", 400),
    # text no column can hold, and bodies that are no JSON object
    ("PUT", OVERRIDE, '{"slots": 2, "note": "\\u0000"}', "application/json", 400),
    ("PUT", OVERRIDE, '{"slots": 2, "note": "\\ud800"}', "application/json", 400),
    ("PUT", WEIGHT, '{"weight": 3, "\\ud800": 1}', "application/json", 400),
    ("PUT", OVERRIDE, DEEP, "application/json", 400),
    ("PUT", OVERRIDE, "not json", "application/json", 400),
    ("PUT", OVERRIDE, "[]", "application/json", 400),
    ("PUT", OVERRIDE, "null", "application/json", 400),
    ("PUT", OVERRIDE, "", "application/json", 400),
    ("PUT", OVERRIDE, "slots=2", "application/x-www-form-urlencoded", 415),
    ("PUT", OVERRIDE, "slots", "text/plain", 415),
    ("PUT", OVERRIDE, '{"slots": 2, "pad": "' + "x" * 70_000 + '"}', "application/json", 413),
    ("POST", f"{API}/targets/ops.render/pause", '{"reason": "x"}', "application/json", 400),
    ("POST", f"{API}/targets/ops.render/pause", "x" * 70_000, "application/json", 413),
    # unknown or impossible names in the path
    ("PUT", f"{API}/limits/ops.nothing/concurrency", '{"slots": 2}', "application/json", 404),
    ("PUT", f"{API}/limits/ops.render/rate", '{"slots": 2}', "application/json", 404),
    ("PUT", f"{API}/limits/ops.render/concurrency%00", '{"slots": 2}', "application/json",
     404),
    ("PUT", f"{API}/limits/ops.render%00/concurrency", '{"slots": 2}', "application/json",
     404),
    ("PUT", f"{API}/limits/ops.render/concurrency%ED%A0%80", '{"slots": 2}',
     "application/json", 404),
    ("PUT", f"{API}/limits/{'x' * 300}/concurrency", '{"slots": 2}', "application/json",
     404),
    ("PUT", f"{API}/limits/ops.render", '{"slots": 2}', "application/json", 404),
    ("DELETE", f"{API}/limits/ops.nothing/concurrency", "", "application/json", 404),
    ("PUT", f"{API}/tenant-weights/a%00b", '{"weight": 3}', "application/json", 404),
    ("PUT", f"{API}/tenant-weights/a%0Ab", '{"weight": 3}', "application/json", 404),
    ("PUT", f"{API}/tenant-weights/{'t' * 201}", '{"weight": 3}', "application/json", 404),
    ("POST", f"{API}/targets/ops.nothing/pause", "", "application/json", 404),
    ("POST", f"{API}/targets/ops.render%00/pause", "", "application/json", 404),
    ("POST", f"{API}/targets/ops.nothing/resume", "", "application/json", 404),
    ("POST", f"{API}/targets/ops.render/resume", "", "application/json", 409),
    ("GET", f"{API}/limits?target=a%00b", "", "application/json", 400),
    ("GET", f"{API}/limits?target=", "", "application/json", 400),
    ("GET", f"{API}/limits?target=a&target=b", "", "application/json", 400),
])
def test_bad_input_answers_4xx_and_writes_nothing(
        limited: None, client: Client, method: str, url: str, raw: str, content_type: str,
        status: int) -> None:
    before = settings_now()
    answer = send(client, method, url, raw=raw, content_type=content_type)
    assert answer.status_code == status, (answer.status_code, answer.content[:300])
    body = answer.json()
    assert body["status_code"] == status and isinstance(body["message"], list)
    assert settings_now() == before


def test_a_multipart_form_where_json_is_taken_is_refused(limited: None, client: Client
                                                         ) -> None:
    before = settings_now()
    answer = client.put(OVERRIDE, data=b'--b\r\nContent-Disposition: form-data; name="slots"'
                                       b'\r\n\r\n2\r\n--b--\r\n',
                        content_type="multipart/form-data; boundary=b")
    assert (answer.status_code, answer.json()["code"]) == (415, "unsupported_media_type")
    posted = client.post(f"{API}/targets/ops.render/pause", {"reason": "x"})  # a form
    assert posted.status_code == 400
    assert settings_now() == before


def test_the_api_pauses_by_hand_resumes_and_sets_weights(limited: None, client: Client) -> None:
    paused = client.post(f"{API}/targets/ops.render/pause")
    assert paused.status_code == 200
    assert (paused.json()["paused"], paused.json()["by_hand"], paused.json()["reason"]) == (
        True, True, "paused by hand by manager")
    assert client.post(f"{API}/targets/ops.render/pause").status_code == 200  # no-op
    resumed = client.post(f"{API}/targets/ops.render/resume")
    assert (resumed.status_code, resumed.json()["paused"]) == (200, False)
    assert not TargetPause.objects.exists()

    weighed = send(client, "PUT", f"{API}/tenant-weights/acme/eu", {"weight": 4})
    assert weighed.status_code == 200 and weighed.json()["weight"] == 4
    assert client.get(f"{API}/tenant-weights").json()["data"] == [
        {"tenant_id": "acme/eu", "weight": 4, "updated_by": "manager",
         "updated_at": weighed.json()["updated_at"]}]
    send(client, "PUT", f"{API}/tenant-weights/acme/eu", {"weight": 1})
    assert client.get(f"{API}/tenant-weights").json()["data"] == []


# -- the admin ----------------------------------------------------------------------------------


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_the_limits_page_shows_each_limit_and_key_and_changes_them(
        limited: None, client: Client, now: datetime) -> None:
    LimitBucket.objects.create(target="ops.pay", name="rate/tenant", key="acme", tokens=2.0,
                               refilled_at=now, admitted=5, throttled=9, used_at=now,
                               blocked_until=now + timedelta(minutes=10))
    page = client.get(LIMITS_PAGE)
    assert page.status_code == 200
    groups = {(g["target"], g["name"]): g for g in page.context["limits"]}
    assert set(groups) == {("ops.render", "concurrency"), ("ops.pay", "rate/tenant")}
    render = groups[("ops.render", "concurrency")]
    assert (render["kind"], render["in_force"], render["overridden"]) == (
        "Concurrency", "1 at once", False)
    [key] = groups[("ops.pay", "rate/tenant")]["keys"]
    assert (key["key"], key["tenant_id"], key["admitted"], key["throttled"]) == (
        "acme", "acme", 5, 9)
    assert key["tokens"].endswith("of 3") and key["blocked"].startswith("in ")

    done = client.post(reverse("admin:jobs_engine_targetlimit_override"),
                       {"target": "ops.pay", "name": "rate/tenant", "starts": "12",
                        "period_s": "1.5", "burst": ""}, follow=True)
    assert "Limit rate/tenant of ops.pay: 12 per 1.5 s, burst 3 in force (declared 3 per 60 s, " \
           "burst 3)." in messages_of(done)
    pay = {g["name"]: g for g in done.context["limits"]}["rate/tenant"]
    assert (pay["in_force"], pay["declared"], pay["overridden"]) == (
        "12 per 1.5 s, burst 3", "3 per 60 s, burst 3", True)
    assert [(f["name"], f["value"], f["declared"]) for f in pay["fields"]] == [
        ("starts", "12", "3"), ("period_s", "1.5", "60"), ("burst", "", "3")]
    assert 'class="clear-override"' in done.text

    refused = client.post(reverse("admin:jobs_engine_targetlimit_override"),
                          {"target": "ops.render", "name": "concurrency", "slots": "two"},
                          follow=True)
    assert any(m.startswith("Not done: slots: must be a whole number")
               for m in messages_of(refused))
    cleared = client.post(reverse("admin:jobs_engine_targetlimit_clear"),
                          {"target": "ops.pay", "name": "rate/tenant"}, follow=True)
    assert "Limit rate/tenant of ops.pay: back to its declared 3 per 60 s, burst 3." \
        in messages_of(cleared)
    assert not LimitOverride.objects.exists()
    assert [r for _, r, _ in audits("set_override")] == ["ok", "refused"]

    weighed = client.post(reverse("admin:jobs_engine_targetlimit_weight"),
                          {"tenant_id": " acme ", "weight": "5"}, follow=True)
    assert "Tenant acme: weight 5." in messages_of(weighed)
    assert [(r.tenant_id, r.weight) for r in weighed.context["weights"]] == [("acme", 5)]
    bad = client.post(reverse("admin:jobs_engine_targetlimit_weight"),
                      {"tenant_id": "acme", "weight": "5000"}, follow=True)
    assert any("weight: must be a whole number from 1 to 1000" in m for m in messages_of(bad))
    assert TenantWeight.objects.get().weight == 5


def test_the_limits_page_lists_the_most_recently_used_keys(
        targets: Any, client: Client, now: datetime) -> None:
    targets("ops.acct", lane="long", limits=[Concurrency(1, per=per_field("account"))])
    LimitBucket.objects.bulk_create(
        LimitBucket(target="ops.acct", name="concurrency/payload.account", key=f"k{n:03}",
                    used_at=now - n * SECOND) for n in range(KEYS_SHOWN + 7))
    [group] = client.get(LIMITS_PAGE).context["limits"]
    assert [key["key"] for key in group["keys"][:2]] == ["k000", "k001"]
    assert (len(group["keys"]), group["more"]) == (KEYS_SHOWN, 7)


def test_the_targets_page_pauses_by_hand_and_resumes(targets: Any, client: Client,
                                                      now: datetime) -> None:
    targets("ops.page")
    pause = reverse("admin:jobs_engine_registeredtarget_pause", args=["ops.page"])
    resume = reverse("admin:jobs_engine_registeredtarget_resume", args=["ops.page"])
    page = client.get(TARGETS_PAGE)
    assert f'action="{pause}"' in page.text and f'action="{resume}"' not in page.text

    done = client.post(pause, follow=True)
    assert "Target ops.page paused by hand: no worker sends its jobs until it is resumed." \
        in messages_of(done)
    row = {r["name"]: r for r in done.context["rows"]}["ops.page"]
    assert (row["pause"], row["paused_by_hand"]) == ("paused by hand, until resumed", True)
    assert f'action="{pause}"' not in done.text and f'action="{resume}"' in done.text
    pauses = client.get(reverse("admin:jobs_engine_targetpause_changelist"))
    assert "paused by hand, until resumed" in pauses.text

    resumed = client.post(resume, follow=True)
    assert "Target ops.page resumed: workers send its jobs again." in messages_of(resumed)
    again = client.post(resume, follow=True)
    assert "Not done: target ops.page is not paused" in messages_of(again)
    unknown = client.post(reverse("admin:jobs_engine_registeredtarget_pause",
                                  args=["ops.none"]), follow=True)
    assert "Not done: no target named 'ops.none' is registered" in messages_of(unknown)
    assert client.get(pause).status_code == 405  # a change is a POST
    assert [r for _, r, _ in audits("pause")] == ["ok", "refused"]
    assert [r for _, r, _ in audits("resume")] == ["ok", "refused"]
    # A breaker's pause of a target no process registers is listed, to be resumed.
    store.pause_set("ops.gone", now, 30, "down")
    row = {r["name"]: r for r in client.get(TARGETS_PAGE).context["rows"]}["ops.gone"]
    assert row["registered"] is False and row["pause"].startswith("paused (unreachable)")
