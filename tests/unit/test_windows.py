"""Time windows (backfill/routes/gates/window.py): every rule in three zones, one southern, on both
DST nights of 2025, plus properties over random windows and instants."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from backfill.routes.gates.window import (
    DAYS,
    TimeWindow,
    is_open,
    load_zone,
    next_change,
    window_state,
)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def window(zone: str, days: list[str], start: str, end: str) -> TimeWindow:
    return TimeWindow.model_validate({"time_zone": zone, "days": days, "from": start, "until": end})


@dataclass(frozen=True)
class Zone:
    """One zone's 2025 clock changes, with the instants written out by hand (UTC)."""

    name: str
    offset_h: int
    """Standard offset from UTC in hours, for the ordinary-day cases (January / July)."""
    ordinary_monday: str
    """A Monday with no clock change near it, in standard time (local date)."""
    spring_sat: str
    """The local Saturday before the night the clocks go forward."""
    spring_evening_utc: str
    """Saturday 19:00 local, before the jump."""
    spring_morning_utc: str
    """Sunday 07:00 local, after the jump."""
    gap_time: str
    """A local time skipped that Sunday."""
    gap_end_utc: str
    """The instant the clocks jump (first instant after the skipped hour)."""
    fall_sat: str
    fall_evening_utc: str
    fall_morning_utc: str
    repeated_time: str
    """A local time that happens twice that Sunday."""
    repeated_first_utc: str
    repeated_second_utc: str


NEW_YORK = Zone(
    "America/New_York",
    -5,
    "2025-01-13",
    "2025-03-08",
    "2025-03-09T00:00",  # 19:00 EST
    "2025-03-09T11:00",  # 07:00 EDT
    "02:30",
    "2025-03-09T07:00",  # 02:00 EST -> 03:00 EDT
    "2025-11-01",
    "2025-11-01T23:00",  # 19:00 EDT
    "2025-11-02T12:00",  # 07:00 EST
    "01:30",
    "2025-11-02T05:30",  # 01:30 EDT
    "2025-11-02T06:30",  # 01:30 EST
)
BERLIN = Zone(
    "Europe/Berlin",
    1,
    "2025-01-13",
    "2025-03-29",
    "2025-03-29T18:00",  # 19:00 CET
    "2025-03-30T05:00",  # 07:00 CEST
    "02:30",
    "2025-03-30T01:00",  # 02:00 CET -> 03:00 CEST
    "2025-10-25",
    "2025-10-25T17:00",  # 19:00 CEST
    "2025-10-26T06:00",  # 07:00 CET
    "02:30",
    "2025-10-26T00:30",  # 02:30 CEST
    "2025-10-26T01:30",  # 02:30 CET
)
SYDNEY = Zone(  # southern: summer time from October to April
    "Australia/Sydney",
    10,
    "2025-07-14",
    "2025-10-04",
    "2025-10-04T09:00",  # 19:00 AEST
    "2025-10-04T20:00",  # 07:00 AEDT
    "02:30",
    "2025-10-04T16:00",  # 02:00 AEST -> 03:00 AEDT
    "2025-04-05",
    "2025-04-05T08:00",  # 19:00 AEDT
    "2025-04-05T21:00",  # 07:00 AEST
    "02:30",
    "2025-04-05T15:30",  # 02:30 AEDT
    "2025-04-05T16:30",  # 02:30 AEST
)
ZONES = [NEW_YORK, BERLIN, SYDNEY]
zones = pytest.mark.parametrize("z", ZONES, ids=[z.name for z in ZONES])


def local(z: Zone, day: str, hh_mm: str, plus_days: int = 0) -> datetime:
    """An unambiguous local wall time on an ordinary (standard-time) day, as UTC."""
    wall = datetime.fromisoformat(f"{day}T{hh_mm}") + timedelta(days=plus_days)
    return (wall - timedelta(hours=z.offset_h)).replace(tzinfo=UTC)


def next_day(day: str) -> str:
    return (datetime.fromisoformat(day) + timedelta(days=1)).date().isoformat()


# --- ordinary days -------------------------------------------------------------------------


@zones
def test_same_day_window_opens_and_closes_at_local_times(z: Zone) -> None:
    w = window(z.name, ["mon", "tue", "wed", "thu", "fri"], "09:00", "17:00")
    mon = z.ordinary_monday
    assert window_state(w, local(z, mon, "08:59")).open is False
    assert next_change(w, local(z, mon, "08:59")) == local(z, mon, "09:00")
    assert is_open(w, local(z, mon, "09:00")) is True
    assert next_change(w, local(z, mon, "12:00")) == local(z, mon, "17:00")
    assert is_open(w, local(z, mon, "17:00")) is False
    assert next_change(w, local(z, mon, "17:00")) == local(z, mon, "09:00", plus_days=1)
    # Friday 17:00 -> next opening is Monday 09:00.
    assert next_change(w, local(z, mon, "17:30", plus_days=4)) == local(
        z, mon, "09:00", plus_days=7
    )
    assert is_open(w, local(z, mon, "12:00", plus_days=5)) is False  # Saturday


