"""``make bench``: every benchmark of issue 9 in one table, with the machine and its load.

Runs ``bench.propagation`` (a worker Running → its line, one at a time and in bursts) and
``bench.fleet`` for each size, each on a fresh local KWOK cluster, or all on the cluster
given by ``--kubeconfig``/MPIJOB_ELASTIC_KUBECONFIG, and writes the tables to
``bench/out/results.md`` (and the raw figures next to it as JSON) for docs/benchmarks.md.

    python -m bench.report [--sizes 100,300,1000] [--out bench/out/results.md]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench import fleet, propagation
from bench.cluster import ROOT, machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=os.environ.get("BENCH_SIZES") or "100")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--kubeconfig", default=os.environ.get("MPIJOB_ELASTIC_KUBECONFIG"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench/out/results.md")
    args = parser.parse_args()
    before = machine()
    single = propagation.run(args.kubeconfig, rounds=20, bursts=[50, 200])
    print(propagation.table(single), flush=True)
    sizes = []
    for size in (int(s) for s in args.sizes.split(",")):
        sizes.append(fleet.run(args.kubeconfig, fleet.Options(jobs=size, workers=args.workers)))
        print(json.dumps(sizes[-1]), flush=True)
    where = args.kubeconfig or "the local KWOK cluster (fresh for each run)"
    text = (
        f"Measured {before['date']} on {where}; {before['cpus']} CPUs, {before['ram_gib']} GiB"
        f" RAM, Python {before['python']}; load average (1, 5, 15 min) {before['load']} at"
        f" the start, {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end.\n\n"
        "### Worker Running → its line in discover_hosts.sh\n\n"
        f"{propagation.table(single)}\n"
        f"### {args.workers} workers per job, from first create to a mass rescale\n\n"
        f"{fleet.table(sizes)}"
    )
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    raw = {"machine": before, "propagation": single, "fleet": sizes}
    args.out.with_suffix(".json").write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
