// riverbench: the River side of the peers bench (bench/peers/run_peer.py times D1 and pairs L files).
//
//	riverbench migrate
//	riverbench e100 N | e100fast N | e1 N | fill N      -> prints {"rate": jobs/s, ...}
//	riverbench work CONCURRENCY                          -> runs a worker until SIGTERM
//	                 (env RIVER_FETCH_COOLDOWN_MS / RIVER_FETCH_POLL_INTERVAL_MS override
//	                 River's defaults of 100 ms / 1 s; unset in the default runs)
//	riverbench lat                                       -> L enqueuer (LAT_* env)
//
// DATABASE_URL picks the database. Clock for L: time.Now() (CLOCK_REALTIME, ns) on both sides.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type NoopArgs struct {
	I   int     `json:"i"`
	Ts  float64 `json:"ts"`
	Msg string  `json:"msg"`
}

func (NoopArgs) Kind() string { return "noop" }

type LatArgs struct {
	Seq int `json:"seq"`
}

func (LatArgs) Kind() string { return "lat" }

type NoopWorker struct{ river.WorkerDefaults[NoopArgs] }

func (w *NoopWorker) Work(ctx context.Context, job *river.Job[NoopArgs]) error { return nil }

type LatWorker struct {
	river.WorkerDefaults[LatArgs]
	path string
}

func (w *LatWorker) Work(ctx context.Context, job *river.Job[LatArgs]) error {
	t := now()
	if w.path != "" {
		appendLine(w.path, fmt.Sprintf("%d %.6f\n", job.Args.Seq, t))
	}
	return nil
}

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	must(err)
	_, err = f.WriteString(line)
	must(err)
	must(f.Close())
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func payload(i int) NoopArgs { return NoopArgs{I: i, Ts: now(), Msg: "hello world"} }

func workers(latPath string) *river.Workers {
	w := river.NewWorkers()
	river.AddWorker(w, &NoopWorker{})
	river.AddWorker(w, &LatWorker{path: latPath})
	return w
}

var logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

func client(pool *pgxpool.Pool, cfg *river.Config) *river.Client[pgx.Tx] {
	cfg.Logger = logger
	c, err := river.NewClient(riverpgxv5.New(pool), cfg)
	must(err)
	return c
}

func out(v map[string]any) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	must(err)
	defer pool.Close()
	mode := os.Args[1]
	arg := 0
	if len(os.Args) > 2 {
		arg, err = strconv.Atoi(os.Args[2])
		must(err)
	}
	switch mode {
	case "migrate":
		m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
		must(err)
		res, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil)
		must(err)
		out(map[string]any{"migrated": len(res.Versions)})
	case "e100", "e100fast":
		c := client(pool, &river.Config{Workers: workers("")}) // insert-only client
		start := time.Now()
		for b := 0; b < arg/100; b++ {
			params := make([]river.InsertManyParams, 100)
			for j := range params {
				params[j] = river.InsertManyParams{Args: payload(b*100 + j)}
			}
			if mode == "e100" {
				_, err = c.InsertMany(ctx, params)
			} else {
				_, err = c.InsertManyFast(ctx, params)
			}
			must(err)
		}
		el := time.Since(start).Seconds()
		out(map[string]any{"rate": float64(arg/100*100) / el, "n": arg / 100 * 100, "api": mode})
	case "e1":
		c := client(pool, &river.Config{Workers: workers("")})
		start := time.Now()
		for i := 0; i < arg; i++ {
			_, err = c.Insert(ctx, payload(i), nil)
			must(err)
		}
		out(map[string]any{"rate": float64(arg) / time.Since(start).Seconds(), "n": arg, "api": "Insert"})
	case "fill":
		c := client(pool, &river.Config{Workers: workers("")})
		for s := 0; s < arg; s += 1000 {
			params := []river.InsertManyParams{}
			for i := s; i < arg && i < s+1000; i++ {
				params = append(params, river.InsertManyParams{Args: payload(i)})
			}
			_, err = c.InsertManyFast(ctx, params)
			must(err)
		}
		out(map[string]any{"filled": arg})
	case "work":
		cfg := &river.Config{
			Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: arg}},
			Workers: workers(os.Getenv("LAT_TASK_FILE")),
		}
		// Unset (the default runs): River's defaults, FetchCooldown 100 ms, FetchPollInterval 1 s.
		if ms := os.Getenv("RIVER_FETCH_COOLDOWN_MS"); ms != "" {
			v, err := strconv.ParseFloat(ms, 64)
			must(err)
			cfg.FetchCooldown = time.Duration(v * float64(time.Millisecond))
		}
		if ms := os.Getenv("RIVER_FETCH_POLL_INTERVAL_MS"); ms != "" {
			v, err := strconv.ParseFloat(ms, 64)
			must(err)
			cfg.FetchPollInterval = time.Duration(v * float64(time.Millisecond))
		}
		c := client(pool, cfg)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		must(c.Start(ctx))
		<-sig
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		must(c.Stop(stopCtx))
	case "lat":
		c := client(pool, &river.Config{Workers: workers("")})
		task := os.Getenv("LAT_TASK_FILE")
		n, _ := strconv.Atoi(os.Getenv("LAT_N"))
		rate, _ := strconv.ParseFloat(os.Getenv("LAT_RATE"), 64)
		_, err = c.Insert(ctx, LatArgs{Seq: -1}, nil) // warm-up: proves the worker is up
		must(err)
		deadline := time.Now().Add(60 * time.Second)
		for {
			b, _ := os.ReadFile(task)
			if strings.TrimSpace(string(b)) != "" {
				break
			}
			if time.Now().After(deadline) {
				must(fmt.Errorf("worker not ready"))
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(2 * time.Second) // idle and waiting
		var sb strings.Builder
		start := time.Now()
		for i := 0; i < n; i++ {
			target := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			if d := time.Until(target); d > 0 {
				time.Sleep(d)
			}
			_, err = c.Insert(ctx, LatArgs{Seq: i}, nil)
			must(err)
			fmt.Fprintf(&sb, "%d %.6f\n", i, now())
		}
		must(os.WriteFile(os.Getenv("LAT_AFTER_FILE"), []byte(sb.String()), 0o644))
		out(map[string]any{"clock": "CLOCK_REALTIME (Go time.Now)", "api": "Insert"})
	default:
		must(fmt.Errorf("unknown mode %q", mode))
	}
}
