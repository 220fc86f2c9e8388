// graphile-worker side of the peers bench (bench/peers/run_peer.py times D1 and pairs L files).
//
//   node bench.js migrate
//   node bench.js e100 N | e1 N | fill N     -> prints {"rate": jobs/s, ...}
//   node bench.js work CONCURRENCY           -> runs a worker (graphile-worker `run`) until SIGTERM
//   node bench.js lat                        -> L enqueuer (LAT_* env)
//
// DATABASE_URL picks the database. NODE_PATH must point at the node_modules holding
// graphile-worker. Clock for L: process.hrtime.bigint() (CLOCK_MONOTONIC, shared by the
// processes of one machine) on both sides.
const fs = require("fs");
const { run, makeWorkerUtils, Logger } = require("graphile-worker");

const cs = process.env.DATABASE_URL;
const mode = process.argv[2];
const arg = parseInt(process.argv[3] || "0", 10);

// graphile-worker's default logger prints one INFO line per completed job; the peers run
// with warnings and errors only (as the earlier harness ran Procrastinate at warning).
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[${level}] ${message}`);
});

const nowS = () => Number(process.hrtime.bigint()) / 1e9;
const payload = (i) => ({ i, ts: Date.now() / 1000, msg: "hello world" });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const out = (o) => console.log(JSON.stringify(o));

async function main() {
  if (mode === "work") {
    const task = process.env.LAT_TASK_FILE;
    const runner = await run({
      connectionString: cs,
      concurrency: arg,
      logger,
      taskList: {
        noop: async () => {},
        lat: async (p) => {
          const t = nowS();
          if (task) fs.appendFileSync(task, `${p.seq} ${t.toFixed(6)}\n`);
        },
      },
    });
    await runner.promise; // graphile-worker handles SIGTERM itself (graceful shutdown)
    return;
  }
  const u = await makeWorkerUtils({ connectionString: cs, logger });
  try {
    if (mode === "migrate") {
      await u.migrate();
      out({ migrated: true });
    } else if (mode === "e100") {
      const t = process.hrtime.bigint();
      for (let b = 0; b < Math.floor(arg / 100); b++) {
        const specs = [];
        for (let j = 0; j < 100; j++) specs.push({ identifier: "noop", payload: payload(b * 100 + j) });
        await u.addJobs(specs);
      }
      const el = Number(process.hrtime.bigint() - t) / 1e9;
      out({ rate: (Math.floor(arg / 100) * 100) / el, n: Math.floor(arg / 100) * 100, api: "addJobs" });
    } else if (mode === "e1") {
      const t = process.hrtime.bigint();
      for (let i = 0; i < arg; i++) await u.addJob("noop", payload(i));
      const el = Number(process.hrtime.bigint() - t) / 1e9;
      out({ rate: arg / el, n: arg, api: "addJob" });
    } else if (mode === "fill") {
      for (let s = 0; s < arg; s += 1000) {
        const specs = [];
        for (let i = s; i < arg && i < s + 1000; i++) specs.push({ identifier: "noop", payload: payload(i) });
        await u.addJobs(specs);
      }
      out({ filled: arg });
    } else if (mode === "lat") {
      const task = process.env.LAT_TASK_FILE;
      const n = parseInt(process.env.LAT_N, 10);
      const rate = parseFloat(process.env.LAT_RATE);
      await u.addJob("lat", { seq: -1 }); // warm-up: proves the worker is up
      const deadline = Date.now() + 60000;
      while (!(fs.existsSync(task) && fs.readFileSync(task, "utf8").trim())) {
        if (Date.now() > deadline) throw new Error("worker not ready");
        await sleep(50);
      }
      await sleep(2000); // idle and waiting
      const lines = [];
      const start = nowS();
      for (let i = 0; i < n; i++) {
        const d = start + i / rate - nowS();
        if (d > 0) await sleep(d * 1000);
        await u.addJob("lat", { seq: i });
        lines.push(`${i} ${nowS().toFixed(6)}`);
      }
      fs.writeFileSync(process.env.LAT_AFTER_FILE, lines.join("\n") + "\n");
      out({ clock: "CLOCK_MONOTONIC (process.hrtime)", api: "addJob" });
    } else {
      throw new Error(`unknown mode ${mode}`);
    }
  } finally {
    await u.release();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