@zones
def test_days_are_the_days_a_window_starts(z: Zone) -> None:
    w = window(z.name, ["fri"], "19:00", "07:00")
    fri = (datetime.fromisoformat(z.ordinary_monday) + timedelta(days=4)).date().isoformat()
    assert is_open(w, local(z, fri, "18:59")) is False
    assert is_open(w, local(z, fri, "19:00")) is True
    assert is_open(w, local(z, fri, "06:59", plus_days=1)) is True  # Saturday morning
    assert next_change(w, local(z, fri, "23:00")) == local(z, fri, "07:00", plus_days=1)
    assert is_open(w, local(z, fri, "07:00", plus_days=1)) is False
    # Saturday evening is not a start day: the next opening is a week later.
    assert is_open(w, local(z, fri, "20:00", plus_days=1)) is False
    assert next_change(w, local(z, fri, "20:00", plus_days=1)) == local(
        z, fri, "19:00", plus_days=7
    )
    # Thursday is not a start day, so Friday early morning is closed.
    assert is_open(w, local(z, fri, "03:00")) is False


@zones
def test_end_before_start_spans_midnight(z: Zone) -> None:
    w = window(z.name, list(DAYS), "22:00", "02:00")
    mon = z.ordinary_monday
    assert next_change(w, local(z, mon, "21:00")) == local(z, mon, "22:00")
    assert next_change(w, local(z, mon, "22:00")) == local(z, mon, "02:00", plus_days=1)
    assert is_open(w, local(z, mon, "00:30", plus_days=1)) is True
    assert is_open(w, local(z, mon, "02:00", plus_days=1)) is False


@zones
def test_start_equal_to_end_is_the_whole_day(z: Zone) -> None:
    mon = z.ordinary_monday
    midnight = window(z.name, ["mon"], "00:00", "00:00")
    assert is_open(midnight, local(z, mon, "00:00")) is True
    assert is_open(midnight, local(z, mon, "23:59")) is True
    assert next_change(midnight, local(z, mon, "00:00")) == local(z, mon, "00:00", plus_days=1)
    assert is_open(midnight, local(z, mon, "00:00", plus_days=1)) is False
    assert is_open(midnight, local(z, mon, "23:59", plus_days=-1)) is False

    noon = window(z.name, ["mon"], "12:00", "12:00")
    assert is_open(noon, local(z, mon, "11:59")) is False
    assert next_change(noon, local(z, mon, "12:00")) == local(z, mon, "12:00", plus_days=1)
    assert is_open(noon, local(z, mon, "11:59", plus_days=1)) is True  # Tuesday morning


@zones
def test_consecutive_whole_days_make_one_stretch(z: Zone) -> None:
    w = window(z.name, ["mon", "tue", "wed"], "00:00", "00:00")
    mon = z.ordinary_monday
    assert next_change(w, local(z, mon, "10:00")) == local(z, mon, "00:00", plus_days=3)
    every_day = window(z.name, list(DAYS), "08:00", "08:00")
    assert window_state(every_day, local(z, mon, "10:00")) == window_state(
        every_day, local(z, mon, "07:00")
    )
    assert is_open(every_day, local(z, mon, "10:00")) is True
    assert next_change(every_day, local(z, mon, "10:00")) is None


# --- the night the clocks go forward -------------------------------------------------------


@zones
def test_overnight_window_is_an_hour_shorter_in_spring(z: Zone) -> None:
    w = window(z.name, ["sat"], "19:00", "07:00")
    evening, morning = utc(z.spring_evening_utc), utc(z.spring_morning_utc)
    assert morning - evening == timedelta(hours=11)
    assert next_change(w, evening - timedelta(minutes=1)) == evening
    assert next_change(w, evening) == morning
    assert is_open(w, morning - timedelta(seconds=1)) is True
    assert is_open(w, morning) is False


