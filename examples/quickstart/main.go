// Command quickstart runs one ComfyUI workflow and prints its progress and
// outputs.
//
// With no flags it starts an embedded fake ComfyUI server (comfytest), so it
// needs no ComfyUI installation and no GPU:
//
//	go run ./examples/quickstart
//
// Against a real server, give its URL. The workflow then uses only ComfyUI's
// built-in, model-free nodes, so any ComfyUI installation can run it:
//
//	go run ./examples/quickstart -server http://127.0.0.1:8188
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"image/png"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
)

func main() {
	server := flag.String("server", "", "URL of a real ComfyUI server (default: an embedded fake one)")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	if err := run(ctx, *server, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// workflow is an API-format ComfyUI workflow built from core nodes that
// need no model: an empty image, inverted, saved.
const workflow = `{
  "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 16777215}},
  "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
  "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "quickstart"}}
}`

func run(ctx context.Context, serverURL string, out io.Writer) error {
	opts := &comfy.ClientOptions{
		// Keep the output to what the example prints; a service would pass
		// its own logger.
		Logger: slog.New(slog.DiscardHandler),
	}
	if serverURL == "" {
		// An embedded fake server whose nodes take a little time and
		// report progress, the way a real sampler does.
		srv := comfytest.NewServer(&comfytest.Options{
			Nodes: map[string]comfytest.NodeBehavior{
				"ImageInvert": {Duration: 600 * time.Millisecond, ProgressSteps: 6},
			},
		})
		defer srv.Close()
		serverURL = srv.URL
		opts.HTTPClient = srv.Client()
		fmt.Fprintln(out, "started an embedded fake ComfyUI server (use -server URL for a real one)")
	}

	client, err := comfy.NewClient(serverURL, opts)
	if err != nil {
		return err
	}
	defer client.Close(context.Background())

	// Fail fast with a clear message when the server is not there: by
	// itself the client keeps reconnecting until the context ends.
	connectCtx, cancelConnect := context.WithTimeout(ctx, 10*time.Second)
	err = client.Connect(connectCtx)
	cancelConnect()
	if err != nil {
		return fmt.Errorf("cannot reach ComfyUI at %s: %w", client.BaseURL(), err)
	}

	wf, err := comfy.ParseWorkflow([]byte(workflow))
	if err != nil {
		return err
	}
	// A real server caches identical prompts; a fresh prefix makes it run.
	if err := wf.SetInput("3", "filename_prefix", fmt.Sprintf("quickstart_%d", time.Now().UnixNano())); err != nil {
		return err
	}

	start := time.Now()
	res, err := client.Run(ctx, wf, &comfy.RunOptions{
		OnMessage: func(m comfy.Message) {
			switch m := m.(type) {
			case *comfy.ExecutionStart:
				fmt.Fprintf(out, "prompt %s started\n", m.PromptID)
			case *comfy.Executing:
				if !m.Done() {
					fmt.Fprintf(out, "  running node %s\n", m.Node)
				}
			case *comfy.Progress:
				fmt.Fprintf(out, "  node %s %s %3.0f%%\n", m.Node, bar(m.Value, m.Max), 100*m.Value/max(m.Max, 1))
			case *comfy.ExecutionCached:
				if len(m.Nodes) > 0 {
					fmt.Fprintf(out, "  cached nodes: %s\n", strings.Join(m.Nodes, ", "))
				}
			}
		},
	})
	var nodeErr *comfy.ExecutionError
	switch {
	case errors.As(err, &nodeErr):
		return fmt.Errorf("node %s (%s) failed: %s", nodeErr.NodeID, nodeErr.NodeType, strings.TrimSpace(nodeErr.ExceptionMessage))
	case err != nil:
		return err
	}
	fmt.Fprintf(out, "finished in %s\n", time.Since(start).Round(time.Millisecond))

	for _, f := range res.Files() {
		img, err := client.View(ctx, f, nil)
		if err != nil {
			return err
		}
		cfg, err := png.DecodeConfig(img.Body)
		img.Body.Close()
		if err != nil {
			return fmt.Errorf("decode %s: %w", f.Filename, err)
		}
		fmt.Fprintf(out, "output %s/%s (%s): %dx%d PNG\n", f.Type, f.Filename, img.ContentType, cfg.Width, cfg.Height)
	}
	return nil
}

// bar draws a 20-character progress bar.
func bar(value, maxValue float64) string {
	const width = 20
	n := 0
	if maxValue > 0 {
		n = int(width * value / maxValue)
	}
	n = min(max(n, 0), width)
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}
