package redisqueue_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// TestCompleteFromHeldRecord checks the job Complete returns when the
// Driver built it from the record its Lease, Begin and Extend returned
// and the fields the script wrote (see held.go): it must be the job as
// stored, whatever the record holds (earlier attempts, an open one,
// Settle, binary fields, metadata), and the same when another process
// wrote the job in between, so that the script returns the whole record.
func TestCompleteFromHeldRecord(t *testing.T) {
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	d := newDriver(t, c, &redisqueue.Config{Prefix: prefix})
	other := queue.New(newDriver(t, c, &redisqueue.Config{Prefix: prefix}))
	q := queue.New(d)
	ctx := t.Context()
	lease := queue.LeaseParams{Backend: "b", Tags: []string{"gpu"}, Duration: time.Minute}
	for _, tc := range []struct {
		name   string
		settle bool
		result []byte
		before func(t *testing.T, j *queue.Job) // between Lease and Complete
	}{
		{name: "leased", result: []byte("out\x00\xff\"\\")},
		{name: "empty result", result: nil},
		{name: "settle", settle: true, result: []byte("r")},
		{name: "begun and extended", result: []byte("r"), before: func(t *testing.T, j *queue.Job) {
			_, err := q.Begin(ctx, j.ID, j.LeaseToken, queue.BeginParams{Backend: "b2", PromptID: "p1"})
			require.NoError(t, err)
			_, err = q.Begin(ctx, j.ID, j.LeaseToken, queue.BeginParams{PromptID: "p2"}) // supersedes p1
			require.NoError(t, err)
			_, err = q.Extend(ctx, j.ID, j.LeaseToken, time.Hour)
			require.NoError(t, err)
		}},
		{name: "written by another process", result: []byte("r"), before: func(t *testing.T, j *queue.Job) {
			_, err := other.Extend(ctx, j.ID, j.LeaseToken, time.Hour)
			require.NoError(t, err)
			_, err = other.Begin(ctx, j.ID, j.LeaseToken, queue.BeginParams{PromptID: "elsewhere"})
			require.NoError(t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := q.Enqueue(ctx, queue.EnqueueParams{
				Workflow: "wf", Overrides: []byte{0, 1, '"', 0xff}, Payload: []byte("{}"),
				Metadata: map[string]string{"k": "v"}, Requires: []string{"gpu"}, MaxAttempts: 3,
				IdempotencyKey: "idem-" + tc.name, Settle: tc.settle,
			})
			require.NoError(t, err)
			// An earlier attempt, failed, so that the record has closed
			// attempts and an error.
			j, err := q.Lease(ctx, lease)
			require.NoError(t, err)
			require.NotNil(t, j)
			_, err = q.Fail(ctx, j.ID, j.LeaseToken, queue.FailParams{Error: queue.ErrorSummary{Class: "x", Message: "m"}})
			require.NoError(t, err)
			j, err = q.Lease(ctx, lease)
			require.NoError(t, err)
			require.NotNil(t, j)
			require.Equal(t, 1, d.Held(), "the lease's record is held")
			if tc.before != nil {
				tc.before(t, j)
			}
			done, err := q.Complete(ctx, j.ID, j.LeaseToken, tc.result)
			require.NoError(t, err)
			assert.Equal(t, 0, d.Held(), "the completed job's record is no longer held")
			got, err := q.Get(ctx, j.ID)
			require.NoError(t, err)
			assert.Equal(t, got, done)
			assert.Equal(t, queue.StateCompleted, done.State)
			assert.Equal(t, tc.settle, done.Unsettled)
			assert.Equal(t, tc.result, done.Result)
			require.GreaterOrEqual(t, len(done.Attempts), 2)
			assert.Equal(t, queue.ClassNone, done.Attempts[len(done.Attempts)-1].Class)
		})
	}
}

// TestCompleteDelta checks the ops script's complete: with the version
// the caller holds, it returns the fields it wrote (detail "d") when
// the job is at that version, and the whole record when it is not.
func TestCompleteDelta(t *testing.T) {
	c := redistest.Client(t, 0)
	d := newDriver(t, c, nil)
	q := queue.New(d)
	ctx := t.Context()
	for _, tc := range []struct {
		name  string
		delta bool
	}{{"same version", true}, {"another version", false}} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := q.Enqueue(ctx, queue.EnqueueParams{})
			require.NoError(t, err)
			j, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: time.Minute})
			require.NoError(t, err)
			require.NotNil(t, j)
			known := strconv.FormatUint(j.Version, 10)
			if !tc.delta {
				known = strconv.FormatUint(j.Version-1, 10)
			}
			res, _ := d.RunOps(ctx, []any{"complete", j.ID, j.LeaseToken, "r", known})
			require.Len(t, res, 1)
			require.Equal(t, "ok", res[0][0])
			got, err := q.Get(ctx, j.ID)
			require.NoError(t, err)
			if !tc.delta {
				assert.Equal(t, "", res[0][1])
				return
			}
			assert.Equal(t, []any{"ok", "d", strconv.FormatUint(got.Version, 10),
				strconv.FormatInt(got.FinishedAt.UnixMicro(), 10), res[0][4], "1", ""}, res[0])
			require.IsType(t, "", res[0][4])
			assert.Contains(t, res[0][4], "4:none", "the closed attempt")
		})
	}
}
