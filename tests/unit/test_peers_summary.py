"""``bench/peers/summarize.py``, the table of the peers bench: on a results file written
here (no database, no peer installed), the medians, the ratios to the best peer at its
defaults and to each peer, and the extra settings kept apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
SUMMARIZE = REPO_ROOT / "bench" / "peers" / "summarize.py"
D = "\N{EN DASH}"  # the table's min-max dash, and its empty cell


def row(system: str, family: str, metric: str, value: float, defaults: bool = True,
        **extra: Any) -> dict[str, Any]:
    return {"system": system, "family": family, "defaults": defaults, "metric": metric,
            "value": value, "scale": 0.05, **extra}


def summarize(tmp_path: Path, rows: list[dict[str, Any]]) -> str:
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run([sys.executable, str(SUMMARIZE), str(path)], capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout


def line(text: str, start: str) -> str:
    found = [ln for ln in text.splitlines() if ln.startswith(start)]
    assert len(found) == 1, (start, text)
    return found[0]


def test_medians_and_ratios(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = []
    for rnd, (ours, river, pgq) in enumerate([(900, 1000, 3000), (700, 1100, 3500),
                                              (800, 900, 4000)], start=1):
        rows += [{"round": rnd},
                 row("jobs-engine long lane", "jobs-engine", "D1", ours),
                 row("jobs-engine long lane", "jobs-engine", "L", 4.0, p99=8.0),
                 row("River MaxWorkers=100", "River", "D1", river),
                 row("River MaxWorkers=100", "River", "L", 40.0, p99=80.0),
                 row("River, `river bench` settings", "River", "D1", 10_000, defaults=False),
                 row("PgQueuer", "PgQueuer", "D1", pgq),
                 row("PgQueuer", "PgQueuer", "L", 1.0, p99=2.0)]
    text = summarize(tmp_path, rows)
    assert (f"| jobs-engine long lane | {D} | {D} | 800 (700{D}900) | 4.0 (4.0{D}4.0) | "
            f"8.0 (8.0{D}8.0) |") in text
    assert "| River, `river bench` settings *(extra setting)* |" in text
    best = line(text, "| jobs-engine long lane ÷ best peer |")
    # D1: best at defaults is PgQueuer (3,500); L: lower is better, PgQueuer's 1.0 ms
    assert "0.23x (PgQueuer)" in best and "4.00x (PgQueuer)" in best
    assert "| 0.80x |" in line(text, "| jobs-engine long lane ÷ River |")
    assert "0.08x (River, `river bench` settings)" in line(
        text, "| jobs-engine long lane ÷ best peer, any setting |")


def test_a_drain_too_short_to_clock_shows_as_such(tmp_path: Path) -> None:
    text = summarize(tmp_path, [{"round": 1},
                                row("PgQueuer", "PgQueuer", "D1", float("nan"),
                                    d1_incl_startup=900.0, startup_s=0.3, n=100)])
    assert f"| PgQueuer | {D} | {D} | n/a | {D} | {D} |" in text
    assert "n/a: no rate" in text
