"""The estimate at submit's accuracy on a replayed trace (issue 41, item 2).

A route's trace of batch capacity (lines per minute it can give batches) and of batches arriving
is replayed minute by minute through a fluid model of the route's fair shares (each batch that
wants lines gets an equal part of the minute's capacity, what one cannot use goes to the
others). What the route served each hour is the journal the estimate reads; each batch created
after the first `HISTORY_WEEKS` weeks (with `--cold`, every batch from the route's first minute)
gets the real estimate (`backfill.batches.submit_estimate.estimate`) from that journal (lines and
busy minutes per hour, the current hour so far included) and from what the batches on the route
still want at that moment, and is compared with when the replay finished it.

The trace (seeded): the route's batch capacity follows the day, as live traffic leaves it
(00-08 UTC `night`, 08-20 `day`, 20-24 the mean of both, lines per hour), each hour scaled by a
random factor in [1 - noise, 1 + noise]; weekends give batches the night rate all day. Batches
arrive as a Poisson process (`arrivals_per_day`), their sizes log-normal (median `median_lines`,
20 to 20 000 lines), their windows 24 h (70 %), 48 h, 72 h or 168 h (10 % each). Batches run to
the end (no expiry in the replay), so a missed window shows as a finish after `expires_at`.
Not modelled: deadline-aware precedence (decision 0038), lines of different lengths.

    PYTHONPATH=. .venv/bin/python -m bench.submit_estimate --load moderate
    PYTHONPATH=. .venv/bin/python -m bench.submit_estimate --load heavy
    PYTHONPATH=. .venv/bin/python -m bench.submit_estimate --load moderate --cold --weeks 3
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from dataclasses import dataclass

from backfill.batches.submit_estimate import (
    HISTORY_WEEKS,
    HOUR,
    WEEK_HOURS,
    RouteWork,
    Served,
    estimate,
    hour_of_week,
)

MINUTE = 60
START = 4 * 86400  # a Monday 00:00 UTC
LOADS = {
    # arrivals per day, median lines: the mean offered load against the mean capacity
    "light": (6.0, 300),
    "moderate": (8.0, 400),
    "heavy": (10.0, 600),
}


@dataclass
class Job:
    id: int
    created: int
    lines: int
    expires: int
    left: float
    finished: int | None = None
    est_finish: int | None = None
    est_ok: bool | None = None


def capacity_per_hour(t: int, night: float, day: float) -> float:
    how = hour_of_week(t)
    hod = how % 24
    if how >= 5 * 24:  # Saturday, Sunday
        return night
    if hod < 8:
        return night
    if hod < 20:
        return day
    return (night + day) / 2


def run(
    *,
    load: str,
    weeks: int,
    seed: int,
    night: float,
    day: float,
    noise: float,
    cold: bool = False,
) -> dict[str, object]:
    rng = random.Random(seed)
    per_day, median = LOADS[load]
    end = START + weeks * WEEK_HOURS * HOUR
    # Arrivals.
    jobs: list[Job] = []
    t = float(START)
    while True:
        t += rng.expovariate(per_day / 86400)
        if t >= end - 2 * WEEK_HOURS * HOUR:  # the last two weeks only finish what is there
            break
        lines = int(min(20_000, max(20, rng.lognormvariate(math.log(median), 1.0))))
        window = rng.choices([24, 48, 72, 168], weights=[70, 10, 10, 10])[0]
        jobs.append(Job(len(jobs), int(t), lines, int(t) + window * HOUR, float(lines)))
    factors = [1 + rng.uniform(-noise, noise) for _ in range(weeks * WEEK_HOURS + 1)]
    served: dict[int, Served] = {}
    served_frac: dict[int, float] = {}
    busy: dict[int, int] = {}
    active: list[Job] = []
    pending = list(jobs)
    offered = sum(j.lines for j in jobs)
    capacity_total = 0.0
    history_from = START if cold else START + HISTORY_WEEKS * WEEK_HOURS * HOUR
    for now in range(START, end, MINUTE):
        while pending and pending[0].created <= now:
            job = pending.pop(0)
            if job.created >= history_from:
                est = estimate(
                    [RouteWork("r", job.lines, tuple(math.ceil(j.left) for j in active), served)],
                    now=job.created,
                    expires_at=job.expires,
                )
                job.est_finish, job.est_ok = est.expected_finish_at, est.window_achievable
            active.append(job)
        hour = now // HOUR * HOUR
        cap = capacity_per_hour(now, night, day) * factors[(now - START) // HOUR] / 60
        capacity_total += cap
        # Water-filling: equal parts, what a batch cannot use goes to the others.
        left = cap
        waiting = sorted(active, key=lambda j: j.left)
        if waiting:
            busy[hour] = busy.get(hour, 0) + 1
        for i, job in enumerate(waiting):
            part = left / (len(waiting) - i)
            take = min(part, job.left)
            job.left -= take
            left -= take
            served_frac[hour] = served_frac.get(hour, 0.0) + take
            if job.left <= 1e-9:
                job.finished = now + MINUTE
        active = [j for j in active if j.finished is None]
        if hour in served_frac:
            served[hour] = Served(int(served_frac[hour]), busy.get(hour, 0))
    measured = [j for j in jobs if j.created >= history_from and j.finished is not None]
    with_est = [j for j in measured if j.est_finish is not None]
    errors_h = [((j.est_finish or 0) - (j.finished or 0)) / HOUR for j in with_est]
    rel = [
        abs((j.est_finish or 0) - (j.finished or 0)) / max(HOUR, (j.finished or 0) - j.created)
        for j in with_est
    ]
    missed = [j for j in measured if (j.finished or 0) > j.expires]
    flagged = [j for j in measured if j.est_ok is False]
    both = [j for j in flagged if (j.finished or 0) > j.expires]
    unknown = [j for j in measured if j.est_ok is None]

    def q(xs: list[float], p: float) -> float | None:
        if not xs:
            return None
        xs = sorted(xs)
        return round(xs[min(len(xs) - 1, int(p * len(xs)))], 2)

    return {
        "load": load,
        "cold": cold,
        "seed": seed,
        "utilisation": round(offered / capacity_total, 2),
        "batches_estimated": len(measured),
        "with_an_estimate": len(with_est),
        "error_hours_median": round(statistics.median(errors_h), 2) if errors_h else None,
        "abs_error_hours_p50": q([abs(e) for e in errors_h], 0.5),
        "abs_error_hours_p90": q([abs(e) for e in errors_h], 0.9),
        "relative_error_p50": q(rel, 0.5),
        "relative_error_p90": q(rel, 0.9),
        "within_25pct": round(sum(r <= 0.25 for r in rel) / len(rel), 2) if rel else None,
        "missed_windows": len(missed),
        "flagged_likely_to_miss": len(flagged),
        "flagged_and_missed": len(both),
        "missed_not_flagged": len(missed) - len(both),
        "flagged_but_finished_in_window": len(flagged) - len(both),
        "window_unknown": len(unknown),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--load", choices=sorted(LOADS), default="moderate")
    ap.add_argument("--weeks", type=int, default=HISTORY_WEEKS + 4)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--night", type=float, default=600.0, help="lines per hour, 00-08 UTC")
    ap.add_argument("--day", type=float, default=120.0, help="lines per hour, 08-20 UTC")
    ap.add_argument("--noise", type=float, default=0.15)
    ap.add_argument(
        "--cold", action="store_true", help="a new route: every batch estimated, from no history"
    )
    args = ap.parse_args()
    for seed in range(1, args.seeds + 1):
        out = run(
            load=args.load,
            weeks=args.weeks,
            seed=seed,
            night=args.night,
            day=args.day,
            noise=args.noise,
            cold=args.cold,
        )
        print(json.dumps(out))


if __name__ == "__main__":
    main()
