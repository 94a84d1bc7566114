"""Time-of-use tariffs: validation, prices at instants, cheap periods, energy cost, DST days."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from pydantic import ValidationError

from nightshift.runtime.scheduling.tariff import Period, PriceWindow, Tariff


def night_day(tz: str = "Europe/Berlin", **kw) -> Tariff:
    return Tariff(
        timezone=tz,
        currency="EUR",
        windows=[
            PriceWindow(name="night", start="23:00", end="07:00", price_per_kwh=0.10),
            PriceWindow(name="day", start="07:00", end="23:00", price_per_kwh=0.30),
        ],
        **kw,
    )


def test_overlapping_windows_error_names_both_windows_and_the_day():
    """Two windows that price the same minute are refused, saying which two and where."""
    with pytest.raises(ValidationError) as exc:
        Tariff(
            timezone="Europe/Berlin",
            currency="EUR",
            windows=[
                PriceWindow(name="night", start="22:00", end="07:00", price_per_kwh=0.1),
                PriceWindow(
                    name="morning", days=["mon"], start="06:00", end="09:00", price_per_kwh=0.2
                ),
                PriceWindow(name="rest", start="09:00", end="22:00", price_per_kwh=0.3),
            ],
        )
    msg = str(exc.value)
    assert "windows 'night' and 'morning' overlap on mon 06:00–07:00" in msg


def test_window_listing_a_day_twice_is_an_error():
    """A day listed twice would overlap the window with itself."""
    with pytest.raises(ValidationError, match="mon listed more than once"):
        PriceWindow(name="w", days=["mon", "mon"], start="01:00", end="02:00", price_per_kwh=1)


def test_gap_without_default_price_names_the_uncovered_time():
    """Without a default price every minute needs a window; the error says which are missing."""
    with pytest.raises(ValidationError) as exc:
        Tariff(
            timezone="Europe/Berlin",
            currency="EUR",
            windows=[PriceWindow(name="night", start="23:00", end="07:00", price_per_kwh=0.1)],
        )
    assert "no window covers mon 07:00–23:00 (and 6 more gap(s))" in str(exc.value)
    assert "default_price_per_kwh" in str(exc.value)


def test_gap_with_default_price_is_priced_at_the_default():
    """A default price fills the gaps; window_at says no window is in force there."""
    t = Tariff(
        timezone="UTC",
        currency="EUR",
        default_price_per_kwh=0.25,
        windows=[PriceWindow(name="night", start="23:00", end="07:00", price_per_kwh=0.1)],
    )
    noon = datetime(2026, 12, 2, 12, 0)
    assert t.price_at(noon) == 0.25 and t.window_at(noon) is None
    assert t.price_at(datetime(2026, 12, 2, 23, 30)) == 0.1


@pytest.mark.parametrize("value", ["25:00", "7:5", "07:60", "seven"])
def test_bad_times_are_refused(value):
    """Times are HH:MM within the day; the message shows the bad value."""
    with pytest.raises(ValidationError, match=value):
        PriceWindow(name="w", start=value, end="08:00", price_per_kwh=1)


def test_start_equal_to_end_is_refused():
    """A window needs a length; 00:00–24:00 is the way to say the whole day."""
    with pytest.raises(ValidationError, match="give it a length"):
        PriceWindow(name="w", start="07:00", end="07:00", price_per_kwh=1)
    whole = Tariff(
        timezone="UTC",
        currency="EUR",
        windows=[PriceWindow(name="flat", start="00:00", end="24:00", price_per_kwh=0.2)],
    )
    assert whole.price_at(datetime(2026, 1, 1, 23, 59)) == 0.2


def test_unknown_time_zone_is_refused():
    """The time zone must be an IANA name."""
    with pytest.raises(ValidationError, match="unknown time zone 'Europe/Berln'"):
        night_day("Europe/Berln")


def test_window_crossing_midnight_runs_into_the_next_day_and_sunday_into_monday():
    """`days` names the day a window starts; Sunday 22:00–06:00 ends on Monday morning."""
    t = Tariff(
        timezone="UTC",
        currency="EUR",
        default_price_per_kwh=0.3,
        windows=[
            PriceWindow(
                name="sun-night", days=["sun"], start="22:00", end="06:00", price_per_kwh=0.05
            )
        ],
    )
    sunday, monday = datetime(2026, 12, 6, 23, 0), datetime(2026, 12, 7, 5, 59)
    assert sunday.weekday() == 6 and monday.weekday() == 0
    assert t.window_at(sunday) == "sun-night" and t.window_at(monday) == "sun-night"
    assert t.window_at(datetime(2026, 12, 7, 6, 0)) is None
    assert t.window_at(datetime(2026, 12, 5, 23, 0)) is None  # saturday night is not covered


def test_cheap_periods_merge_adjacent_windows_and_reach_back_to_their_start():
    """Adjacent windows under the threshold are one period, and a period under way when asked
    starts where it began, not at the question."""
    t = Tariff(
        timezone="UTC",
        currency="EUR",
        windows=[
            PriceWindow(name="night", start="23:00", end="05:00", price_per_kwh=0.10),
            PriceWindow(name="early", start="05:00", end="07:00", price_per_kwh=0.12),
            PriceWindow(name="day", start="07:00", end="23:00", price_per_kwh=0.30),
        ],
    )
    now = datetime(2026, 12, 2, 3, 0)
    got = t.cheap_periods(now, 0.12, timedelta(days=1))
    assert got[0] == Period(datetime(2026, 12, 1, 23, 0), datetime(2026, 12, 2, 7, 0))
    assert got[1] == Period(datetime(2026, 12, 2, 23, 0), datetime(2026, 12, 3, 7, 0))
    assert len(got) == 2
    only_night = t.cheap_periods(now, 0.10, timedelta(days=1))
    assert only_night[0].end == datetime(2026, 12, 2, 5, 0)
    assert t.cheap_until(now, 0.12) == datetime(2026, 12, 2, 7, 0)
    assert t.cheap_until(datetime(2026, 12, 2, 12, 0), 0.12) is None
    assert t.next_cheap_start(now, 0.12) == now
    assert t.next_cheap_start(datetime(2026, 12, 2, 12, 0), 0.12) == datetime(2026, 12, 2, 23, 0)
    assert t.next_cheap_start(now, 0.01) is None


def test_energy_cost_integrates_price_over_the_windows_crossed():
    """1 kW from 21:00 to 01:00 UTC: 2 h at the day price, 2 h at the night price."""
    t = night_day("UTC")
    cost = t.energy_cost(datetime(2026, 12, 2, 21, 0), datetime(2026, 12, 3, 1, 0), 1000)
    assert cost == pytest.approx(2 * 0.30 + 2 * 0.10)
    assert t.energy_cost(datetime(2026, 12, 2, 1, 0), datetime(2026, 12, 2, 1, 0), 1000) == 0


def test_local_time_zone_is_used():
    """23:00 in Berlin in December is 22:00 UTC."""
    t = night_day()
    assert t.price_at(datetime(2026, 12, 2, 21, 59)) == 0.30
    assert t.price_at(datetime(2026, 12, 2, 22, 0)) == 0.10


def test_dst_spring_forward_night_is_one_hour_shorter_in_berlin():
    """On 2026-03-29 Berlin skips 02:00–03:00: 23:00 CET → 07:00 CEST is 7 hours, and the
    energy cost of a night-long run counts 7 hours at the night price, not 8."""
    t = night_day()
    periods = t.cheap_periods(datetime(2026, 3, 28, 12, 0), 0.10, timedelta(hours=24))
    assert periods[0] == Period(datetime(2026, 3, 28, 22, 0), datetime(2026, 3, 29, 5, 0))
    assert periods[0].seconds == 7 * 3600
    cost = t.energy_cost(datetime(2026, 3, 28, 22, 0), datetime(2026, 3, 29, 6, 0), 1000)
    assert cost == pytest.approx(7 * 0.10 + 1 * 0.30)


def test_dst_fall_back_night_is_one_hour_longer_in_new_york():
    """On 2026-11-01 New York repeats 01:00–02:00: 23:00 EDT → 07:00 EST is 9 hours."""
    t = night_day("America/New_York")
    periods = t.cheap_periods(datetime(2026, 10, 31, 18, 0), 0.10, timedelta(hours=24))
    assert periods[0] == Period(datetime(2026, 11, 1, 3, 0), datetime(2026, 11, 1, 12, 0))
    assert periods[0].seconds == 9 * 3600


def test_dst_window_inside_the_skipped_hour_starts_when_the_clocks_jump():
    """A window 02:30–03:30 on the spring-forward day: 02:30 never happens, so the window is in
    force from the jump (03:00 CEST = 01:00 UTC) to 03:30 CEST."""
    t = Tariff(
        timezone="Europe/Berlin",
        currency="EUR",
        default_price_per_kwh=0.3,
        windows=[
            PriceWindow(name="odd", days=["sun"], start="02:30", end="03:30", price_per_kwh=0.01)
        ],
    )
    day = datetime(2026, 3, 28, 12, 0)
    assert t.cheap_periods(day, 0.01, timedelta(hours=24)) == [
        Period(datetime(2026, 3, 29, 1, 0), datetime(2026, 3, 29, 1, 30))
    ]
    assert t.price_at(datetime(2026, 3, 29, 0, 59)) == 0.3


def test_dst_window_in_the_repeated_hour_covers_both_passes():
    """A window 02:00–03:00 on Berlin's fall-back day covers 02:00–03:00 twice: two UTC hours."""
    t = Tariff(
        timezone="Europe/Berlin",
        currency="EUR",
        default_price_per_kwh=0.3,
        windows=[
            PriceWindow(name="twice", days=["sun"], start="02:00", end="03:00", price_per_kwh=0.01)
        ],
    )
    got = t.cheap_periods(datetime(2026, 10, 24, 12, 0), 0.01, timedelta(hours=24))
    assert got == [Period(datetime(2026, 10, 25, 0, 0), datetime(2026, 10, 25, 2, 0))]
