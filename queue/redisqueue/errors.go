package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/queue"
)

// wrapErr wraps an error of Redis as "redisqueue: op: ...", marked with
// queue.Retryable when the same call may succeed later: a network error
// or timeout, or a reply saying the server cannot serve now (LOADING,
// BUSY, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY after a failover).
// Errors of the caller's context are returned wrapped but not retryable.
// The messages of go-redis never carry the password.
func wrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	w := fmt.Errorf("redisqueue: %s: %w", op, err)
	if transient(err) {
		return queue.Retryable(w)
	}
	return w
}

// transient reports whether err is a failure of Redis that may pass.
func transient(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false // the caller gave up
	}
	if errors.Is(err, redis.ErrClosed) {
		return false // the client was closed by its owner
	}
	if errors.Is(err, redis.ErrPoolTimeout) {
		return true // every connection was busy
	}
	// A failed network operation, a timeout of the client's own (dial,
	// read, write) included; a context deadline that is not one is the
	// caller's (context.DeadlineExceeded is a net.Error too).
	var op *net.OpError
	if errors.As(err, &op) {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, net.ErrClosed) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}
