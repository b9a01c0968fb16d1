// Command dag runs a small multi-stage graph of ComfyUI workflows across
// several servers with the dag package, showing the progress live.
//
// The graph: an INPUT gives a colour and a size; "generate" makes an image
// on gpu-0; a CONDITION checks that it made one; a FANOUT sends it to
// three "variant" workflows pinned to gpu-0, gpu-1 and gpu-2 (falling back
// to any other backend if theirs is down), so the image moves from the
// backend that made it to the others; a MERGE gathers the variants and
// OUTPUT returns them with the original.
//
// With no flags it starts three embedded fake ComfyUI servers (comfytest),
// so it needs no ComfyUI installation and no GPU:
//
//	go run ./examples/dag
//
// Against real servers, list their URLs. The workflows use only ComfyUI's
// built-in, model-free nodes, so any ComfyUI installation can run them:
//
//	go run ./examples/dag -servers http://10.0.0.1:8188,http://10.0.0.2:8188
//
// A server that cannot be reached is reported within seconds, with the
// connection error.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/internal/exampleconn"
	"github.com/comfypool/comfypool/pool"
)

func main() {
	servers := flag.String("servers", "", "comma-separated URLs of real ComfyUI servers (default: three embedded fake ones)")
	color := flag.Int("color", 0x3366cc, "colour of the generated image (0xRRGGBB)")
	size := flag.Int("size", 64, "size of the generated image in pixels")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	var urls []string
	if *servers != "" {
		urls = strings.Split(*servers, ",")
	}
	live := false
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		live = true // a terminal: redraw one status line in place
	}
	inputs := map[string]any{"color": *color, "size": *size}
	if err := run(ctx, urls, inputs, os.Stdout, live); err != nil {
		fmt.Fprintln(os.Stderr, "dag:", err)
		os.Exit(1)
	}
}

// graphJSON is the graph in its storable JSON form. Workflow inputs that a
// param sets hold placeholders; %[1]s is a per-run file prefix so that a
// real server does not answer from its cache.
const graphJSON = `{
  "nodes": [
    {"id": "in", "type": "INPUT", "config": {"fields": [
      {"name": "color", "type": "int", "default": 3368652},
      {"name": "size", "type": "int", "default": 64}]}},
    {"id": "generate", "type": "WORKFLOW", "config": {
      "workflow": {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 3, "sigma": 1.0}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "%[1]s_generate"}}},
      "params": [
        {"name": "color", "type": "int", "node": "1", "input": "color"},
        {"name": "width", "type": "int", "node": "1", "input": "width"},
        {"name": "height", "type": "int", "node": "1", "input": "height"}],
      "backend": "gpu-0", "fallback": "auto"}},
    {"id": "made-one", "type": "CONDITION", "config": {"expr": "count(in) > 0"}},
    {"id": "fan", "type": "FANOUT", "config": {"mode": "broadcast", "count": 3}},
    %[2]s,
    {"id": "gather", "type": "MERGE", "config": {"mode": "concat_images"}},
    {"id": "out", "type": "OUTPUT", "config": {}}
  ],
  "edges": [
    {"from": "in", "from_port": "color", "to": "generate", "to_port": "color"},
    {"from": "in", "from_port": "size", "to": "generate", "to_port": "width"},
    {"from": "in", "from_port": "size", "to": "generate", "to_port": "height"},
    {"from": "generate", "from_port": "images", "to": "made-one", "to_port": "in"},
    {"from": "made-one", "from_port": "true", "to": "fan", "to_port": "in"},
    %[3]s,
    {"from": "generate", "from_port": "image", "to": "out", "to_port": "original"},
    {"from": "gather", "from_port": "out", "to": "out", "to_port": "variants"}
  ]
}`

// variants are the three second-stage workflows, each reading the
// generated image with LoadImage.
var variants = []struct{ name, steps string }{
	{"invert", `"2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}}`},
	{"scale", `"2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "nearest-exact", "width": 128, "height": 128, "crop": "disabled"}}`},
	{"blur", `"2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 8, "sigma": 2.0}}`},
}

// buildGraph returns the example graph.
func buildGraph(prefix string) (*dag.Graph, error) {
	var nodes, edges []string
	for i, v := range variants {
		id := "variant-" + v.name
		nodes = append(nodes, fmt.Sprintf(`{"id": %q, "type": "WORKFLOW", "config": {
      "workflow": {
        "1": {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}},
        %s,
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "%s_%s"}}},
      "params": [{"name": "image", "type": "image", "node": "1", "input": "image"}],
      "backend": "gpu-%d", "fallback": "auto", "retries": 1}}`, id, v.steps, prefix, v.name, i))
		edges = append(edges,
			fmt.Sprintf(`{"from": "fan", "from_port": "%d", "to": %q, "to_port": "image"}`, i, id),
			fmt.Sprintf(`{"from": %q, "from_port": "images", "to": "gather", "to_port": "%d"}`, id, i))
	}
	return dag.ParseGraph(fmt.Appendf(nil, graphJSON, prefix, strings.Join(nodes, ",\n    "), strings.Join(edges, ",\n    ")))
}

