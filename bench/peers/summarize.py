"""The results of run.sh (JSON lines) -> markdown: every system's median (min-max) over the
rounds, and the ratios jobs-engine ÷ peer for each column (to the best peer and to each).

    summarize.py RESULTS.jsonl > RESULTS.md

A row's ``family`` says whose it is (jobs-engine, a peer, the raw-psycopg reference) and
``defaults`` whether it ran at the system's defaults; "best peer" is the best of the peers'
rows at their defaults, "best peer, any setting" also counts their extra settings' rows
(e.g. River with its own benchmark command's settings). Rows of another BENCH_SCALE than
the last row's are left out.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from typing import Any

OURS = "jobs-engine"
PEERS = ("River", "graphile-worker", "PgQueuer")
REFERENCE = "raw psycopg"
COLUMNS = ("E100", "E1", "D1", "L p50", "L p99")
UNITS = {"E100": "jobs/s", "E1": "jobs/s", "D1": "jobs/s", "L p50": "ms", "L p99": "ms"}
DASH = "\N{EN DASH}"  # min-max: a hyphen would read as a minus beside negative values
HIGHER_IS_BETTER = {"E100": True, "E1": True, "D1": True, "L p50": False, "L p99": False}


def load(path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(measurements, meta rows, errors) of one results file, each with its round."""
    rows, meta, errors = [], [], []
    rnd = 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            if "round" in d:
                rnd = d["round"]
                meta.append(d)
            elif "meta" in d:
                meta.append(d)
            elif "error" in d:
                errors.append(d)
            else:
                rows.append({**d, "round": rnd})
    if rows:
        scale = rows[-1].get("scale", 1)
        rows = [r for r in rows if r.get("scale", 1) == scale]
    return rows, meta, errors


