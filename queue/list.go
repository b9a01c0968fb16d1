package queue

import (
	"slices"
	"time"
)

// Limits of [ListParams].Limit.
const (
	// DefaultListLimit is the page size of a List with Limit zero.
	DefaultListLimit = 100
	// MaxListLimit is the largest page; a larger Limit is reduced to it.
	MaxListLimit = 1000
)

// ListParams selects and pages jobs for [Driver.List]. Every filter that is
// set must hold (AND); an unset one (nil, "", zero time) selects all.
type ListParams struct {
	// States keeps jobs in one of the states; nil or empty means all.
	States []State
	// Workflow keeps jobs whose Job.Workflow is this; "" means any.
	Workflow string
	// WorkflowKey keeps jobs whose Job.WorkflowKey is this (the jobs of one
	// stored template); "" means any.
	WorkflowKey string
	// Backend keeps jobs that the backend leased or ran an attempt on (its
	// current lease, or any Attempt.Backend); "" means any.
	Backend string
	// Metadata keeps jobs whose Metadata holds every one of these
	// key=value pairs (a tenant, say).
	Metadata map[string]string
	// EnqueuedAfter and EnqueuedBefore keep jobs with EnqueuedAfter <=
	// EnqueuedAt < EnqueuedBefore (each bound only when not zero).
	EnqueuedAfter, EnqueuedBefore time.Time
	// FinishedAfter and FinishedBefore keep terminal jobs with
	// FinishedAfter <= FinishedAt < FinishedBefore (each bound only when
	// not zero); setting either excludes unfinished jobs.
	FinishedAfter, FinishedBefore time.Time

	// OldestFirst lists in enqueue order (EnqueuedAt, then the enqueue
	// sequence); the default is the reverse, newest first. A job keeps its
	// place for its whole life (Requeue and Retry keep EnqueuedAt).
	OldestFirst bool
	// Cursor continues a listing: ListPage.Next of the previous page, with
	// the same filters and order. "" starts at the beginning. The page
	// starts right after the job the cursor names in that order, so jobs
	// enqueued meanwhile never shift a page: newest first, they sort
	// before the cursor (a new listing shows them); oldest first, they come
	// at the end.
	Cursor string
	// Limit is the page size: zero means DefaultListLimit, larger than
	// MaxListLimit means MaxListLimit; negative is invalid.
	Limit int
	// Count asks for ListPage.Counts.
	Count bool
}

// ListPage is one page of a List.
type ListPage struct {
	// Jobs are the page's jobs in the requested order.
	Jobs []*Job
	// Next is the cursor of the next page; "" when this page is the last.
	Next string
	// Counts, when ListParams.Count was set, holds for each state the
	// number of jobs that match every filter except States (so that a view
	// can show every state's count beside one state's jobs). States with
	// no jobs may be absent.
	Counts map[State]int
}

// PurgeParams selects terminal jobs for [Driver.Purge]. Unsettled jobs
// (Job.Unsettled) are never purged, whatever the params.
type PurgeParams struct {
	// States are the terminal states to purge; nil or empty means
	// completed, dead and cancelled. A non-terminal state is invalid.
	States []State
	// FinishedBefore keeps jobs that finished at or after it; zero purges
	// regardless of age.
	FinishedBefore time.Time
	// Limit bounds the number of jobs purged in one call (oldest finished
	// first); zero means no bound; negative is invalid.
	Limit int
}

// PauseScope names what [Driver.SetPaused] pauses: the whole queue (the
// zero value), the jobs of one workflow (Job.Workflow), or the jobs that
// require one tag (in Job.Requires). Setting both fields is invalid.
type PauseScope struct {
	// Workflow pauses the jobs whose Job.Workflow is this.
	Workflow string
	// Tag pauses the jobs whose Job.Requires holds this tag.
	Tag string
}

// All reports whether s is the whole queue.
func (s PauseScope) All() bool { return s == PauseScope{} }

// String returns "all", "workflow <name>" or "tag <name>".
func (s PauseScope) String() string {
	switch {
	case s.Workflow != "":
		return "workflow " + s.Workflow
	case s.Tag != "":
		return "tag " + s.Tag
	}
	return "all"
}

// sortPauseScopes sorts scopes as Queue.Paused returns them: the whole
// queue first, then workflows, then tags, each by name.
func sortPauseScopes(s []PauseScope) {
	rank := func(p PauseScope) int {
		switch {
		case p.Workflow != "":
			return 1
		case p.Tag != "":
			return 2
		}
		return 0
	}
	slices.SortFunc(s, func(a, b PauseScope) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		if a.Workflow != b.Workflow {
			if a.Workflow < b.Workflow {
				return -1
			}
			return 1
		}
		if a.Tag < b.Tag {
			return -1
		}
		if a.Tag > b.Tag {
			return 1
		}
		return 0
	})
}

// Valid reports whether s is one of the job states.
func (s State) Valid() bool {
	switch s {
	case StateQueued, StateLeased, StateRetrying, StateCompleted, StateDead, StateCancelled:
		return true
	}
	return false
}
