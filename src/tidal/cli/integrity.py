"""`tidal integrity check`: the findings of an episode's workspace before and after, as JSON.

    tidal integrity check --before DIR --after DIR [--actions FILE] [--trace FILE]
                          [--protected PATH ...] [--hidden PATH ...] [--min-confidence C]

Prints a JSON list of findings (objects with type, file, lines, evidence, confidence) and exits
0 whatever it finds; unreadable input (a missing directory, a bad JSON line) exits 2 with one
line naming the file and line.
"""

from __future__ import annotations

import json


def cmd_check(args, rest) -> int:
    from tidal.integrity.detect import detect
    from tidal.integrity.evidence_io import EvidenceError, evidence_from_paths

    if rest:
        raise EvidenceError(f"unknown arguments {' '.join(rest)}: integrity check takes no config overrides")
    if not 0.0 <= args.min_confidence <= 1.0:
        raise EvidenceError(f"--min-confidence {args.min_confidence} is outside [0, 1]")
    evidence = evidence_from_paths(args.before, args.after, args.actions, args.trace,
                                   protected=args.protected or (), hidden=args.hidden or ())
    findings = [f.to_json() for f in detect(evidence) if f.confidence >= args.min_confidence]
    print(json.dumps(findings, indent=2))
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("integrity", help="integrity checks: tamper and environment-probing findings")
    ss = s.add_subparsers(dest="integrity_command", required=True)
    p = ss.add_parser("check", help="compare a workspace before and after an episode; print the findings as JSON")
    p.add_argument("--before", required=True, help="the workspace as the task gave it (a directory)")
    p.add_argument("--after", required=True, help="the workspace as the episode left it (a directory)")
    p.add_argument("--actions", help="the episode's actions, JSON lines of Action objects")
    p.add_argument("--trace", help="the sandbox trace, JSON lines of TraceEvent objects")
    p.add_argument("--protected", nargs="+", action="extend", default=[], metavar="PATH",
                   help="workspace paths the agent may read but not change (visible tests, verifier)")
    p.add_argument("--hidden", nargs="+", action="extend", default=[], metavar="PATH",
                   help="paths the agent must never read (hidden tests, the grader)")
    p.add_argument("--min-confidence", type=float, default=0.0,
                   help="print only findings at least this sure (default: all)")
    p.set_defaults(fn=cmd_check)
