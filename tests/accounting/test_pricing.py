"""Priced and weighted GPU-hours against a step-by-step sum written here from the definition: each microsecond a
record holds its GPUs, it adds `gpus * factor` of the version in force at that microsecond. Instants are small
(0 to 3,000) so the sum can walk every one of them."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.gpuhours import (
    MICROS_PER_HOUR,
    Interval,
    Ledger,
    LedgerEntry,
    compact_ledger,
    gpu_hours,
    window_usage,
)
from gpuops.accounting.pricing import (
    CAPACITIES,
    UNITS,
    Attribution,
    PriceTable,
    PriceVersion,
    Rates,
    Unit,
    factor,
    in_unit,
    ledger_in_unit,
    mig_share,
    totals_by_key,
    version_at,
    version_starts,
)

F = Fraction
H = MICROS_PER_HOUR
MODELS = ("H100", "L4", "")
AMOUNTS = st.sampled_from([F(0), F(1, 4), F(1), F(3, 2), F(4), F(7, 3)])


@st.composite
def tables(draw: st.DrawFn) -> PriceTable:
    def rates() -> Rates:
        return Rates(on_demand=draw(AMOUNTS), spot=draw(AMOUNTS), weight=draw(AMOUNTS))

    named = draw(st.lists(st.sampled_from(MODELS[:2]), unique=True))
    return PriceTable(rates={m: rates() for m in named}, fallback=rates())


@st.composite
def histories(draw: st.DrawFn) -> list[PriceVersion]:
    starts = sorted(draw(st.sets(st.integers(0, 3_000), min_size=1, max_size=4)))
    return [PriceVersion(since=s, table=draw(tables())) for s in starts]


@st.composite
def attributed(draw: st.DrawFn) -> list[tuple[Interval, Attribution]]:
    out = []
    for i in range(draw(st.integers(0, 4))):
        start = draw(st.integers(0, 3_000))
        end = None if draw(st.booleans()) else start + draw(st.integers(0, 1_500))
        late = 0 if end is None else draw(st.integers(0, end - start))
        record = Interval(uid=f"p{i}", start=start, end=end, gpus=draw(AMOUNTS), late=late)
        out.append((record, Attribution(draw(st.sampled_from(MODELS)), draw(st.sampled_from(CAPACITIES)))))
    return out


def per_hour(table: PriceTable, model: str, capacity: str, unit: Unit) -> Fraction:
    """What one GPU-hour counts for, read from the table directly."""
    rates = table.rates.get(model, table.fallback)
    return {"GPUHours": F(1), "WeightedGPUHours": rates.weight,
            "Cost": rates.spot if capacity == "Spot" else rates.on_demand}[unit]


def stepwise(records: list[tuple[Interval, Attribution]], versions: list[PriceVersion], unit: Unit, *, now: int,
             window: int) -> Fraction:
    """The definition, one microsecond at a time."""
    total = F(0)
    for record, (model, capacity) in records:
        stop = now if record.end is None else min(record.end, now)
        for t in range(max(record.start, now - window), stop):
            v = max((x for x in versions if x.since <= t), key=lambda x: x.since, default=versions[0])
            total += record.gpus * per_hour(v.table, model, capacity, unit)
    return total / H


moments = st.integers(0, 4_500)
windows = st.integers(0, 4_500)


@settings(max_examples=200, deadline=None)
@given(attributed(), histories(), st.sampled_from(UNITS), moments, windows)
def test_usage_in_any_unit_is_the_stepwise_sum_at_the_prices_in_force(
        records: list[tuple[Interval, Attribution]], versions: list[PriceVersion], unit: Unit, now: int,
        window: int) -> None:
    pieces = in_unit(records, versions, unit)
    assert gpu_hours(pieces, now=now, window=window) == stepwise(records, versions, unit, now=now, window=window)
    assert len({p.uid for p in pieces}) == len(pieces)  # no piece is deduplicated away
    cuts = sum(1 for r, _ in records for v in versions[1:] if r.start < v.since and (r.end is None or v.since < r.end))
    assert len(pieces) == len(records) + cuts  # cut where a later version begins inside a record, nowhere else


def key_of(a: Attribution) -> str:
    return f"{a.model}|{a.capacity}"


def attribution_of(key: str) -> Attribution:
    model, _, capacity = key.rpartition("|")
    assert capacity in CAPACITIES
    return Attribution(model, "Spot" if capacity == "Spot" else "OnDemand")


def by_key(records: list[tuple[Interval, Attribution]]) -> dict[str, list[Interval]]:
    out: dict[str, list[Interval]] = {}
    for r, a in records:
        out.setdefault(key_of(a), []).append(r)
    return out


@settings(max_examples=200, deadline=None)
@given(attributed(), histories(), moments, windows)
def test_gpu_hours_are_the_plain_ones_and_the_totals_by_key_add_up(
        records: list[tuple[Interval, Attribution]], versions: list[PriceVersion], now: int, window: int) -> None:
    plain = [r for r, _ in records]
    assert gpu_hours(in_unit(records, versions, "GPUHours"), now=now, window=window) == gpu_hours(
        plain, now=now, window=window)
    parts = totals_by_key(by_key(records), Ledger(), attribution_of, versions, now=now, window=window)
    for unit, index in zip(UNITS, range(3), strict=True):
        assert sum((t[index] for t in parts.values()), F(0)) == stepwise(records, versions, unit, now=now,
                                                                         window=window)
    for key, totals in parts.items():
        mine = [(r, a) for r, a in records if key_of(a) == key]
        assert totals.cost == stepwise(mine, versions, "Cost", now=now, window=window)


@settings(max_examples=200, deadline=None)
@given(attributed(), histories(), st.sampled_from(UNITS), st.integers(1, 40), st.integers(0, 3))
def test_compacted_usage_keeps_the_prices_in_force_when_it_ran(
        records: list[tuple[Interval, Attribution]], versions: list[PriceVersion], unit: Unit, width: int,
        keep: int) -> None:
    """Finished records merged into buckets cut where a version begins: each bucket is priced by the version at
    its start, so with the whole history in the window (no bucket straddles its edge) the figures by key and in
    total are exact, the same as before compaction."""
    entries = tuple(LedgerEntry(uid=r.uid, start=r.start, end=r.end, gpus=r.gpus, late=r.late, key=key_of(a))
                    for r, a in records if r.end is not None)
    finished = [(r, a) for r, a in records if r.end is not None]
    now = 4_600
    compacted = compact_ledger(Ledger(entries=entries), now=now, window=now + 1, max_entries=keep,
                               bucket_width=width, cuts=version_starts(versions))
    starts = version_starts(versions)
    assert not any(b.start < s < b.end for b in compacted.buckets for s in starts)  # no bucket spans a change
    def nonzero(ledger: Ledger) -> dict[str, tuple[Fraction, ...]]:  # a record of 0 GPUs makes no bucket
        got = totals_by_key({}, ledger, attribution_of, versions, now=now, window=now + 1)
        return {k: tuple(t) for k, t in got.items() if any(t)}

    assert nonzero(compacted) == nonzero(Ledger(entries=entries))
    pieces, ledger = ledger_in_unit({}, compacted, attribution_of, versions, unit)
    usage = window_usage(pieces, ledger, now=now, window=now + 1, quota=F(10**9))
    assert usage.consumed == stepwise(finished, versions, unit, now=now, window=now + 1)


@settings(max_examples=200, deadline=None)
@given(attributed(), histories(), st.sampled_from(UNITS), st.integers(1, 3_000), tables())
def test_a_new_price_version_never_changes_what_earlier_time_counted(
        records: list[tuple[Interval, Attribution]], versions: list[PriceVersion], unit: Unit, later: int,
        table: PriceTable) -> None:
    since = versions[-1].since + later
    changed = [*versions, PriceVersion(since=since, table=table)]
    for now in (since - 1, since):
        before = gpu_hours(in_unit(records, versions, unit), now=now, window=now + 1)
        assert gpu_hours(in_unit(records, changed, unit), now=now, window=now + 1) == before


@settings(max_examples=200, deadline=None)
@given(attributed(), histories(), st.sampled_from(UNITS), moments, st.integers(1, 4_000),
       st.integers(0, 3_000))
def test_the_quota_in_a_unit_is_reached_where_the_stepwise_sum_reaches_it(
        records: list[tuple[Interval, Attribution]], versions: list[PriceVersion], unit: Unit, now: int,
        window: int, quota_micros: int) -> None:
    """Over quota, and the first over-quota instant, in the unit: the window arithmetic on the scaled pieces."""
    quota = F(quota_micros, H)
    usage = window_usage(in_unit(records, versions, unit), now=now, window=window, quota=quota)
    assert usage.over_quota == (stepwise(records, versions, unit, now=now, window=window) >= quota)
    hit = usage.exhausted_at
    if hit is not None and hit <= 6_000:
        assert stepwise(records, versions, unit, now=hit, window=window) >= quota
        assert stepwise(records, versions, unit, now=hit - 1, window=window) < quota


def test_a_ledger_entry_split_at_a_price_change_keeps_its_late_part_at_its_end() -> None:
    cheap, dear = (PriceTable(rates={}, fallback=Rates(on_demand=F(p), spot=F(p))) for p in (1, 3))
    versions = [PriceVersion(since=0, table=cheap), PriceVersion(since=100, table=dear)]
    entry = LedgerEntry(uid="e", start=50, end=130, gpus=F(2), late=40)
    first, second = in_unit([(entry, Attribution("", "OnDemand"))], versions, "Cost")
    assert (first.uid, first.start, first.end, first.gpus, first.late) == ("e", 50, 100, 2, 10)
    assert (second.uid, second.start, second.end, second.gpus, second.late) == ("e#1", 100, 130, 6, 30)


def test_a_record_starting_as_a_version_begins_is_one_piece_at_that_version() -> None:
    cheap, dear = (PriceTable(rates={}, fallback=Rates(on_demand=F(p), spot=F(p))) for p in (1, 3))
    versions = [PriceVersion(since=0, table=cheap), PriceVersion(since=100, table=dear)]
    pieces = in_unit([(Interval(uid="a", start=100, end=150, gpus=F(1)), Attribution("", "Spot"))], versions, "Cost")
    assert [(p.uid, p.start, p.end, p.gpus) for p in pieces] == [("a", 100, 150, 3)]


def test_a_model_without_an_entry_and_an_unknown_one_pay_the_fallback() -> None:
    table = PriceTable(rates={"H100": Rates(on_demand=F(4), spot=F(2), weight=F(4))},
                       fallback=Rates(on_demand=F(1), spot=F(1, 2)))
    assert (table.of("H100").spot, table.of("A10").spot, table.of("").weight) == (2, F(1, 2), 1)
    assert version_at([PriceVersion(since=10, table=table)], 0).since == 10  # the first holds before it too
    two = [PriceVersion(since=10, table=table), PriceVersion(since=20, table=table)]
    assert [version_at(two, t).since for t in (19, 20, 21)] == [10, 20, 20]  # in force from its own instant


@pytest.mark.parametrize(("make", "words"), [
    (lambda: Rates(on_demand=F(-1), spot=F(0)), "Rates.on_demand must be a Fraction >= 0"),
    (lambda: version_at([], 0), "at least one price version"),
    (lambda: version_at([PriceVersion(since=5, table=PriceTable(rates={}, fallback=Rates(on_demand=F(0),
                                                                                         spot=F(0)))),
                         PriceVersion(since=5, table=PriceTable(rates={}, fallback=Rates(on_demand=F(0),
                                                                                         spot=F(0))))], 0),
     "strictly increasing order"),
    (lambda: factor(Rates(on_demand=F(0), spot=F(0)), "Spot", "Dollars"), "unknown unit 'Dollars'"),  # type: ignore[arg-type]
])
def test_bad_input_is_refused_with_a_message_naming_it(make: object, words: str) -> None:
    with pytest.raises(AccountingError, match=words):
        make()  # type: ignore[operator]


@pytest.mark.parametrize(("model", "profile", "share"), [
    ("NVIDIA-A100-SXM4-80GB", "1g.10gb", F(1, 7)),
    ("A100-80GB", "3g.40gb", F(3, 7)),
    ("A100-40GB", "nvidia.com/mig-4g.20gb", F(4, 7)),
    ("A100-80GB", "7g.80gb", F(1)),
    ("NVIDIA-H100-80GB-HBM3", "2g.20gb", F(2, 7)),
    ("A30", "2g.12gb", F(2, 4)),
    ("A30", "1g.6gb+me", F(1, 4)),
])
def test_a_mig_slice_is_charged_as_its_compute_share_of_the_gpu(model: str, profile: str, share: Fraction) -> None:
    """NVIDIA's user guide: A100 and H100 have 7 compute slices, the A30 has 4."""
    assert mig_share(model, profile) == share
