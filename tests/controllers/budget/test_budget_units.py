"""The budget controller's pure parts: spec checks, selectors, timestamps, the pod contract, ledger <-> status,
compaction of in-memory ledgers, status diffs. Whatever depends on what the API server does with a write runs
against the emulated API server (test_budget_reconcile.py and the other budget tests)."""

from __future__ import annotations

import zoneinfo
from fractions import Fraction
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from gpuops.accounting.gpuhours import Ledger, LedgerBucket, LedgerEntry
from gpuops.accounting.windows import CalendarWindow, RollingWindow
from gpuops.controllers.budget import ledger as ledger_mod
from gpuops.controllers.budget.api import (
    BudgetSpec,
    BudgetStatus,
    LedgerStatus,
    SpecError,
    compile_selector,
    format_time,
    parse_spec,
    parse_time,
)
from gpuops.controllers.budget.ledger import Book, LedgerMemo, compact, ledger_from_status, ledger_to_status
from gpuops.controllers.budget.podcontract import departed_entry as _departed_entry
from gpuops.controllers.budget.podcontract import pod_gpus, pod_span
from gpuops.kube.mergepatch import merge_patch
from gpuops.kube.objects import LabelSelector, Pod

S = 1_000_000


def spec(**over: Any) -> BudgetSpec:
    raw: dict[str, Any] = {"selector": {"matchLabels": {"team": "a"}}, "quota": {"gpuHours": "1", "windowHours": 1}}
    raw.update(over)
    return msgspec.convert(raw, BudgetSpec)


def mkpod(**raw: Any) -> Pod:
    base: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"team": "a"},
                                         "resourceVersion": "1"},
                            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
    for k, v in raw.items():
        base[k] = {**base.get(k, {}), **v}
    return msgspec.convert(base, Pod)


def at(seconds: int) -> str:
    return format_time(seconds * S)


# ---------------------------------------------------------------------------------------------- api


def test_time_round_trip_and_forms() -> None:
    assert parse_time("1970-01-01T00:00:01Z") == S
    assert parse_time("1970-01-01T00:00:01.5Z") == S + 500_000
    assert parse_time("1970-01-01T00:00:01.123456789Z") == S + 123_456  # nanoseconds truncated
    assert parse_time("1970-01-01T01:00:00+01:00") == 0
    assert format_time(S) == "1970-01-01T00:00:01Z" and format_time(S + 7) == "1970-01-01T00:00:01.000007Z"
    for t in (0, S, 1_700_000_000 * S + 123):
        assert parse_time(format_time(t)) == t
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time("yesterday")


def test_selector_errors_are_spec_errors() -> None:
    """The budget API refuses an empty selector with a SpecError naming the field (semantics: tests/kube)."""
    assert compile_selector(msgspec.convert({"matchLabels": {"a": "1"}}, LabelSelector)).matches({"a": "1"})
    with pytest.raises(SpecError, match="must not be empty") as err:
        compile_selector(LabelSelector())
    assert err.value.field == "spec.selector"
    bad = msgspec.convert({"matchExpressions": [{"key": "k", "operator": "Near", "values": ["v"]}]}, LabelSelector)
    with pytest.raises(SpecError) as err:
        compile_selector(bad)
    assert err.value.field == "spec.selector.matchExpressions[0].operator"


