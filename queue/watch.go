package queue

import "context"

// DefaultChangeBuffer is the buffer of a change subscription made with
// buffer zero.
const DefaultChangeBuffer = 64

// Change is one write to a job record, as a change feed delivers it: every
// state change and every attempt record (Begin, and the writes that close
// an attempt) publishes one; Extend and Settle do not. A Change says which job and
// which version; read the record with Get for the rest.
type Change struct {
	// JobID is the job written; empty when Gap is set.
	JobID string
	// State is the job's state after the write.
	State State
	// Version is the job's Version after the write: a reader that has seen
	// a higher version of the job may ignore this change.
	Version uint64
	// Gap reports that the subscriber fell behind and changes were dropped
	// before this one (or that the driver lost its connection to the feed):
	// everything delivered so far may be stale. Re-read with Get every job
	// you follow. A gap is always delivered: a subscriber never loses a
	// change silently, in particular not a terminal one.
	Gap bool
}

// Watcher is an optional Driver interface: a feed of job changes, so that
// a job can be watched from any process on the queue (PostgreSQL:
// LISTEN/NOTIFY; Redis: pub/sub or a stream).
type Watcher interface {
	// Subscribe returns a channel that receives a Change for every write
	// (see Change) made after the call, from any process, and a func that
	// ends the subscription. The channel holds buffer changes (buffer >= 1;
	// Queue passes DefaultChangeBuffer for zero); the driver never blocks
	// on a slow subscriber: when the buffer is full it discards what the
	// subscriber has not read and delivers one Change with Gap set. Order
	// is per job: a job's changes arrive in Version order. The channel is
	// closed when the func is called (idempotent) or the driver is closed.
	Subscribe(ctx context.Context, buffer int) (<-chan Change, func(), error)
}
