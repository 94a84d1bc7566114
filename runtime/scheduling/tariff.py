"""Time-of-use tariffs: a week of price windows in a local time zone, asked about in naive UTC.

A window names the weekdays on which it *starts*; one that crosses midnight (23:00–07:00) runs
into the next day (Sunday's runs into Monday). Windows may not overlap; a time no window covers
costs `default_price_per_kwh`, and without one every minute of the week must be covered.

Every function is pure. Times in and out are naive UTC (the store's convention); local wall
times are converted with `zoneinfo`, so a day on which the clocks change has 23 or 25 hours and
each of its instants gets the price of the window its local wall time falls in.
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import UTC, date, datetime, time, timedelta
from typing import Literal, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
DAYS: tuple[Day, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DAY_MIN = 24 * 60
WEEK_MIN = 7 * DAY_MIN
_EPS = 1e-12  # price comparisons: "at or below" the threshold survives float noise


class Piece(NamedTuple):
    """A stretch of time (naive UTC, end exclusive) with one price; `window` None is the default."""

    start: datetime
    end: datetime
    price: float
    window: str | None


class Period(NamedTuple):
    """A contiguous stretch at or below a price threshold (naive UTC, end exclusive)."""

    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


def _minutes(value: str, *, allow_24: bool) -> int:
    try:
        hh, mm = value.split(":")
        h, m = int(hh), int(mm)
    except ValueError:
        raise ValueError(f"'{value}' is not a time of day: write HH:MM, e.g. 07:30") from None
    if len(mm) != 2 or not 0 <= m < 60 or not 0 <= h <= 24 or (h == 24 and (m or not allow_24)):
        limit = "00:00–24:00" if allow_24 else "00:00–23:59"
        raise ValueError(f"'{value}' is not a time of day in {limit}")
    return h * 60 + m


def hhmm(minute: int) -> str:
    """Minute of the day (0–1440) as HH:MM; 1440 is 24:00."""
    return f"{minute // 60:02d}:{minute % 60:02d}"


def _span(start: int, end: int) -> str:
    """Week minutes [start, end) inside one day, as 'mon 23:00–24:00'."""
    day = start // DAY_MIN
    return f"{DAYS[day]} {hhmm(start - day * DAY_MIN)}–{hhmm(end - day * DAY_MIN)}"


def _lookup(
    segs: list[tuple[int, int, float, str | None]], starts: list[int], tz: ZoneInfo, t_utc: datetime
) -> tuple[int, int, float, str | None]:
    """The week segment in force at a naive-UTC instant."""
    loc = t_utc.replace(tzinfo=UTC).astimezone(tz)
    return segs[bisect_right(starts, loc.weekday() * DAY_MIN + loc.hour * 60 + loc.minute) - 1]


class PriceWindow(BaseModel):
    """One price for a time of day on some weekdays, in the tariff's local time zone."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Shown in reports and errors, e.g. 'night'")
    days: list[Day] = Field(
        default_factory=lambda: list(DAYS),
        description="Weekdays on which the window starts; default every day",
    )
    start: str = Field(description="Local start, HH:MM")
    end: str = Field(
        description="Local end, HH:MM (24:00 for midnight); before start: crosses midnight"
    )
    price_per_kwh: float = Field(ge=0)

    @field_validator("start")
    @classmethod
    def _start(cls, v: str) -> str:
        _minutes(v, allow_24=False)
        return v

    @field_validator("end")
    @classmethod
    def _end(cls, v: str) -> str:
        _minutes(v, allow_24=True)
        return v

    @field_validator("days")
    @classmethod
    def _days(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("name at least one weekday (mon … sun)")
        twice = sorted({d for d in v if v.count(d) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once")
        return v

    @model_validator(mode="after")
    def _length(self) -> PriceWindow:
        s, e = self.start_min, self.end_min
        if s == e:
            raise ValueError(
                f"window '{self.name}' starts and ends at {self.start}: give it a "
                "length (00:00–24:00 is the whole day)"
            )
        return self

    @property
    def start_min(self) -> int:
        return _minutes(self.start, allow_24=False)

    @property
    def end_min(self) -> int:
        return _minutes(self.end, allow_24=True)

    def week_spans(self) -> list[tuple[int, int]]:
        """Week minutes [start, end) it covers, split at midnight (Sunday wraps to Monday)."""
        s, e = self.start_min, self.end_min
        out = []
        for d in self.days:
            base = DAYS.index(d) * DAY_MIN
            if e > s:
                out.append((base + s, base + e))
            else:  # crosses midnight: the rest of this day, then the next day up to `end`
                out.append((base + s, base + DAY_MIN))
                if e:
                    nxt = (base + DAY_MIN) % WEEK_MIN
                    out.append((nxt, nxt + e))
        return out


class Tariff(BaseModel):
    """Time-of-use electricity prices: price windows over a week in one local time zone."""

    model_config = ConfigDict(extra="forbid")

    timezone: str = Field(description="IANA time zone of the windows, e.g. Europe/Berlin")
    currency: str = Field(min_length=1, description="e.g. EUR; shown with prices")
    windows: list[PriceWindow]
    default_price_per_kwh: float | None = Field(
        None, ge=0, description="Price of any time no window covers; without it, gaps are an error"
    )

    # Week minute → (price, window) as sorted segments covering [0, WEEK_MIN) exactly.
    _starts: list[int] = PrivateAttr(default_factory=list)
    _segs: list[tuple[int, int, float, str | None]] = PrivateAttr(default_factory=list)
    _tz: ZoneInfo = PrivateAttr()

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone '{v}': use an IANA name such as Europe/Berlin "
                "or America/New_York"
            ) from None
        return v

    @model_validator(mode="after")
    def _week(self) -> Tariff:
        spans = sorted(
            (s, e, w.name, w.price_per_kwh) for w in self.windows for s, e in w.week_spans()
        )
        for (_, e1, n1, _), (s2, e2, n2, _) in zip(spans, spans[1:], strict=False):
            if s2 < e1:
                names = (
                    f"window '{n1}' overlaps itself"
                    if n1 == n2
                    else f"windows '{n1}' and '{n2}' overlap"
                )
                raise ValueError(f"{names} on {_span(s2, min(e1, e2))}; a minute has one price")
        segs: list[tuple[int, int, float, str | None]] = []
        gaps: list[tuple[int, int]] = []
        at = 0
        for s, e, name, price in [*spans, (WEEK_MIN, WEEK_MIN, "", 0.0)]:
            while at < s:  # a gap, split at midnight so each piece names one day
                stop = min(s, (at // DAY_MIN + 1) * DAY_MIN)
                gaps.append((at, stop))
                at = stop
            if e > s:
                segs.append((s, e, price, name))
                at = e
        if gaps and self.default_price_per_kwh is None:
            more = f" (and {len(gaps) - 1} more gap(s))" if len(gaps) > 1 else ""
            raise ValueError(
                f"no window covers {_span(*gaps[0])}{more}: add a window or set "
                "default_price_per_kwh"
            )
        for s, e in gaps:
            segs.append((s, e, float(self.default_price_per_kwh or 0.0), None))
        segs.sort()
        self._segs = segs
        self._starts = [s[0] for s in segs]
        self._tz = ZoneInfo(self.timezone)
        return self

    # ------------------------------------------------------------------ instants
    @property
    def tz(self) -> ZoneInfo:
        return self._tz

    def to_local(self, t_utc: datetime) -> datetime:
        """Naive UTC → aware local time."""
        return t_utc.replace(tzinfo=UTC).astimezone(self._tz)

    def _seg_at(self, t_utc: datetime) -> tuple[int, int, float, str | None]:
        return _lookup(self._segs, self._starts, self._tz, t_utc)

    def price_at(self, t_utc: datetime) -> float:
        """Price per kWh at an instant."""
        return self._seg_at(t_utc)[2]

    def window_at(self, t_utc: datetime) -> str | None:
        """Name of the window in force at an instant; None where the default price applies."""
        return self._seg_at(t_utc)[3]

    def cheapest_price(self) -> float:
        return min(s[2] for s in self._segs)

    def prices(self) -> list[float]:
        """Every distinct price of the week, lowest first (for price bands such as not-peak)."""
        return sorted({s[2] for s in self._segs})

    # ------------------------------------------------------------------ stretches
    def pieces(self, start_utc: datetime, end_utc: datetime) -> list[Piece]:
        """[start, end) cut where the price or window changes, in UTC, adjacent equals merged."""
        if end_utc <= start_utc:
            return []
        cuts = {start_utc, end_utc}
        day_bounds = [
            sorted(
                {s[0] - d * DAY_MIN for s in self._segs if d * DAY_MIN <= s[0] < (d + 1) * DAY_MIN}
                | {0}
            )
            for d in range(7)
        ]
        first = self.to_local(start_utc).date() - timedelta(days=1)
        last = self.to_local(end_utc).date() + timedelta(days=1)
        day = first
        while day <= last:
            for minute in day_bounds[day.weekday()]:
                wall = datetime.combine(day, time(minute // 60, minute % 60), tzinfo=self._tz)
                for fold in (0, 1):  # both readings of an ambiguous (repeated) wall time
                    u = wall.replace(fold=fold).astimezone(UTC).replace(tzinfo=None)
                    if start_utc < u < end_utc:
                        cuts.add(u)
            shift = self._offset_change(day)
            if shift is not None and start_utc < shift < end_utc:
                cuts.add(shift)  # wall time jumps: a boundary inside a skipped hour lands here
            day += timedelta(days=1)
        ordered = sorted(cuts)
        out: list[Piece] = []
        segs, starts, tz = self._segs, self._starts, self._tz
        for a, b in zip(ordered, ordered[1:], strict=False):
            _, _, price, name = _lookup(segs, starts, tz, a)
            if out and out[-1].price == price and out[-1].window == name:
                out[-1] = out[-1]._replace(end=b)
            else:
                out.append(Piece(a, b, price, name))
        return out

    def _offset_change(self, day: date) -> datetime | None:
        """The UTC instant (to the minute) at which the UTC offset changes on this local day."""
        lo = datetime.combine(day, time(0), tzinfo=self._tz).astimezone(UTC)
        hi = datetime.combine(day + timedelta(days=1), time(0), tzinfo=self._tz).astimezone(UTC)
        if lo.astimezone(self._tz).utcoffset() == hi.astimezone(self._tz).utcoffset():
            return None
        before = lo.astimezone(self._tz).utcoffset()
        a, b = 0, int((hi - lo).total_seconds() // 60)
        while b - a > 1:  # offset(lo + a) == before, offset(lo + b) != before
            mid = (a + b) // 2
            if (lo + timedelta(minutes=mid)).astimezone(self._tz).utcoffset() == before:
                a = mid
            else:
                b = mid
        return (lo + timedelta(minutes=b)).replace(tzinfo=None)

    def cheap_periods(
        self, t_utc: datetime, threshold: float, horizon: timedelta = timedelta(days=7)
    ) -> list[Period]:
        """Contiguous periods priced at or below `threshold` that overlap [t, t + horizon), merged
        across adjacent windows and given their whole extent (one that began before t starts when
        it began). A tariff cheap for more than a week around t is cut a week from the horizon."""
        week = timedelta(days=7)
        out: list[Period] = []
        for p in self.pieces(t_utc - week, t_utc + horizon + week):
            if p.price > threshold + _EPS:
                continue
            if out and out[-1].end == p.start:
                out[-1] = Period(out[-1].start, p.end)
            else:
                out.append(Period(p.start, p.end))
        end = t_utc + horizon
        return [p for p in out if p.end > t_utc and p.start < end]

    def next_cheap_start(
        self, t_utc: datetime, threshold: float, horizon: timedelta = timedelta(days=8)
    ) -> datetime | None:
        """The first instant at or after t priced at or below `threshold` (t itself when it is);
        None when there is none within the horizon."""
        periods = self.cheap_periods(t_utc, threshold, horizon)
        if not periods:
            return None
        return max(periods[0].start, t_utc)

    def cheap_until(self, t_utc: datetime, threshold: float) -> datetime | None:
        """When the cheap period containing t ends; None when t is not at or below `threshold`."""
        periods = self.cheap_periods(t_utc, threshold, timedelta(minutes=1))
        if periods and periods[0].start <= t_utc:
            return periods[0].end
        return None

    def energy_cost(self, start_utc: datetime, end_utc: datetime, power_w: float) -> float:
        """Cost of drawing `power_w` watts over [start, end): Σ kWh × price of each piece."""
        kw = power_w / 1000.0
        return sum(
            kw * (p.end - p.start).total_seconds() / 3600.0 * p.price
            for p in self.pieces(start_utc, end_utc)
        )