@pytest.mark.parametrize(("override", "field"), [
    ({"quota": {"gpuHours": "0", "windowHours": 1}}, "spec.quota.gpuHours"),
    ({"quota": {"gpuHours": "x", "windowHours": 1}}, "spec.quota.gpuHours"),
    ({"quota": {"gpuHours": "1", "windowHours": 0}}, "spec.quota.windowHours"),
    ({"quota": {"gpuHours": "1"}}, "spec.quota"),
    ({"quota": {"gpuHours": "1", "windowHours": 1, "window": {"calendar": "Day"}}}, "spec.quota"),
    ({"quota": {"gpuHours": "1", "window": {"calendar": "Year"}}}, "spec.quota.window.calendar"),
    ({"quota": {"gpuHours": "1", "window": {"calendar": "Day", "timeZone": "Europe/Atlantis"}}},
     "spec.quota.window.timeZone"),
    ({"quota": {"gpuHours": "1", "window": {"calendar": "Day", "timeZone": "../../etc/passwd"}}},
     "spec.quota.window.timeZone"),
    ({"enforcement": {"action": "Kill"}}, "spec.enforcement.action"),
    ({"enforcement": {"delaySeconds": -1}}, "spec.enforcement.delaySeconds"),
    ({"selector": {}}, "spec.selector"),
])
def test_parse_spec_names_the_bad_field(override: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(spec(**override))
    assert err.value.field == field and str(err.value).startswith(field)


def test_parse_spec_units() -> None:
    p = parse_spec(spec(quota={"gpuHours": 3, "windowHours": 2}, enforcement={"delaySeconds": 5}))
    assert (p.quota, p.window, p.delay, p.action, p.resource) == (3, RollingWindow(2 * 3600 * S), 5 * S, "AlertOnly",
                                                                  "nvidia.com/gpu")
    assert parse_spec(spec(quota={"gpuHours": "500m", "windowHours": 1})).quota == Fraction(1, 2)


def test_a_calendar_window_parses_to_its_zone_and_names_itself_in_messages() -> None:
    p = parse_spec(spec(quota={"gpuHours": 3, "window": {"calendar": "Month", "timeZone": "Europe/Berlin"}}))
    assert p.window == CalendarWindow("Month", zoneinfo.ZoneInfo("Europe/Berlin"))
    assert (p.per, p.accounted_over, p.during) == ("calendar month (Europe/Berlin)",
                                                   "per calendar month (Europe/Berlin)",
                                                   "this calendar month (Europe/Berlin)")
    march = 1_772_319_600 * S  # 2026-03-01T00:00+01:00
    assert p.edge_at(march + 5 * S) == march and p.length_at(march) == 0
    utc = parse_spec(spec(quota={"gpuHours": 3, "window": {"calendar": "Week"}}))
    assert utc.window == CalendarWindow("Week", zoneinfo.ZoneInfo("UTC"))
    rolling = parse_spec(spec(quota={"gpuHours": 3, "windowHours": 24}))
    assert (rolling.accounted_over, rolling.during) == ("over a 24h window", "in the last 24h")


# ---------------------------------------------------------------------------------------------- pods


def test_pod_span_contract() -> None:
    pending = mkpod(status={"phase": "Pending"})
    assert pod_span(pending) == (None, None, False)
    running = mkpod(status={"phase": "Running", "startTime": at(5), "containerStatuses": [
        {"name": "c", "state": {"running": {"startedAt": at(9)}},
         "lastState": {"terminated": {"startedAt": at(7), "finishedAt": at(8)}}}]})
    assert pod_span(running) == (7 * S, None, False)  # earliest container start, lastState included
    only_start_time = mkpod(status={"phase": "Running", "startTime": at(5)})
    assert pod_span(only_start_time) == (5 * S, None, False)
    done = mkpod(status={"phase": "Succeeded", "containerStatuses": [
        {"name": "c", "state": {"terminated": {"startedAt": at(10), "finishedAt": at(20)}}},
        {"name": "d", "state": {"terminated": {"startedAt": at(11), "finishedAt": at(25)}}}],
        "initContainerStatuses": [{"name": "i", "state": {"terminated": {"startedAt": at(3), "finishedAt": at(4)}}}]})
    assert pod_span(done) == (3 * S, 25 * S, True)  # init containers hold the devices too
    deleting = mkpod(metadata={"deletionTimestamp": at(40)}, status={"phase": "Running", "containerStatuses": [
        {"name": "c", "state": {"terminated": {"startedAt": at(10), "finishedAt": at(30)}}}]})
    assert pod_span(deleting) == (10 * S, 30 * S, True)  # all containers ended: final before the phase says so
    unknown = mkpod(metadata={"deletionTimestamp": at(40)}, status={"phase": "Failed", "startTime": at(10),
                                                                    "containerStatuses": [
        {"name": "c", "state": {"terminated": {"reason": "ContainerStatusUnknown"}}}]})
    assert pod_span(unknown) == (10 * S, 40 * S, True)
    # a running pod that vanished ends when it was seen gone, or at its deletionTimestamp if earlier
    assert _departed_entry(running, 50 * S, Fraction(2)) == LedgerEntry(uid="u1", start=7 * S, end=50 * S, gpus=2)
    gone = mkpod(metadata={"deletionTimestamp": at(30)}, status=running.status and msgspec.to_builtins(running.status))
    assert _departed_entry(gone, 50 * S, Fraction(2)) == LedgerEntry(uid="u1", start=7 * S, end=30 * S, gpus=2)


def test_pod_gpus_is_the_effective_request() -> None:
    assert pod_gpus(mkpod(), "nvidia.com/gpu") == 2  # limits only: the request defaults to them
    init = mkpod(spec={"initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]})
    assert pod_gpus(init, "nvidia.com/gpu") == 4
    cpu = mkpod(spec={"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]})
    assert pod_gpus(cpu, "cpu") == Fraction(1, 10) and pod_gpus(cpu, "nvidia.com/gpu") == 0


def test_mig_slices_count_as_their_share_of_the_gpu_under_whole_gpus() -> None:
    """A 3g slice is 3/7 of an A100 or H100, a 2g slice 2/4 of an A30 (NVIDIA's MIG user guide); renamed
    requests (gpuops.io/mig-*) count like NVIDIA's; an unknown model falls back to N of 7; another resource name
    is not whole GPUs and counts only itself."""
    mig = mkpod(spec={"containers": [
        {"name": "a", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "2"}}},
        {"name": "b", "resources": {"limits": {"gpuops.io/mig-1g.10gb": "1", "nvidia.com/gpu": "1"}}}]})
    assert pod_gpus(mig, "nvidia.com/gpu", "NVIDIA-A100-SXM4-80GB") == 1 + 2 * Fraction(3, 7) + Fraction(1, 7)
    assert pod_gpus(mig, "nvidia.com/gpu") == 1 + Fraction(6, 7) + Fraction(1, 7)  # model unknown: N of 7
    assert pod_gpus(mig, "nvidia.com/mig-3g.40gb") == 2
    a30 = mkpod(spec={"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/mig-2g.12gb": "1"}}}]})
    assert pod_gpus(a30, "nvidia.com/gpu", "NVIDIA-A30") == Fraction(1, 2)
    odd = mkpod(spec={"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/mig-custom": "1"}}}]})
    assert pod_gpus(odd, "nvidia.com/gpu", "NVIDIA-A100-SXM4-80GB") == 1  # no compute count: a whole GPU