@zones
def test_start_in_the_skipped_hour_does_not_open_that_night(z: Zone) -> None:
    sunday = next_day(z.spring_sat)
    w = window(z.name, ["sun"], z.gap_time, "05:00")
    jump = utc(z.gap_end_utc)
    before = utc(z.spring_evening_utc)  # Saturday evening
    for t in (before, jump, jump + timedelta(minutes=30), jump + timedelta(hours=1, minutes=30)):
        assert is_open(w, t) is False
    # The next opening is the following Sunday (a week later, same DST regime).
    later = datetime.fromisoformat(f"{sunday}T{z.gap_time}") + timedelta(days=7)
    expected = later.replace(tzinfo=load_zone(z.name)).astimezone(UTC)
    assert next_change(w, before) == expected
    # The same start on an every-day window: the night before the jump runs normally, the
    # skipped night does not open at all.
    daily = window(z.name, list(DAYS), z.gap_time, "05:00")
    assert next_change(daily, jump) == expected - timedelta(days=6)


@zones
def test_end_in_the_skipped_hour_ends_when_the_clocks_jump(z: Zone) -> None:
    w = window(z.name, ["sat"], "22:00", z.gap_time)
    jump = utc(z.gap_end_utc)
    assert next_change(w, utc(z.spring_evening_utc) + timedelta(hours=4)) == jump
    assert is_open(w, jump - timedelta(seconds=1)) is True
    assert is_open(w, jump) is False


@zones
def test_whole_day_window_starting_in_the_skipped_hour_closes_from_the_jump(z: Zone) -> None:
    w = window(z.name, list(DAYS), z.gap_time, z.gap_time)
    jump = utc(z.gap_end_utc)
    assert is_open(w, jump - timedelta(seconds=1)) is True
    assert next_change(w, jump - timedelta(hours=3)) == jump
    reopen = datetime.fromisoformat(f"{next_day(next_day(z.spring_sat))}T{z.gap_time}")
    assert next_change(w, jump) == reopen.replace(tzinfo=load_zone(z.name)).astimezone(UTC)


# --- the night the clocks go back ----------------------------------------------------------


@zones
def test_overnight_window_is_an_hour_longer_in_autumn(z: Zone) -> None:
    w = window(z.name, ["sat"], "19:00", "07:00")
    evening, morning = utc(z.fall_evening_utc), utc(z.fall_morning_utc)
    assert morning - evening == timedelta(hours=13)
    assert next_change(w, evening - timedelta(hours=1)) == evening
    assert next_change(w, evening) == morning
    assert is_open(w, utc(z.repeated_second_utc)) is True


@zones
def test_start_in_the_repeated_hour_opens_at_the_first_occurrence(z: Zone) -> None:
    w = window(z.name, ["sun"], z.repeated_time, "05:00")
    first, second = utc(z.repeated_first_utc), utc(z.repeated_second_utc)
    assert second - first == timedelta(hours=1)
    assert next_change(w, first - timedelta(hours=2)) == first
    assert is_open(w, first - timedelta(seconds=1)) is False
    assert is_open(w, first) is True
    assert is_open(w, second) is True


@zones
def test_end_in_the_repeated_hour_ends_at_the_first_occurrence(z: Zone) -> None:
    w = window(z.name, ["sat"], "22:00", z.repeated_time)
    first, second = utc(z.repeated_first_utc), utc(z.repeated_second_utc)
    assert next_change(w, first - timedelta(hours=2)) == first
    assert is_open(w, first) is False
    assert is_open(w, second) is False


# --- the model ------------------------------------------------------------------------------


def errors(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ValidationError) as e:
        TimeWindow.model_validate(data)
    return {".".join(str(p) for p in err["loc"]): err["msg"] for err in e.value.errors()}


GOOD = {"time_zone": "Europe/Berlin", "days": ["mon"], "from": "19:00", "until": "07:00"}


def test_settings_document_shape_round_trips() -> None:
    w = TimeWindow.model_validate(GOOD)
    assert w.from_ == "19:00" and w.until == "07:00"
    assert w.model_dump() == GOOD
    assert TimeWindow.model_validate_json(w.model_dump_json()) == w


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        ({"time_zone": "Mars/Olympus_Mons"}, "time_zone", "unknown IANA time zone"),
        ({"time_zone": "America"}, "time_zone", "unknown IANA time zone"),
        ({"time_zone": "../../etc/passwd"}, "time_zone", "not an IANA time zone name"),
        ({"time_zone": ""}, "time_zone", "not an IANA time zone name"),
        ({"days": []}, "days", "at least 1 item"),
        ({"days": ["mon", "tue", "mon"]}, "days", "'mon' is listed more than once"),
        ({"days": ["monday"]}, "days.0", "'mon', 'tue'"),
        ({"from": "7:00"}, "from", "HH:MM"),
        ({"from": "24:00"}, "from", "HH:MM"),
        ({"until": "12:60"}, "until", "HH:MM"),
        ({"until": "12:00:00"}, "until", "HH:MM"),
    ],
)
def test_validation_errors_name_the_field(change: dict[str, Any], field: str, text: str) -> None:
    found = errors({**GOOD, **change})
    assert list(found) == [field]
    assert text in found[field]