// run runs the graph on the servers at urls, or on three embedded fake
// servers when urls is empty, writing the progress and the outputs to out.
// live redraws one status line in place (for a terminal); otherwise each
// node transition is a line of its own.
func run(ctx context.Context, urls []string, inputs map[string]any, out io.Writer, live bool) error {
	quiet := slog.New(slog.DiscardHandler) // keep the output to what we print
	cfg := &pool.Config{Logger: quiet, BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second}
	if len(urls) == 0 {
		// Fake servers whose nodes take a little time and report
		// progress, the way real samplers do.
		opts := &comfytest.Options{Nodes: map[string]comfytest.NodeBehavior{
			"ImageBlur":   {Duration: 400 * time.Millisecond, ProgressSteps: 8},
			"ImageInvert": {Duration: 200 * time.Millisecond, ProgressSteps: 4},
			"ImageScale":  {Duration: 300 * time.Millisecond, ProgressSteps: 6},
		}}
		for i := range 3 {
			srv := comfytest.NewServer(opts)
			defer srv.Close()
			cfg.Backends = append(cfg.Backends, pool.BackendConfig{
				Name: fmt.Sprintf("gpu-%d", i), URL: srv.URL,
				Client: &comfy.ClientOptions{HTTPClient: srv.Client(), Logger: quiet},
			})
		}
		fmt.Fprintln(out, "started 3 embedded fake ComfyUI servers (use -servers for real ones)")
	} else {
		for i, u := range urls {
			cfg.Backends = append(cfg.Backends, pool.BackendConfig{
				Name: fmt.Sprintf("gpu-%d", i), URL: strings.TrimSpace(u),
				Client: &comfy.ClientOptions{Logger: quiet},
			})
		}
	}
	p, err := pool.New(cfg)
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Stop(context.Background()) // after an early return; idempotent
	if err := exampleconn.WaitPool(ctx, p, out, exampleconn.Within); err != nil {
		return err
	}

	g, err := buildGraph(fmt.Sprintf("dag_%d", time.Now().UnixNano()))
	if err != nil {
		return err
	}
	ex, err := dag.New(&dag.Config{Runner: p, Logger: quiet})
	if err != nil {
		return err
	}
	defer ex.Close(context.Background())

	start := time.Now()
	show := &display{out: out, live: live, start: start}
	res, err := ex.Run(ctx, g, inputs, &dag.RunOpts{OnEvent: show.event})
	show.finish()
	if res == nil {
		return err
	}
	fmt.Fprintf(out, "execution %s %s in %s\n", res.Execution, res.Status, time.Since(start).Round(time.Millisecond))
	for _, id := range slices.Sorted(maps.Keys(res.Nodes)) {
		n := res.Nodes[id]
		where := ""
		if n.Backend != "" {
			where = " on " + n.Backend
		}
		fmt.Fprintf(out, "  %-16s %-9s%s\n", id, n.State, where)
	}
	if f, ok := res.Outputs["original"].(dag.File); ok {
		fmt.Fprintf(out, "original: %s on %s\n", f.Name, f.Backend)
	}
	if list, ok := res.Outputs["variants"].([]any); ok {
		fmt.Fprintf(out, "variants: %d image(s)\n", len(list))
		for _, v := range list {
			if f, ok := v.(dag.File); ok {
				fmt.Fprintf(out, "  %s on %s\n", f.Name, f.Backend)
			}
		}
	}
	return err
}

// display renders an execution's events: a status line redrawn in place
// on a terminal, one line per node transition otherwise. Its methods run
// on the execution's event goroutine (RunOpts.OnEvent), one at a time.
type display struct {
	out   io.Writer
	live  bool
	start time.Time
	last  string
}

func (d *display) event(e dag.Event) {
	switch {
	case e.Kind == dag.EventNodeState && !d.live:
		line := fmt.Sprintf("%6.2fs  %-16s %s", time.Since(d.start).Seconds(), e.Node, e.State)
		if e.Backend != "" && e.State == dag.NodeRunning {
			line += " on " + e.Backend
		}
		if e.Err != nil {
			line += fmt.Sprintf(" (%v)", e.Err)
		}
		fmt.Fprintln(d.out, line+"  "+bar(e.Progress))
	case d.live && e.Kind != dag.EventExecutionState:
		line := bar(e.Progress) + "  " + running(e.Progress)
		if line != d.last {
			fmt.Fprintf(d.out, "\r\033[K%s", line)
			d.last = line
		}
	}
}

func (d *display) finish() {
	if d.live && d.last != "" {
		fmt.Fprintln(d.out)
	}
}

// bar renders done/total as a progress bar.
func bar(p dag.Progress) string {
	const width = 20
	filled := 0
	if p.Total > 0 {
		filled = p.Done * width / p.Total
	}
	return fmt.Sprintf("[%s%s] %d/%d", strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.Done, p.Total)
}

// running lists the nodes in progress with their backend and step.
func running(p dag.Progress) string {
	var parts []string
	for _, r := range p.Running {
		s := r.Node
		if r.Backend != "" {
			s += "@" + r.Backend
		}
		if r.Max > 0 {
			s += fmt.Sprintf(" %d/%d", r.Value, r.Max)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}