# ---------------------------------------------------------------------------------------------- ledger, diff


def test_ledger_status_round_trip_is_exact() -> None:
    ledger = Ledger(
        entries=(LedgerEntry(uid="a", start=S, end=3 * S + 5, gpus=Fraction(1, 10)),),
        buckets=(LedgerBucket(start=0, end=15 * S, gpu_micros=Fraction(15, 2) * S, peak_gpus=Fraction(3, 2)),),
    )
    book = Book(ledger, {"a": "pod-a"}, compacted_through=S // 2)
    st = ledger_to_status(book, resource="cpu", max_entries=500, bucket_width=15 * S, error=Fraction(0))
    assert st.entries is not None and (st.entries[0].name, st.entries[0].gpus) == ("pod-a", "100m")
    assert st.buckets is not None and st.buckets[0].gpu_seconds == "7500m" and st.bucket_seconds == 15
    assert ledger_from_status(msgspec.convert(msgspec.to_builtins(st), LedgerStatus), "cpu") == book
    assert ledger_from_status(st, "nvidia.com/gpu") == Book()  # another resource: not comparable


def test_late_parts_survive_the_status_round_trip_and_a_damaged_mark_keeps_the_usage() -> None:
    """What was counted past a pod's recorded finish is kept in status (entry recordedEnd, bucket
    lateGpuSeconds), so a restarted operator still names it in the error bound."""
    ledger = Ledger(
        entries=(LedgerEntry(uid="a", start=S, end=3 * S + 5, gpus=Fraction(2), late=S // 2),),
        buckets=(LedgerBucket(start=0, end=15 * S, gpu_micros=Fraction(15, 2) * S, peak_gpus=Fraction(3, 2),
                              late_gpu_micros=Fraction(1, 4) * S),),
    )
    book = Book(ledger, {"a": "pod-a"})
    st = ledger_to_status(book, resource="cpu", max_entries=500, bucket_width=15 * S, error=Fraction(0))
    assert st.entries is not None and st.entries[0].recorded_end == format_time(5 * S // 2 + 5)
    assert st.buckets is not None and st.buckets[0].late_gpu_seconds == "250m"
    assert ledger_from_status(msgspec.convert(msgspec.to_builtins(st), LedgerStatus), "cpu") == book
    plain = ledger_to_status(Book(Ledger(entries=(LedgerEntry(uid="b", start=0, end=S, gpus=Fraction(1)),))),
                             resource="cpu", max_entries=500, bucket_width=15 * S, error=Fraction(0))
    assert "recordedEnd" not in msgspec.json.encode(plain).decode()  # no late part: no mark
    for mark, late in (("not a time", 0), (format_time(0), 3 * S + 5 - S), (format_time(9 * S), 0)):
        damaged = msgspec.structs.replace(st.entries[0], recorded_end=mark)  # unreadable, before start, after end
        got = ledger_from_status(msgspec.structs.replace(st, entries=(damaged,)), "cpu")
        assert got.ledger.entries == (msgspec.structs.replace(ledger.entries[0], late=late),), mark


def test_an_unreadable_ledger_item_is_skipped_and_logged_and_the_rest_kept() -> None:
    """A damaged entry or bucket (edited by hand, written by a newer version) costs only itself: every readable
    item before and after it is read, and a warning names the item and the error."""
    ledger = Ledger(entries=tuple(LedgerEntry(uid=u, start=S, end=3 * S, gpus=Fraction(1)) for u in "abc"),
                    buckets=tuple(LedgerBucket(start=i * 15 * S, end=(i + 1) * 15 * S, gpu_micros=Fraction(S),
                                               peak_gpus=Fraction(1)) for i in range(3)))
    st = ledger_to_status(Book(ledger), resource="cpu", max_entries=500, bucket_width=15 * S, error=Fraction(0))
    assert st.entries is not None and st.buckets is not None
    entries = (st.entries[0], msgspec.structs.replace(st.entries[1], end="yesterday"), st.entries[2])
    buckets = (st.buckets[0], msgspec.structs.replace(st.buckets[1], gpu_seconds="lots"), st.buckets[2])
    with capture_logs() as logs:
        got = ledger_from_status(msgspec.structs.replace(st, entries=entries, buckets=buckets), "cpu")
    assert got.ledger.entries == (ledger.entries[0], ledger.entries[2])
    assert got.ledger.buckets == (ledger.buckets[0], ledger.buckets[2])
    assert [(e["event"], e["log_level"], e.get("uid", e.get("start"))) for e in logs] == [
        ("ledger entry unreadable; skipped", "warning", "b"),
        ("ledger bucket unreadable; skipped", "warning", st.buckets[1].start)]
    assert all("yesterday" in e["error"] or "lots" in e["error"] for e in logs), logs
    damaged = msgspec.structs.replace(st.entries[0], recorded_end="soon")
    with capture_logs() as logs:
        ledger_from_status(msgspec.structs.replace(st, entries=(damaged,), buckets=()), "cpu")
    assert [(e["event"], e["log_level"], e["uid"], "soon" in e["error"]) for e in logs] == [
        ("ledger entry's recordedEnd unreadable; its late part is not marked", "warning", "a", True)]


def test_ledger_memo_parses_and_formats_each_entry_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reconcile reads and rewrites the whole ledger (up to 500 entries); with the budget's memo an entry
    is parsed and formatted once (two thirds of a reconcile's time went there, measured with bench/scale.py), the
    results are the same as without it, and the memo keeps only the entries still in the ledger."""
    parsed: list[str] = []
    formatted: list[int] = []
    real_parse, real_format = ledger_mod.parse_time, ledger_mod.format_time
    monkeypatch.setattr(ledger_mod, "parse_time", lambda t: parsed.append(t) or real_parse(t))
    monkeypatch.setattr(ledger_mod, "format_time", lambda t: formatted.append(t) or real_format(t))
    entries = tuple(LedgerEntry(uid=f"u{i}", start=i * S, end=(i + 5) * S, gpus=Fraction(1)) for i in range(10))
    book = Book(Ledger(entries=entries), {e.uid: e.uid for e in entries})
    memo = LedgerMemo()
    kw: dict[str, Any] = {"resource": "cpu", "max_entries": 500, "bucket_width": 15 * S, "error": Fraction(0)}
    st = ledger_to_status(book, **kw, memo=memo)
    assert st == ledger_to_status(book, **kw)  # the same status as without a memo
    formatted.clear()
    assert ledger_to_status(book, **kw, memo=memo) == st and formatted == []  # nothing formatted again
    assert ledger_from_status(st, "cpu", memo) == book == ledger_from_status(st, "cpu")
    parsed.clear()
    assert ledger_from_status(st, "cpu", memo) == book and parsed == []  # nothing parsed again
    # the ledger drops u0..u4 and gains u10: only u10 is new work, and the memo holds exactly the ledger
    later = (*entries[5:], LedgerEntry(uid="u10", start=10 * S, end=20 * S, gpus=Fraction(2)))
    book2 = Book(Ledger(entries=later), {e.uid: e.uid for e in later})
    formatted.clear()
    st2 = ledger_to_status(book2, **kw, memo=memo)
    assert formatted == [10 * S, 20 * S] and set(memo.texts) == set(later)
    parsed.clear()
    assert ledger_from_status(st2, "cpu", memo) == book2
    assert len(parsed) == 2 and len(memo.parsed) == len(later)


def test_compaction_merges_up_to_a_watermark_and_keeps_open_pods() -> None:
    entries = [LedgerEntry(uid=f"u{i}", start=i * S, end=(i + 10) * S, gpus=Fraction(1)) for i in range(20)]
    book = Book(Ledger(), {e.uid: e.uid for e in entries})
    out = compact(book, entries, now=100 * S, window=3600 * S, max_entries=5, bucket_width=15 * S,
                  open_uids={"u0"}, margin=60 * S)
    # 15 over the limit; the oldest by end that are not open merge: u1..u15 (ends 11..25 s); u0 is open
    assert out.compacted_through == 25 * S
    kept = {"u0", "u16", "u17", "u18", "u19"}
    assert {e.uid for e in out.ledger.entries} == kept and set(out.names) == kept
    merged = sum((b.gpu_micros for b in out.ledger.buckets), Fraction(0))
    assert merged == 15 * 10 * S  # nothing lost in the buckets
    assert out.covers(25 * S) and not out.covers(26 * S)
    again = compact(out, [], now=101 * S, window=3600 * S, max_entries=5, bucket_width=15 * S, open_uids=(),
                    margin=60 * S)
    assert again == out
    recent = compact(Book(), entries, now=30 * S, window=3600 * S, max_entries=5, bucket_width=15 * S,
                     open_uids=(), margin=60 * S)
    assert recent.compacted_through is None and len(recent.ledger.entries) == 20  # all ended < 60 s ago


def test_status_diff_sends_only_changes() -> None:
    old = BudgetStatus(consumed_gpu_hours="1.000000", tracked_pods=2, exhausts_at="x",
                       ledger=LedgerStatus(resource_name="r", error_bound_gpu_hours="0.000000"))
    new = msgspec.structs.replace(old, tracked_pods=0, exhausts_at=None,
                                  ledger=LedgerStatus(resource_name="r", error_bound_gpu_hours="0.000001"))
    assert merge_patch(old, new) == {"trackedPods": 0, "exhaustsAt": None,
                                     "ledger": {"errorBoundGpuHours": "0.000001"}}
    assert merge_patch(old, old) == {}
