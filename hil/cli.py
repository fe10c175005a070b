"""``gateway-hil``: run, validate and list scenarios (docs/hil.md).

Exit codes: 0 every expectation held; 1 one failed (the report says which, by how much,
and lists lost message ids); 2 bad input (one line: file, field, line number).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from hil.envfile import load_env
from hil.envfile import resolve as resolve_env
from hil.envfile import shipped as shipped_envs
from hil.expectations import Verdict, collect, evaluate
from hil.records import read
from hil.scenario import load_scenario, shipped
from hil.unit import Unsupported
from hil.yamlmarks import BadInput


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway-hil", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a scenario against a target")
    r.add_argument("scenario", help="a shipped scenario's name or a YAML file")
    r.add_argument("--env", required=True, help="local, qemu, hardware-example or a file")
    r.add_argument("--report", type=Path, help="directory for junit.xml, results.json, "
                   "report.html and records.jsonl (default: a new temporary directory)")
    r.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a scenario field, e.g. duration=20s or "
                   "groups.mqtt5.count=100 (repeatable)")
    r.add_argument("--unit-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra GATEWAY_* setting for the unit (local target)")
    v = sub.add_parser("validate", help="check a scenario (and optionally an env) file")
    v.add_argument("scenario")
    v.add_argument("--env", help="also validate this environment")
    v.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    sub.add_parser("list", help="shipped scenarios and environments")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "list":
            return _list()
        if args.cmd == "validate":
            sc = load_scenario(args.scenario, args.set)
            if args.env:
                load_env(args.env)
            print(f"{args.scenario}: ok ({sc.device_count} devices, {len(sc.active)} groups, "
                  f"{len(sc.faults)} faults, {sc.duration:g} s)")
            return 0
        return _run(args)
    except BadInput as e:
        print(f"gateway-hil: {e}", file=sys.stderr)
        return 2


def _list() -> int:
    for path in shipped():
        sc = load_scenario(str(path))
        faults = ", ".join(f.kind for f in sc.faults) or "no faults"
        print(f"{path.stem:15} {sc.device_count:6} devices  {sc.duration:6g} s  {faults}")
    print("environments: " + ", ".join(p.stem for p in shipped_envs()))
    return 0


def _run(args: argparse.Namespace) -> int:
    from hil.report import write_reports
    from hil.runner import Runner, stderr_progress

    sc = load_scenario(args.scenario, args.set)
    unit_env: dict[str, str] = {}
    for item in args.unit_env:
        k, sep, v = item.partition("=")
        if not sep or not k.startswith("GATEWAY_"):
            raise BadInput("--unit-env", None, item, "expected GATEWAY_KEY=VALUE")
        unit_env[k] = v
    _env, strategy = load_env(args.env)
    out: Path = args.report or Path(tempfile.mkdtemp(prefix=f"hil-{sc.name}-"))
    out.mkdir(parents=True, exist_ok=True)
    strategy.target.activate(strategy.unit)
    unit = strategy.unit
    print(f"gateway-hil: {sc.name} on {args.env}: {sc.device_count} devices, "
          f"{sc.duration:g} s, report in {out}", file=sys.stderr)
    t0 = time.monotonic()
    runner = Runner(sc, unit, out, progress=stderr_progress(), unit_env=unit_env)
    try:
        info = runner.execute()
    except Unsupported as e:  # the target cannot be set up as this run needs
        raise BadInput(resolve_env(args.env), None, "", str(e)) from None
    wall = time.monotonic() - t0
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    facts = collect(read(info.records))
    verdicts = evaluate(sc, facts)
    for note in info.unsupported:
        verdicts.append(Verdict("fault_made", False, None, None, "", note))
    phases = {ev["name"]: ev for ev in read(info.records) if ev["e"] == "phase"}
    publishing = phases["publishing"]["t"] if "publishing" in phases else None
    busy = None
    if "publishing" in phases and "settle" in phases:
        p0, p1 = phases["publishing"], phases["settle"]
        busy = round(100 * (p1["cpu"] - p0["cpu"]) / max(1e-9, p1["t"] - p0["t"]), 1)
    meta = {"env": str(args.env), "run": info.run, "duration_s": round(wall, 2),
            "rig_cpu_s": round(info.rig_cpu, 2), "rig_pid": os.getpid(),
            "publishing_at": publishing, "records": str(info.records),
            "rig_cpu_publishing_pct": busy}
    write_reports(out, sc, facts, verdicts, meta)
    failed = [v for v in verdicts if not v.passed]
    for v in verdicts:
        mark = "PASS" if v.passed else "FAIL"
        print(f"{mark} {v.name}: {v.detail}" + (
            f" (measured {v.measured:g}, bound {v.bound:g})"
            if not v.passed and v.measured is not None and v.bound is not None else ""))
    for v in failed:
        if v.ids:
            print(f"lost/duplicated ids ({v.name}): " + " ".join(v.ids[:200])
                  + (" ..." if len(v.ids) > 200 else ""))
    print(json.dumps({"scenario": sc.name, "passed": not failed, "wall_s": round(wall, 1),
                      "rig_cpu_s": round(info.rig_cpu, 1), "rig_cpu_publishing_pct": busy,
                      "devices": sc.device_count, "report": str(out)}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