def values(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """system -> column -> the values over the rounds. NaN (a drain that ended within one
    sample of the first progress: no rate) is left out, its column kept (empty)."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        m = r["metric"]
        got = [("L p50", r["value"]), ("L p99", r.get("p99"))] if m == "L" else [(m, r["value"])]
        for col, v in got:
            if col in COLUMNS and v is not None:
                column = out[r["system"]][col]
                if v == v:
                    column.append(v)
    return out


def median(vals: list[float]) -> float:
    return statistics.median(vals)


def num(v: float, col: str) -> str:
    return f"{v:,.1f}" if UNITS[col] == "ms" else f"{v:,.0f}"


def cell(vals: list[float] | None, col: str, rounds: int) -> str:
    if vals is None:
        return DASH
    if not vals:
        return "n/a"
    text = num(median(vals), col)
    if len(vals) > 1:
        text += f" ({num(min(vals), col)}{DASH}{num(max(vals), col)})"
    if len(vals) != rounds:
        text += f" n={len(vals)}"
    return text


def ratio(ours: float, theirs: float) -> str:
    if theirs == 0:
        return DASH
    x = ours / theirs
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def best(candidates: dict[str, float], col: str) -> tuple[str, float] | None:
    if not candidates:
        return None
    pick = max if HIGHER_IS_BETTER[col] else min
    name = pick(candidates, key=lambda k: candidates[k])
    return name, candidates[name]


def summarize(path: str) -> str:
    rows, meta, errors = load(path)
    vals = values(rows)
    rounds = max([m["round"] for m in meta if "round" in m] + [1])
    info = {r["system"]: (r.get("family", "?"), r.get("defaults", True)) for r in rows}
    scale = rows[-1].get("scale", 1) if rows else 1

    def order(system: str) -> tuple[int, int, str]:
        family, defaults = info[system]
        rank = {REFERENCE: 0, OURS: 1, **{p: 2 + i for i, p in enumerate(PEERS)}}
        return rank.get(family, 9), 0 if defaults else 1, system

    systems = sorted(vals, key=order)
    out = [f"# jobs-engine beside its peers: {rounds} round(s), BENCH_SCALE {scale:g}", ""]
    out.append(f"Median (min{DASH}max) over the rounds; jobs/s for E100, E1, D1 (one worker "
               "process, clock from the first progress), ms for L (commit → handler start, "
               "idle worker).")
    out.append("")
    out.append("| system | " + " | ".join(f"{c} {UNITS[c]}" for c in COLUMNS) + " |")
    out.append("|---|" + "---|" * len(COLUMNS))
    for s in systems:
        family, defaults = info[s]
        label = s if defaults else f"{s} *(extra setting)*"
        out.append(f"| {label} | " + " | ".join(cell(vals[s].get(c), c, rounds)
                                                for c in COLUMNS) + " |")
    out.append("")
    if any(c in cols and not cols[c] for cols in vals.values() for c in COLUMNS):
        out.append("n/a: no rate, the queue was found empty at the first sample that saw "
                   "progress (the drain took less than one 20 ms sample: too few jobs to clock; "
                   "its rate including start-up is in the details).")
        out.append("")

    # Ratios: jobs-engine ÷ peer, medians against medians.
    med = {s: {c: median(v) for c, v in cols.items() if v} for s, cols in vals.items()}
    default_rows: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    any_rows: dict[str, dict[str, float]] = defaultdict(dict)
    for s, cols in med.items():
        family, defaults = info[s]
        if family not in PEERS:
            continue
        for c, v in cols.items():
            any_rows[c][s] = v
            if defaults:
                default_rows[c][family][s] = v
    out.append("jobs-engine ÷ peer (ratio of the medians). Above 1 is better for jobs/s, below "
               "1 is better for ms. Best peer: the best median of the peers at their defaults; "
               "any setting: also their extra settings' rows.")
    out.append("")
    out.append("| jobs-engine row ÷ | " + " | ".join(COLUMNS) + " |")
    out.append("|---|" + "---|" * len(COLUMNS))
    for s in systems:
        if info[s][0] != OURS:
            continue
        lines: dict[str, dict[str, str]] = defaultdict(dict)
        for c in COLUMNS:
            if c not in med[s]:
                continue
            ours = med[s][c]
            per_peer = {}
            for peer in PEERS:
                b = best(default_rows[c].get(peer, {}), c)
                if b:
                    per_peer[peer] = b[1]
                    lines[peer][c] = ratio(ours, b[1])
            top = best(per_peer, c)
            if top:
                lines["best peer"][c] = f"{ratio(ours, top[1])} ({top[0]})"
            top_any = best(any_rows[c], c)
            if top_any and (not top or top_any[1] != top[1]):
                lines["best peer, any setting"][c] = f"{ratio(ours, top_any[1])} ({top_any[0]})"
        for whom in ("best peer", *PEERS, "best peer, any setting"):
            if lines.get(whom):
                out.append(f"| {s} ÷ {whom} | "
                           + " | ".join(lines[whom].get(c, "") for c in COLUMNS) + " |")
    out.append("")
    out.extend(notes(rows, rounds))
    versions = [m for m in meta if m.get("meta") == "versions"]
    if versions:
        out.append("")
        out.append("Versions:")
        out.append("")
        for k, v in versions[-1].items():
            if k not in ("meta", "t", "scale"):
                out.append(f"- {k}: {v}")
    for e in errors:
        out.append(f"- ERROR: {e['error']}")
    return "\n".join(out)


def notes(rows: list[dict[str, Any]], rounds: int) -> list[str]:
    """Per-row details: D1 with start-up, the raw psycopg line of the engine's own bench,
    L missing samples and minimum, final job states, and every round's value."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["system"], r["metric"])].append(r)
    out = [f"Details (median (min{DASH}max) over the rounds where more than one):", ""]

    def f(vs: list[float], nd: int = 0) -> str:
        vs = [v for v in vs if v is not None and v == v]
        if not vs:
            return DASH
        text = f"{median(vs):,.{nd}f}"
        return text if len(vs) == 1 else f"{text} ({min(vs):,.{nd}f}{DASH}{max(vs):,.{nd}f})"

    for (s, m), rs in by.items():
        settings = sorted({r["settings"] for r in rs
                           if r.get("settings") and r["settings"] != "defaults"})
        if settings:
            out.append(f"- {s} {m}: {'; '.join(settings)}")
        if m == "D1" and any(r.get("d1_incl_startup") for r in rs):
            ns = sorted({r.get("n") for r in rs if r.get("n")})
            line = (f"- {s} D1 over {'/'.join(f'{n:,}' for n in ns)} jobs: incl. start-up "
                    f"{f([r.get('d1_incl_startup') for r in rs])} jobs/s, start-up "
                    f"{f([r.get('startup_s') for r in rs], 2)} s")
            if any(r.get("dead") for r in rs):
                line += f", DEAD rows {[r.get('dead') for r in rs]}"
            if any("final" in r for r in rs):
                line += f"; final job states {[r.get('final') for r in rs]}"
            out.append(line)
        if any(r.get("raw_psycopg_same_process") is not None for r in rs):
            out.append(f"- {s} {m}: raw psycopg in the same process (the engine bench's own "
                       f"reference line) {f([r.get('raw_psycopg_same_process') for r in rs])}"
                       " jobs/s")
        if m == "D100":
            out.append(f"- {s} D100 (DELETE ... LIMIT 100): {f([r['value'] for r in rs])} jobs/s")
        if m == "L":
            line = f"- {s} L over {rs[0].get('n')} jobs: clock {rs[0].get('clock', '?')}"
            if any("min" in r for r in rs):
                line += f", min {f([r.get('min') for r in rs], 1)} ms"
            if any(r.get("missing") for r in rs):
                line += f", missing samples {[r.get('missing') for r in rs]}"
            out.append(line)
    if rounds > 1:
        out += ["", "Per round, in run order:", ""]
        for (s, m), rs in by.items():
            nd = 1 if m == "L" else 0
            out.append(f"- {s} {m}: " + ", ".join(f"r{r['round']} {r['value']:,.{nd}f}"
                                                   for r in rs))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(summarize(sys.argv[1]))
