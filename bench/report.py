"""``make bench``: the benchmarks of issues 9, 20, 31 and 33 in one report, with the machine's load.

Runs ``bench.propagation`` (a worker Running → its line, one at a time and in bursts),
``bench.fleet`` for each size, ``bench.mass`` for each size (issue 33: a mass rescale
of half the jobs and the loss of a fifth of the nodes, each beside the cluster's floor
measured just before it) and ``bench.wave`` for each size (a Kueue admission wave and its
eviction, beside the floor), then ``bench.idle`` (an idle fleet of the largest size: its
cost with this controller, with none, and with ``--baseline``'s if given; one edit while
idle), ``bench.sidebyside`` (one worker added, beside training-operator 1.9.2), and what a
tenant's input costs the controller's memory (``bench.foreign``: 40 ConfigMaps of 1 MB with
our labels; ``bench.exec_flood``: a launcher printing 1 GB to each drain read), each on
a fresh local KWOK cluster, or all on the cluster given by
``--kubeconfig``/MPIJOB_ELASTIC_KUBECONFIG, and writes the tables to
``bench/out/results.md`` (and the raw figures next to it as JSON) for docs/benchmarks.md.

    python -m bench.report [--sizes 100,300,1000] [--baseline main] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench import exec_flood, fleet, foreign, idle, mass, propagation, sidebyside, wave
from bench.cluster import ROOT, machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=os.environ.get("BENCH_SIZES") or "100")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--kubeconfig", default=os.environ.get("MPIJOB_ELASTIC_KUBECONFIG"))
    parser.add_argument("--baseline", default=os.environ.get("BENCH_BASELINE") or None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/out/results.md")
    args = parser.parse_args()
    before = machine()
    single = propagation.run(args.kubeconfig, rounds=20, bursts=[50, 200])
    print(propagation.table(single), flush=True)
    sizes = []
    for size in (int(s) for s in args.sizes.split(",")):
        sizes.append(fleet.run(args.kubeconfig, fleet.Options(jobs=size, workers=args.workers)))
        print(json.dumps(sizes[-1]), flush=True)
    changes = []
    for size in (int(s) for s in args.sizes.split(",")):
        changes.append(mass.run(args.kubeconfig, mass.Options(jobs=size, workers=args.workers)))
        print(json.dumps(changes[-1]), flush=True)
    waves = []
    for size in (int(s) for s in args.sizes.split(",")):
        waves.append(wave.run(args.kubeconfig, size, args.workers))
        print(json.dumps(waves[-1]), flush=True)
    largest = max(int(s) for s in args.sizes.split(","))
    idle_args = argparse.Namespace(
        jobs=largest,
        workers=args.workers,
        window=60.0,
        edits=20,
        baseline=args.baseline,
        kubeconfig=args.kubeconfig,
    )
    quiet = idle.run(idle_args)
    beside = sidebyside.run(args.kubeconfig, rounds=20, bursts=[50])
    tenants = argparse.Namespace(
        kubeconfig=args.kubeconfig, count=40, size_mb=1.0, gigabytes=1.0, seconds=30, baseline=None
    )
    foreign_objects = foreign.run(tenants)
    flood = exec_flood.run(tenants)
    where = args.kubeconfig or "the local KWOK cluster (fresh for each run)"
    text = (
        f"Measured {before['date']} on {where}; {before['cpus']} CPUs, {before['ram_gib']} GiB"
        f" RAM, Python {before['python']}; load average (1, 5, 15 min) {before['load']} at"
        f" the start, {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end.\n\n"
        "### Worker Running → its line in discover_hosts.sh\n\n"
        f"{propagation.table(single)}\n"
        f"### {args.workers} workers per job, from first create to a mass rescale\n\n"
        f"{fleet.table(sizes)}\n"
        f"### Mass changes beside the cluster's floor (issue 33)\n\n"
        f"{mass.table(changes)}\n"
        f"### A Kueue admission wave and its eviction, beside the floor (issue 33)\n\n"
        f"{wave.table(waves)}\n"
        f"### An idle fleet\n\n{idle.table(quiet)}\n"
        f"### One worker added, beside training-operator 1.9.2\n\n"
        f"{sidebyside.side_by_side(beside)}\n"
        f"### A tenant's input and the controller's memory (issue 31: under 10 MB each)\n\n"
        f"{foreign.table(foreign_objects)}\n\n{exec_flood.table(flood)}\n"
    )
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    raw = {
        "machine": before,
        "propagation": single,
        "fleet": sizes,
        "mass": changes,
        "wave": waves,
        "idle": quiet,
        "sidebyside": beside,
        "foreign": foreign_objects,
        "exec_flood": flood,
    }
    args.out.with_suffix(".json").write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
