// Command quickstart runs one ComfyUI workflow, prints its progress and
// saves its image to disk (-out, by default quickstart.png in the current
// directory).
//
// With no flags it starts an embedded fake ComfyUI server (comfytest), so it
// needs no ComfyUI installation and no GPU:
//
//	go run ./examples/quickstart
//
// Against a real server, give its URL. The workflow then uses only ComfyUI's
// built-in, model-free nodes, so any ComfyUI installation can run it:
//
//	go run ./examples/quickstart -server http://127.0.0.1:8188 -out /tmp/inverted.png
//
// A server that cannot be reached is reported within seconds, with the
// connection error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/png"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/internal/exampleconn"
)

func main() {
	server := flag.String("server", "", "URL of a real ComfyUI server (default: an embedded fake one)")
	outPath := flag.String("out", "quickstart.png", "`file` to save the image to (a batch adds _2, _3, ... before the extension)")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	err := run(ctx, *server, *outPath, os.Stdout)
	cancel()
	stop()
	if err != nil {
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

// run runs the workflow on the server at serverURL, or on an embedded
// fake server when it is empty, writes the progress to out and saves the
// images to savePath.
func run(ctx context.Context, serverURL, savePath string, out io.Writer) error {
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

	// Fail fast with the connection error when the server is not there:
	// by itself the client keeps reconnecting until the context ends.
	if err := exampleconn.WaitClient(ctx, client, exampleconn.Within); err != nil {
		return err
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

	for i, f := range res.Files() {
		path := savePath
		if i > 0 {
			ext := filepath.Ext(path)
			path = fmt.Sprintf("%s_%d%s", strings.TrimSuffix(path, ext), i+1, ext)
		}
		cfg, err := save(ctx, client, f, path)
		if err != nil {
			return err
		}
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		fmt.Fprintf(out, "output %s/%s: %dx%d PNG, saved to %s\n", f.Type, f.Filename, cfg.Width, cfg.Height, path)
	}
	return nil
}

// save streams the file f from the server into path, checking on the way
// that it is a PNG, and returns its size.
func save(ctx context.Context, client *comfy.Client, f comfy.FileRef, path string) (image.Config, error) {
	img, err := client.View(ctx, f, nil)
	if err != nil {
		return image.Config{}, err
	}
	defer img.Body.Close()
	file, err := os.Create(path)
	if err != nil {
		return image.Config{}, err
	}
	// The decoder reads the header through the tee; io.Copy writes the rest.
	cfg, err := png.DecodeConfig(io.TeeReader(img.Body, file))
	if err == nil {
		_, err = io.Copy(file, img.Body)
	}
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return image.Config{}, fmt.Errorf("save %s to %s: %w", f.Filename, path, err)
	}
	return cfg, nil
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