def test_unknown_field_and_naive_now_are_refused() -> None:
    assert "extra" in errors({**GOOD, "timezone": "UTC"})["timezone"].lower()
    with pytest.raises(ValueError, match="timezone-aware"):
        is_open(TimeWindow.model_validate(GOOD), datetime(2025, 1, 1))


def test_zones_come_from_the_pinned_tzdata_package() -> None:
    import tzdata

    zone = load_zone("Europe/Berlin")
    assert zone.key == "Europe/Berlin" and load_zone("Europe/Berlin") is zone
    assert tzdata.IANA_VERSION  # the package is installed and versioned


# --- properties ----------------------------------------------------------------------------

PROPERTY_ZONES = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Sydney",
    "Australia/Lord_Howe",  # 30-minute DST shift
    "America/Santiago",  # southern, changes at midnight
    "Asia/Kolkata",  # no DST
    "UTC",
]
CHANGES_2025 = [  # instants near which property tests look harder
    utc(s)
    for s in (
        NEW_YORK.gap_end_utc,
        NEW_YORK.repeated_second_utc,
        BERLIN.gap_end_utc,
        BERLIN.repeated_second_utc,
        SYDNEY.gap_end_utc,
        SYDNEY.repeated_second_utc,
        "2025-04-06T03:00",  # Santiago: 00:00 -03 -> 23:00 -04
        "2025-09-07T04:00",  # Santiago: 00:00 -04 -> 01:00 -03
        "2025-04-05T15:00",  # Lord Howe: 02:00 +11 -> 01:30 +10:30
        "2025-10-04T15:30",  # Lord Howe: 02:00 +10:30 -> 02:30 +11
    )
]
hh_mm = st.builds(
    lambda h, m: f"{h:02d}:{m:02d}",
    st.integers(0, 23),
    st.sampled_from([0, 1, 15, 29, 30, 31, 45, 59]) | st.integers(0, 59),
)
windows = st.builds(
    lambda zone, days, start, end: window(zone, days, start, end),
    st.sampled_from(PROPERTY_ZONES),
    st.lists(st.sampled_from(DAYS), min_size=1, max_size=7, unique=True),
    hh_mm,
    hh_mm,
)
near_changes = st.builds(
    lambda base, seconds: base + timedelta(seconds=seconds),
    st.sampled_from(CHANGES_2025),
    st.integers(-3 * 86400, 3 * 86400),
)
anywhere = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2035, 12, 31), timezones=st.just(UTC)
)
instants = near_changes | anywhere


@settings(max_examples=300, deadline=None)
@given(w=windows, now=instants, fractions=st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_state_is_constant_until_next_change_and_flips_there(
    w: TimeWindow, now: datetime, fractions: list[float]
) -> None:
    state = window_state(w, now)
    if state.next_change is None:
        assert state.open and w.from_ == w.until and len(w.days) == 7
        for f in fractions:
            assert is_open(w, now + timedelta(days=30 * f)) is True
        return
    change = state.next_change
    assert change > now and change.tzinfo is not None
    if not (w.from_ == w.until and len(w.days) == 7):
        assert change - now <= timedelta(days=15)  # a listed day recurs weekly
    span = change - now
    for f in fractions:
        t = now + span * f
        if t < change:
            assert is_open(w, t) is state.open
    assert is_open(w, change - timedelta(microseconds=1)) is state.open
    assert is_open(w, change) is not state.open


@settings(max_examples=200, deadline=None)
@given(w=windows, now=instants)
def test_an_open_stretch_lasts_at_most_a_day_and_an_hour_unless_days_touch(
    w: TimeWindow, now: datetime
) -> None:
    state = window_state(w, now)
    if state.open and state.next_change is not None and len(w.days) == 1:
        assert state.next_change - now <= timedelta(hours=25)


def test_every_day_midnight_window_closes_on_a_skipped_midnight() -> None:
    # Santiago moved from -04 to -03 at 00:00 on 7 September 2025: that day has no 00:00, so
    # its whole-day window does not open; Saturday's ends at the jump (01:00 -03 = 04:00 UTC).
    w = window("America/Santiago", list(DAYS), "00:00", "00:00")
    assert window_state(w, utc("2025-03-09T07:00")).next_change == utc("2025-09-07T04:00")
    assert is_open(w, utc("2025-09-07T04:00")) is False
    assert next_change(w, utc("2025-09-07T04:00")) == utc("2025-09-08T03:00")  # Monday 00:00
