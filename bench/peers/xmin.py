"""The old-snapshot shape beside the peers (``bash bench/peers/run.sh xmin``).

Another session of the system's database holds a snapshot taken before the first fill
(``SET TRANSACTION ISOLATION LEVEL REPEATABLE READ``, ``SELECT count(*)`` of the system's
job table, its transaction kept open) while three D1 drains of 20,000 jobs run in a row,
nothing truncated or vacuumed between them: the rows the drains delete or update stay
behind as dead row versions no VACUUM may remove, as behind a long report or a replica's
feedback. The same three drains without it. Each drain: the jobs committed by the system's
own client (``fill``), ANALYZE, ONE worker process spawned, clock from the first observed
progress to an empty queue (``common.drain``, as D1). The table is truncated and vacuumed
before each series, and vacuumed again after a held one (the snapshot released first).

  river     the settings of River's own benchmark command (`river bench`): MaxWorkers 2000,
            FetchCooldown 2 ms, FetchPollInterval 20 ms (at its defaults River drains ~1,000
            jobs/s, paced by FetchCooldown: a snapshot would hardly show)
  pgqueuer  its defaults (bench_pgq.py work, as run_peer.py)
  graphile  its defaults (concurrency 1, as run_peer.py)

The jobs engine's series run in its own Python (``bench_je.py Xmin``, the project's
``bench/shapes.py``); run.sh interleaves the systems by round and prints the table.

    xmin.py river|pgqueuer|graphile ...   one round's two series of each (XMIN_ROUND: which
                                          series goes first turns by round)
    xmin.py summary RESULTS.jsonl         the table: every drain's rate, the ratio held / none
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

METRIC = "xmin"
DRAINS = 3


def held_first(round_number: int) -> bool:
    """Which series goes first in a round (the jobs engine's side turns the same way)."""
    return round_number % 2 == 0


def series_order(round_number: int) -> list[bool]:
    return [True, False] if held_first(round_number) else [False, True]


# -- the peers' series ---------------------------------------------------------------------


@contextlib.contextmanager
def old_snapshot(db: str, table: str, held: bool) -> Iterator[Any]:
    """Another session holding a snapshot of ``db`` taken now (its transaction kept open)
    while the block runs; nothing when not ``held``. Yields that session's pid."""
    import psycopg
    from common import dsn

    if not held:
        yield None
        return
    holder = psycopg.connect(dsn(db))
    try:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute(f"SELECT count(*) FROM {table}").fetchone()
        yield holder.info.backend_pid
    finally:
        holder.rollback()
        holder.close()


def peer_series(peer: str, held: bool, round_number: int) -> None:
    import psycopg
    from common import D1_N, drain, dsn, run_json, spawn, url
    from run_peer import NAMES, PEERS, RIVER_BENCH

    p = PEERS[peer]
    env = {"DATABASE_URL": url(p["db"]), **p["env"]}
    wenv = dict(env)
    concurrency = p["default_c"]
    system, settings = NAMES[peer], "defaults"
    if peer == "river":  # `river bench`'s settings, as run_peer.py's D1bench row
        concurrency = 2000
        wenv.update(RIVER_FETCH_COOLDOWN_MS="2", RIVER_FETCH_POLL_INTERVAL_MS="20")
        system = RIVER_BENCH
        settings = "MaxWorkers 2000, FetchCooldown 2 ms, FetchPollInterval 20 ms"
    conn = psycopg.connect(dsn(p["db"]), autocommit=True)
    try:
        try:
            conn.execute(f"SELECT 1 FROM {p['table']} LIMIT 1")
        except psycopg.errors.UndefinedTable:
            run_json(p["cmd"] + p["install"], env=env)

        def one(query: str) -> Any:
            row = conn.execute(query).fetchone()
            assert row is not None
            return row[0]

        conn.execute(p["truncate"])
        conn.execute(f"VACUUM ANALYZE {p['table']}")
        series = "held" if held else "none"
        with old_snapshot(p["db"], p["table"], held) as pid:
            if pid is not None:
                assert one(f"SELECT backend_xmin IS NOT NULL FROM pg_stat_activity "
                           f"WHERE pid = {int(pid)}"), "the snapshot is not held"
            for i in range(1, DRAINS + 1):
                run_json(p["cmd"] + ["fill", str(D1_N)], env=env)
                conn.execute(f"ANALYZE {p['table']}")
                assert one(p["left"]) == D1_N, f"{system}: the fill left another count"

                def worker(c: int = concurrency) -> Any:
                    return spawn(p["worker"](c), f"{peer}_xmin.log", env=wenv)

                drain(system, NAMES[peer], worker, lambda: one(p["left"]),
                      lambda: one(p["exists"]), D1_N, metric=METRIC, defaults=peer != "river",
                      extra={"series": series, "drain": i, "xmin_round": round_number,
                             "concurrency": concurrency, "settings": settings})
        if held:
            conn.execute(f"VACUUM ANALYZE {p['table']}")
        conn.execute(p["truncate"])
    finally:
        conn.close()


def run_peers(peers: list[str]) -> None:
    round_number = int(os.environ.get("XMIN_ROUND", "1"))
    for peer in peers:
        for held in series_order(round_number):
            peer_series(peer, held, round_number)


# -- the table ---------------------------------------------------------------------------


def fmt(value: float, ratio: bool = False) -> str:
    if value != value:
        return "n/a"
    return f"{value:.2f}x" if ratio else f"{value:,.0f}"


def cell(values: list[float], ratio: bool = False) -> str:
    """Median (every round's value, in round order)."""
    if not values:
        return "\N{EN DASH}"
    runs = " / ".join(fmt(v, ratio) for v in values)
    return f"{fmt(statistics.median(values), ratio)} ({runs})"


def summary(path: str) -> str:
    from summarize import load

    rows, meta, errors = load(path)
    rows = [r for r in rows if r.get("metric") == METRIC]
    # system -> series -> drain -> round -> rate
    rates: dict[str, dict[str, dict[int, dict[int, float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict)))
    order: list[str] = []
    for r in rows:
        if r["system"] not in order:
            order.append(r["system"])
        rates[r["system"]][r["series"]][r["drain"]][r["round"]] = r["value"]
    rounds = sorted({r["round"] for r in rows})
    n = rows[0]["n"] if rows else 0
    lines = [
        f"# The old-snapshot shape: {len(rounds)} round(s), {DRAINS} drains of {n:,} jobs in "
        "a row, one worker process",
        "",
        "Every cell: median (each round's value, in round order). jobs/s from the first "
        "observed progress to an empty queue; held: another session keeps a snapshot taken "
        "before the first fill; none: no such session. Nothing is truncated or vacuumed "
        "between the drains of a series.",
        "",
        "| system | series | " + " | ".join(f"drain {i} jobs/s" for i in range(1, DRAINS + 1))
        + " |",
        "|---|---|" + "---|" * DRAINS,
    ]
    for system in order:
        for series in ("none", "held"):
            lines.append(f"| {system} | {series} | " + " | ".join(
                cell([rates[system][series][i][k] for k in rounds
                      if k in rates[system][series][i]]) for i in range(1, DRAINS + 1)) + " |")
    lines += [
        "",
        "Ratio held / none of the same round (below 1: slower beside the old snapshot).",
        "",
        "| system | " + " | ".join(f"drain {i} held / none" for i in range(1, DRAINS + 1))
        + " |",
        "|---|" + "---|" * DRAINS,
    ]
    for system in order:
        ratios = []
        for i in range(1, DRAINS + 1):
            held, none = rates[system]["held"][i], rates[system]["none"][i]
            ratios.append(cell([held[k] / none[k] for k in rounds if k in held and k in none],
                               ratio=True))
        lines.append(f"| {system} | " + " | ".join(ratios) + " |")
    settings = {r["system"]: r.get("settings", "") for r in rows}
    lines += ["", "Settings: " + "; ".join(f"{s}: {settings[s]}" for s in order if settings[s])]
    for m in meta:
        if m.get("meta") == "versions":
            lines.append("Versions: " + "; ".join(f"{k} {v}" for k, v in m.items()
                                                  if k not in ("meta", "t", "scale")))
    for e in errors:
        lines.append(f"ERROR: {e['error']}")
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["summary"] and len(args) == 2:
        print(summary(args[1]))
    elif args and set(args) <= {"river", "pgqueuer", "graphile"}:
        run_peers(args)
    else:
        raise SystemExit(__doc__)
