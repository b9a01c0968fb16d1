// Command shared runs two pool processes on one PostgreSQL database: this
// process enqueues jobs and waits for them; two worker processes (this
// program started again with -worker) run them on the backends they
// lease. By default it serves four fake ComfyUI backends itself; give
// -servers to use real ones.
//
//	go run ./queue/pgqueue/examples/shared                      # PostgreSQL on 127.0.0.1:5432
//	go run ./queue/pgqueue/examples/shared -db postgres://... -jobs 40
//
// Each job's line names the backend that ran it; at the end, the database
// says which worker drives each backend (they share them, two each).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/pgqueue"
)

func main() {
	dbURL := flag.String("db", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL URL")
	schema := flag.String("schema", "comfypool_example", "schema of the queue's tables (created by Migrate)")
	servers := flag.String("servers", "", "comma-separated ComfyUI URLs (default: four embedded fake servers)")
	jobs := flag.Int("jobs", 20, "jobs to enqueue")
	worker := flag.String("worker", "", "run as the named worker process (the example starts two)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if *worker != "" {
		err = runWorker(ctx, *dbURL, *schema, *worker, strings.Split(*servers, ","))
	} else {
		err = run(ctx, *dbURL, *schema, *servers, *jobs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "shared:", err)
		os.Exit(1)
	}
}

// open connects to the database and opens the queue on schema.
func open(ctx context.Context, dbURL, schema string) (*pgxpool.Pool, *queue.Queue, error) {
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, nil, err
	}
	drv, err := pgqueue.New(db, &pgqueue.Config{Schema: schema})
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, queue.New(drv), nil
}

// run is the enqueuing process.
func run(ctx context.Context, dbURL, schema, servers string, n int) error {
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := pgqueue.Migrate(ctx, db, schema); err != nil {
		return err
	}
	if servers == "" {
		var urls []string
		for range 4 {
			s := comfytest.NewServer(nil)
			defer s.Close()
			urls = append(urls, s.URL)
		}
		servers = strings.Join(urls, ",")
	}

	// Two worker processes: this program again, with -worker.
	stopWorkers, err := startWorkers(ctx, []string{"worker-a", "worker-b"}, dbURL, schema, servers)
	if err != nil {
		return err
	}
	defer stopWorkers()

	// The workers share the backends (each drives half); wait until the
	// database shows them settled, so that the jobs show both at work.
	leases, err := pgqueue.NewBackendLeases(db, &pgqueue.BackendLeasesConfig{Schema: schema})
	if err != nil {
		return err
	}
	if err := settled(ctx, leases, 2, 30*time.Second); err != nil {
		return err
	}

	qdb, q, err := open(ctx, dbURL, schema)
	if err != nil {
		return err
	}
	defer qdb.Close()
	defer q.Close()
	// This Pool drives no backend: it enqueues and waits; the workers run.
	p, err := pool.New(&pool.Config{Queue: q, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Stop(context.Background())
	wf, err := comfy.ParseWorkflow(comfytest.WorkflowOK)
	if err != nil {
		return err
	}
	t, err := p.Register(ctx, wf)
	if err != nil {
		return err
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i], err = p.EnqueueTemplate(ctx, t, []pool.Override{{Node: "1", Input: "color", Value: i + 1}},
			&pool.EnqueueOpts{Metadata: map[string]string{"example": "shared"}})
		if err != nil {
			return err
		}
	}
	start := time.Now()
	ran := map[string]int{} // backend -> jobs
	for i, id := range ids {
		res, err := p.Wait(ctx, id)
		if err != nil {
			return fmt.Errorf("job %d: %w", i, err)
		}
		ran[res.Backend]++
		fmt.Printf("job %2d ran on %s\n", i, res.Backend)
	}
	fmt.Printf("%d jobs in %v\n", n, time.Since(start).Round(time.Millisecond))
	// Which process drives which backend, as the database says.
	held, err := leases.List(ctx)
	if err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(held)) {
		fmt.Printf("%s is driven by %s (%d jobs)\n", name, held[name].Holder, ran[name])
	}
	return nil
}

// settled waits until the backends are driven by n processes.
func settled(ctx context.Context, leases *pgqueue.BackendLeases, n int, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		held, err := leases.List(ctx)
		if err != nil {
			return fmt.Errorf("the workers did not share the backends: %w", err)
		}
		holders := map[string]bool{}
		for _, l := range held {
			holders[l.Holder] = true
		}
		if len(holders) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the workers did not share the backends within %v", within)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startWorkers starts this program once per name as a worker process and
// waits until each is ready; stop closes their standard input (which
// makes them stop) and waits for them to exit.
func startWorkers(ctx context.Context, names []string, dbURL, schema, servers string) (stop func(), err error) {
	var cmds []*exec.Cmd
	var stdins []io.Closer
	stop = func() {
		for _, in := range stdins {
			_ = in.Close()
		}
		for _, c := range cmds {
			_ = c.Wait()
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		cmd := exec.CommandContext(ctx, self, "-worker", name, "-db", dbURL, "-schema", schema, "-servers", servers)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			stop()
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			stop()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			stop()
			return nil, err
		}
		cmds, stdins = append(cmds, cmd), append(stdins, stdin)
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "ready\n" {
			stop()
			return nil, fmt.Errorf("worker %s did not start: %q %v", name, line, err)
		}
		go func() { _, _ = io.Copy(io.Discard, out) }() // ends when the worker exits
	}
	return stop, nil
}

// runWorker is a worker process: a Pool that drives the backends whose
// leases it holds, until its standard input closes.
func runWorker(ctx context.Context, dbURL, schema, name string, urls []string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the parent closes our stdin to stop us
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	db, q, err := open(ctx, dbURL, schema)
	if err != nil {
		return err
	}
	defer db.Close()
	defer q.Close()
	leases, err := pgqueue.NewBackendLeases(db, &pgqueue.BackendLeasesConfig{Schema: schema})
	if err != nil {
		return err
	}
	var backends []pool.BackendConfig
	for i, u := range urls {
		backends = append(backends, pool.BackendConfig{Name: fmt.Sprintf("gpu-%d", i), URL: u})
	}
	p, err := pool.New(&pool.Config{
		Backends:      backends,
		Queue:         q,
		BackendLeases: leases,
		// Short, so that the workers share the backends within a second
		// of starting (a lease round is a third of it); the default is 30s.
		BackendLeaseTTL: 3 * time.Second,
		HolderID:        name,
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	fmt.Println("ready")
	<-ctx.Done()
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	return p.Stop(sctx)
}
