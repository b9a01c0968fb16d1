// Command prometheus serves the OpenTelemetry metrics of a comfypool Pool
// on /metrics, for Prometheus, through the OpenTelemetry Prometheus
// exporter.
//
// It starts two embedded fake ComfyUI servers (comfytest; no ComfyUI and no
// GPU needed), the first of which answers its first prompt with an HTTP 503
// so that a retry and a failover block show, a Pool over them, and the
// metrics of package otelmetrics with "tenant" as the tenant key. It runs a
// few jobs of two tenants, one of whose workflows fails on a node, then
// one job every two seconds until interrupted, serving the metrics:
//
//	go run ./metrics/otel/examples/prometheus
//	curl -s http://127.0.0.1:9464/metrics | grep ^comfypool_
//
// With -quick it scrapes its own /metrics once the first jobs are
// measured, prints the comfypool lines (histogram buckets left out) and
// exits; its test runs it so.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/hash"
	otelmetrics "github.com/comfypool/comfypool/metrics/otel"
	"github.com/comfypool/comfypool/pool"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9464", "address to serve /metrics on")
	quick := flag.Bool("quick", false, "scrape /metrics once after the first jobs, print the comfypool lines and exit")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *quick {
		*addr = "127.0.0.1:0" // any free port
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	if err := run(ctx, *addr, *quick, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "prometheus:", err)
		os.Exit(1)
	}
}

// job is one job of the first batch.
type job struct {
	workflow []byte
	tenant   string
}

// batch is the first batch: the first job goes to gpu-1, whose first
// prompt fails with a 503 (a retry on gpu-2, and a failover block of
// gpu-1 for that workflow); the last one fails on a node.
var batch = []job{
	{comfytest.WorkflowOK, "acme"},
	{comfytest.WorkflowOK, "acme"},
	{comfytest.WorkflowOK, "globex"},
	{comfytest.WorkflowSampler, "globex"},
	{comfytest.WorkflowFailing, "acme"},
}

// run serves the metrics on addr while the Pool runs the batch, then
// either scrapes once and returns (quick) or runs a job every two seconds
// until ctx ends.
func run(ctx context.Context, addr string, quick bool, out io.Writer) (err error) {
	quiet := slog.New(slog.DiscardHandler) // the output is the metrics
	opts := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
		"ImageInvert": {Duration: 50 * time.Millisecond, ProgressSteps: 2},
	}}
	cfg := &pool.Config{Logger: quiet, BackoffMin: 50 * time.Millisecond}
	for i := range 2 {
		srv := comfytest.NewServer(opts)
		defer srv.Close()
		if i == 0 {
			srv.FailNext("/prompt", 1, http.StatusServiceUnavailable)
		}
		cfg.Backends = append(cfg.Backends, pool.BackendConfig{Name: fmt.Sprintf("gpu-%d", i+1), URL: srv.URL,
			Client: &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: quiet}})
	}
	p, err := pool.New(cfg)
	if err != nil {
		return err
	}

	// The exporter is a Reader of the MeterProvider, and a collector of
	// the registry /metrics serves: every scrape collects, which reads
	// the Pool's Stats once.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return err
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer provider.Shutdown(context.Background())
	names := map[string]string{}
	for name, wf := range map[string][]byte{"invert": comfytest.WorkflowOK, "sampler": comfytest.WorkflowSampler, "failing": comfytest.WorkflowFailing} {
		h, err := hash.Structure(wf)
		if err != nil {
			return err
		}
		names[h.String()] = name
	}
	m, err := otelmetrics.New(p, &otelmetrics.Config{
		MeterProvider: provider, TenantKey: "tenant", WorkflowNames: names, Logger: quiet,
	})
	if err != nil {
		return err
	}
	defer m.Close(context.Background()) // after Stop (deferred later, runs first)

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = server.Serve(ln) }) // http.ErrServerClosed after Shutdown
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = errors.Join(err, server.Shutdown(sctx))
		wg.Wait()
	}()
	url := "http://" + ln.Addr().String() + "/metrics"
	fmt.Fprintf(out, "serving %s (2 fake backends; gpu-1 fails its first prompt)\n", url)

	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Stop(context.Background()) // idempotent
	if _, err := p.WaitConnected(ctx, 0); err != nil {
		return err
	}
	var wg2 sync.WaitGroup
	var mu sync.Mutex
	completed, failed := 0, 0
	for i, j := range batch {
		wf, err := comfy.ParseWorkflow(j.workflow)
		if err != nil {
			return err
		}
		o := &pool.EnqueueOpts{Metadata: map[string]string{"tenant": j.tenant}}
		if i == 0 {
			o.PreferBackends = []string{"gpu-1"}
		}
		id, err := p.Enqueue(ctx, wf, o)
		if err != nil {
			return err
		}
		if i == 0 { // the retry and the block first, then the others
			if _, err := p.Wait(ctx, id); err != nil {
				return err
			}
			completed++
			continue
		}
		wg2.Go(func() {
			_, err := p.Wait(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
			} else {
				completed++
			}
		})
	}
	wg2.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	fmt.Fprintf(out, "ran %d jobs: %d completed, %d failed\n", len(batch), completed, failed)

	if quick {
		return scrape(ctx, url, len(batch), out)
	}
	fmt.Fprintln(out, "one job every 2s; Ctrl-C to stop")
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	wf, err := comfy.ParseWorkflow(comfytest.WorkflowOK)
	if err != nil {
		return err
	}
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			tenant := []string{"acme", "globex"}[n%2]
			if _, err := p.Enqueue(ctx, wf, &pool.EnqueueOpts{Metadata: map[string]string{"tenant": tenant}}); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
}

// scrape reads url until the finished-jobs counter reaches jobs (the
// Metrics measure events asynchronously: a scrape right after the last
// job may come before its end is counted, as a Prometheus scrape may),
// then prints its comfypool lines, histogram buckets left out.
func scrape(ctx context.Context, url string, jobs int, out io.Writer) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		lines, finished, err := get(ctx, url)
		if err != nil {
			return err
		}
		if finished >= jobs {
			fmt.Fprintf(out, "scraped %s:\n", url)
			for _, l := range lines {
				fmt.Fprintln(out, l)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d finished jobs measured: %w", finished, jobs, ctx.Err())
		case <-tick.C:
		}
	}
}

// get scrapes url once, returning its comfypool lines (no buckets) and
// the sum of comfypool_jobs_finished_total.
func get(ctx context.Context, url string) (lines []string, finished int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "comfypool_") || strings.Contains(l, "_bucket{") {
			continue
		}
		lines = append(lines, l)
		if strings.HasPrefix(l, "comfypool_jobs_finished_total{") {
			n, _ := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			finished += int(n)
		}
	}
	return lines, finished, sc.Err()
}
