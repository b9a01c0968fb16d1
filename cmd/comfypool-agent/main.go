// Command comfypool-agent runs a fleet worker beside a ComfyUI server: it
// registers with a comfypool control plane (a fleet.Handler), polls for
// jobs, runs them on the server and reports back, using outbound
// connections only. See package fleet for the protocol.
//
// Usage:
//
//	COMFYPOOL_FLEET_SECRET=... comfypool-agent -control https://pool.example/fleet -fleet gpu -stage upscale
//
// Every flag has an environment variable (in brackets in -help); a flag
// given on the command line wins. Give the secret through the environment
// or -secret-file rather than -secret, which other users of the machine
// can read in the process list.
//
// With -provider cloud it runs its jobs on Comfy Cloud instead of a local
// ComfyUI, with the API key from COMFYPOOL_COMFY_API_KEY (an environment
// variable only; it never leaves the worker).
//
// SIGTERM or SIGINT stops it: the prompts it runs are interrupted, their
// jobs given back to the queue (not counted as attempts) and the worker
// deregistered; it exits 0. A revoked worker or a refused secret exits
// with status 3 (do not restart it); other failures with status 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/fleet"
	"github.com/comfypool/comfypool/pool"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
	exitDenied = 3 // revoked, or the secret refused: restarting will not help
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	fs := flag.NewFlagSet("comfypool-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	control := fs.String("control", env("COMFYPOOL_CONTROL_URL", ""), "control plane base URL, where the fleet handler is mounted [COMFYPOOL_CONTROL_URL]")
	secret := fs.String("secret", env("COMFYPOOL_FLEET_SECRET", ""), "fleet secret (prefer the environment or -secret-file) [COMFYPOOL_FLEET_SECRET]")
	secretFile := fs.String("secret-file", env("COMFYPOOL_FLEET_SECRET_FILE", ""), "file holding the fleet secret [COMFYPOOL_FLEET_SECRET_FILE]")
	worker := fs.String("worker-id", env("COMFYPOOL_WORKER_ID", ""), "worker id, unique in the fleet; defaults to the host name [COMFYPOOL_WORKER_ID]")
	fleetName := fs.String("fleet", env("COMFYPOOL_FLEET", fleet.DefaultFleet), "fleet name [COMFYPOOL_FLEET]")
	stage := fs.String("stage", env("COMFYPOOL_STAGE", ""), "stage name [COMFYPOOL_STAGE]")
	maxConc := fs.Int("max-concurrency", envInt(getenv, "COMFYPOOL_MAX_CONCURRENCY", 1), "jobs run at once [COMFYPOOL_MAX_CONCURRENCY]")
	comfyURL := fs.String("comfy-url", env("COMFYPOOL_COMFY_URL", ""), "ComfyUI base URL; defaults to "+fleet.DefaultComfyURL+", or Comfy Cloud's with -provider cloud [COMFYPOOL_COMFY_URL]")
	provider := fs.String("provider", env("COMFYPOOL_PROVIDER", string(pool.ProviderSelfHosted)), "how the ComfyUI is reached: self_hosted or cloud (the API key in COMFYPOOL_COMFY_API_KEY) [COMFYPOOL_PROVIDER]")
	shutdown := fs.Duration("shutdown-timeout", envDuration(getenv, "COMFYPOOL_SHUTDOWN_TIMEOUT", fleet.DefaultShutdownTimeout), "bound on giving jobs back at shutdown [COMFYPOOL_SHUTDOWN_TIMEOUT]")
	backoffMax := fs.Duration("backoff-max", envDuration(getenv, "COMFYPOOL_BACKOFF_MAX", fleet.DefaultAgentBackoffMax), "longest wait between retries while the control plane is unreachable [COMFYPOOL_BACKOFF_MAX]")
	level := fs.String("log-level", env("COMFYPOOL_LOG_LEVEL", "info"), "debug, info, warn or error [COMFYPOOL_LOG_LEVEL]")
	logFormat := fs.String("log-format", env("COMFYPOOL_LOG_FORMAT", "text"), "text or json [COMFYPOOL_LOG_FORMAT]")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "comfypool-agent: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return exitUsage
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(stderr, "comfypool-agent: -log-level %q: want debug, info, warn or error\n", *level)
		return exitUsage
	}
	hopts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler = slog.NewTextHandler(stderr, hopts)
	if *logFormat == "json" {
		h = slog.NewJSONHandler(stderr, hopts)
	}
	logger := slog.New(h)
	if *secretFile != "" {
		data, err := os.ReadFile(*secretFile)
		if err != nil {
			fmt.Fprintf(stderr, "comfypool-agent: -secret-file: %v\n", err)
			return exitUsage
		}
		*secret = strings.TrimSpace(string(data))
	}
	comfyOpts := &comfy.ClientOptions{Logger: logger}
	if pool.Provider(*provider) == pool.ProviderCloud {
		comfyOpts.APIKey = getenv("COMFYPOOL_COMFY_API_KEY")
		if comfyOpts.APIKey == "" {
			fmt.Fprintf(stderr, "comfypool-agent: -provider cloud needs a Comfy Cloud API key in COMFYPOOL_COMFY_API_KEY\n")
			return exitUsage
		}
		if *comfyURL == "" {
			*comfyURL = comfy.CloudURL
		}
	}
	a, err := fleet.NewAgent(&fleet.AgentConfig{
		ControlURL: *control, Secret: *secret, WorkerID: *worker, Fleet: *fleetName, Stage: *stage,
		MaxConcurrency: *maxConc, ComfyURL: *comfyURL, Comfy: comfyOpts, Provider: pool.Provider(*provider),
		ShutdownTimeout: *shutdown, BackoffMax: max(*backoffMax, fleet.DefaultAgentBackoffMin), Logger: logger,
	})
	if err != nil {
		fmt.Fprintf(stderr, "comfypool-agent: %v\n", err)
		return exitUsage
	}
	err = a.Run(ctx)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, fleet.ErrRevoked):
		fmt.Fprintf(stderr, "comfypool-agent: worker %s was revoked by the control plane: its jobs went back to the queue; it will not run again until an operator approves it\n", a.WorkerID())
		return exitDenied
	case errors.Is(err, fleet.ErrWrongSecret):
		fmt.Fprintf(stderr, "comfypool-agent: the control plane refused the fleet secret: check COMFYPOOL_FLEET_SECRET\n")
		return exitDenied
	}
	fmt.Fprintf(stderr, "comfypool-agent: %v\n", err)
	return exitFailed
}

func envInt(getenv func(string) string, name string, def int) int {
	if v, err := strconv.Atoi(getenv(name)); err == nil {
		return v
	}
	return def
}

func envDuration(getenv func(string) string, name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(getenv(name)); err == nil {
		return v
	}
	return def
}
