// Package exampleconn is how the example programs (examples/...) reach
// their ComfyUI servers: it waits until they are connected and, when a
// server cannot be reached, says so within seconds with the connection
// error (a refused connection, a TLS or HTTP error), instead of leaving the
// example silent until its own timeout.
//
// A server counts as unreachable once its client is offline: its first
// connection attempts failed in a row (comfy.StateOffline, about a second
// for a refused connection), or when it has not connected within the
// given time (an address that drops packets).
package exampleconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/pool"
)

// Within is how long the examples wait for a server that neither connects
// nor fails (a dial that gets no answer).
const Within = 10 * time.Second

// ErrUnreachable is matched by the error of WaitClient and WaitPool when
// no server can be reached. The error also wraps each server's connection
// error.
var ErrUnreachable = errors.New("cannot reach ComfyUI")

// WaitClient connects c and waits until it is connected. It fails with
// an error matching ErrUnreachable, and wrapping the connection error, as
// soon as c goes offline, or when within passes first; it returns ctx's
// error when ctx ends first.
func WaitClient(ctx context.Context, c *comfy.Client, within time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var wg sync.WaitGroup
	offline := false
	wg.Go(func() { // ends the Connect below when c goes offline
		for {
			ch := c.StateChanged() // before State: no change is missed
			if c.State() == comfy.StateOffline {
				offline = true
				cancel()
				return
			}
			select {
			case <-ch:
			case <-cctx.Done():
				return
			}
		}
	})
	err := c.Connect(cctx)
	cancel()
	wg.Wait()
	switch {
	case err == nil:
		return nil
	case offline:
		return fmt.Errorf("%w at %s: %w", ErrUnreachable, c.BaseURL(), c.LastError())
	case ctx.Err() != nil:
		return err
	}
	return fmt.Errorf("%w at %s within %s: %w", ErrUnreachable, c.BaseURL(), within, err)
}

// WaitPool waits until the Pool's backends are connected and ready (their
// capabilities known), and reports how many on out. It returns as soon as
// every backend is connected, or at least one is while each of the others
// is offline or within has passed: those are named on out with their
// connection error, and join the Pool when they come up. When every
// backend is offline, or none connected within, it fails at once with an
// error matching ErrUnreachable that names each backend with its
// connection error (errors.Is and errors.As see each). p must be started;
// WaitPool returns ctx's error when ctx ends first, and pool.ErrClosed
// when p stops.
func WaitPool(ctx context.Context, p *pool.WorkflowPool, out io.Writer, within time.Duration) error {
	states, unsubscribe := p.Subscribe(pool.EventClientState)
	defer unsubscribe()
	timer := time.NewTimer(within)
	defer timer.Stop()
	expired := false
	if len(p.Backends()) == 0 {
		return nil // a Pool that drives no backend: nothing to wait for
	}
	var backends []pool.BackendStats
	up := 0
	for {
		backends = p.Backends() // after Subscribe: no change is missed
		up = 0
		offline := 0
		for _, b := range backends {
			switch b.State {
			case comfy.StateConnected:
				up++
			case comfy.StateOffline:
				offline++
			}
		}
		if up == 0 && (offline == len(backends) || expired) {
			return unreachable(backends, within, expired)
		}
		if up == len(backends) || (up > 0 && (up+offline == len(backends) || expired)) {
			break
		}
		select {
		case _, ok := <-states:
			if !ok {
				return pool.ErrClosed
			}
		case <-timer.C:
			expired = true
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if _, err := p.WaitConnected(ctx, up); err != nil {
		return err
	}
	if up == len(backends) {
		fmt.Fprintf(out, "%d backend(s) connected\n", up)
		return nil
	}
	fmt.Fprintf(out, "%d of %d backend(s) connected; the others join when they come up:\n", up, len(backends))
	for _, b := range backends {
		if b.State != comfy.StateConnected {
			fmt.Fprintf(out, "  %s\n", describe(b))
		}
	}
	return nil
}

// unreachable is WaitPool's error when no backend connected.
func unreachable(backends []pool.BackendStats, within time.Duration, expired bool) error {
	lines := make([]string, 0, len(backends))
	errs := []error{ErrUnreachable}
	for _, b := range backends {
		lines = append(lines, describe(b))
		if b.LastError != nil {
			errs = append(errs, b.LastError)
		}
	}
	what := "no backend is reachable"
	if expired {
		what = fmt.Sprintf("no backend connected within %s", within)
	}
	return &joined{msg: what + ":\n  " + strings.Join(lines, "\n  "), errs: errs}
}

// describe renders a backend that is not connected, with why.
func describe(b pool.BackendStats) string {
	if b.LastError != nil {
		return fmt.Sprintf("%s (%s): %v", b.Name, b.State, b.LastError)
	}
	return fmt.Sprintf("%s (%s): no answer yet", b.Name, b.State)
}

// joined is an error with its own message that wraps several errors.
type joined struct {
	msg  string
	errs []error
}

func (e *joined) Error() string   { return e.msg }
func (e *joined) Unwrap() []error { return e.errs }
