package pool_test

import (
	"errors"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/pool"
)

// Reusing an idempotency key with another workflow is an error naming the
// job that holds the key, not a silent answer with that job's ID; the same
// workflow again still gets the first job. Both while the Pool holds the
// job's record and after it dropped it (the queue still holds the key).
func TestIdempotencyKeyWithAnotherWorkflow(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, func(c *pool.Config) { c.MaxRetained = 1 })
		ctx := t.Context()
		first, err := b.pool.Enqueue(ctx, zeroWF(t, 1), &pool.EnqueueOpts{IdempotencyKey: "order-7"})
		require.NoError(t, err)
		_, err = b.pool.Wait(ctx, first)
		require.NoError(t, err)

		check := func(t *testing.T) {
			again, err := b.pool.Enqueue(ctx, zeroWF(t, 1), &pool.EnqueueOpts{IdempotencyKey: "order-7"})
			require.NoError(t, err)
			assert.Equal(t, first, again)

			_, err = b.pool.Enqueue(ctx, zeroWF(t, 2), &pool.EnqueueOpts{IdempotencyKey: "order-7"})
			require.ErrorIs(t, err, pool.ErrIdempotencyConflict)
			var ce *pool.IdempotencyConflictError
			require.True(t, errors.As(err, &ce), "%v", err)
			assert.Equal(t, "order-7", ce.Key)
			assert.Equal(t, first, ce.ExistingID)
		}
		check(t) // the record is held

		// Another job pushes the first one's record out of the Pool
		// (MaxRetained 1); the queue still holds its key.
		other, err := b.pool.Enqueue(ctx, zeroWF(t, 3), nil)
		require.NoError(t, err)
		_, err = b.pool.Wait(ctx, other)
		require.NoError(t, err)
		check(t) // the Pool forgot it; the queue answers
	})
}

// A key whose job the queue dropped (purged) is free again: Enqueue makes
// a new job rather than answer with an ID the queue no longer knows.
func TestIdempotencyKeyAfterPurge(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		ctx := t.Context()
		first, err := b.pool.Enqueue(ctx, zeroWF(t, 1), &pool.EnqueueOpts{IdempotencyKey: "order-8"})
		require.NoError(t, err)
		_, err = b.pool.Wait(ctx, first)
		require.NoError(t, err)
		n, err := b.pool.Purge(ctx, pool.PurgeFilter{})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		again, err := b.pool.Enqueue(ctx, zeroWF(t, 1), &pool.EnqueueOpts{IdempotencyKey: "order-8"})
		require.NoError(t, err)
		assert.NotEqual(t, first, again, "a new job")
		_, err = b.pool.Wait(ctx, again)
		require.NoError(t, err)
	})
}

// Text no queue can store (bytes that are not UTF-8, NUL) in a job's
// metadata or idempotency key is refused with ErrInvalid, and leaves
// nothing behind: the Pool holds no job, and the key is free.
func TestEnqueueTextRefused(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, 1, nil, nil)
		ctx := t.Context()
		for name, o := range map[string]*pool.EnqueueOpts{
			"metadata not UTF-8":  {Metadata: map[string]string{"tenant": "a\xffb"}},
			"metadata key NUL":    {Metadata: map[string]string{"ten\x00ant": "a"}},
			"idempotency key NUL": {IdempotencyKey: "order-\x00"},
			"both, with a key":    {IdempotencyKey: "order-8", Metadata: map[string]string{"tenant": "\xc3"}},
			"tag not UTF-8":       {Tags: []string{"gpu\xff"}},
			"backend with NUL":    {ExcludeBackends: []string{"b\x00"}},
		} {
			_, err := b.pool.Enqueue(ctx, zeroWF(t, 1), o)
			assert.ErrorIs(t, err, pool.ErrInvalid, name)
		}
		page, err := b.pool.List(ctx, pool.ListFilter{Count: true})
		require.NoError(t, err)
		assert.Empty(t, page.Jobs, "nothing stored")

		id, err := b.pool.Enqueue(ctx, zeroWF(t, 1), &pool.EnqueueOpts{IdempotencyKey: "order-8", Metadata: map[string]string{"tenant": "é"}})
		require.NoError(t, err, "the key is free")
		_, err = b.pool.Wait(ctx, id)
		require.NoError(t, err)
	})
}
