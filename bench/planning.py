"""Benchmark: how long one plan blocks the event loop, for jobs up to the worker cap.

Planning is pure and synchronous, so while it runs no other job is reconciled and no
watch event is read. This times ``plan_writes()`` on in-memory jobs of N Running workers: a
settled job (the common case), a scale-in of half of it, and a new job (capped at
desired.POD_WRITES_PER_TURN creates per turn). No cluster needed.

    python -m bench.planning [--sizes 10,100,1000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta

from mpijob_elastic.core.actions import Create
from mpijob_elastic.core.planning.plan import plan_writes
from tests.unit.simulation import SETTINGS, Cluster, make_job


def _time(c: Cluster, repeat: int) -> tuple[float, float, int]:
    observed = c.observed()
    samples = []
    writes = 0
    for _ in range(repeat):
        start = time.perf_counter()
        p = plan_writes(observed, SETTINGS, c.now)
        samples.append((time.perf_counter() - start) * 1000)
        writes = len(p.actions)
    return statistics.median(samples), max(samples), writes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(f"{'workers':>8} {'case':<12} {'median ms':>10} {'max ms':>8} {'writes':>7}")
    for n in (int(s) for s in args.sizes.split(",")):
        new = Cluster(make_job(n))
        med, top, writes = _time(new, args.repeat)
        print(f"{n:>8} {'new job':<12} {med:>10.2f} {top:>8.2f} {writes:>7}")
        settled = Cluster(make_job(n))
        settled.converge(rounds=n // 50 + 20)
        med, top, writes = _time(settled, args.repeat)
        print(f"{n:>8} {'settled':<12} {med:>10.2f} {top:>8.2f} {writes:>7}")
        settled.set_replicas(n // 2)
        med, top, writes = _time(settled, args.repeat)
        print(f"{n:>8} {'scale-in':<12} {med:>10.2f} {top:>8.2f} {writes:>7}")
        settled.apply(settled.plan())
        settled.now += timedelta(seconds=60)
        med, top, writes = _time(settled, args.repeat)
        deletes = sum(1 for a in settled.plan().actions if not isinstance(a, Create))
        print(f"{n:>8} {'drain over':<12} {med:>10.2f} {top:>8.2f} {deletes:>7}")


if __name__ == "__main__":
    main()
