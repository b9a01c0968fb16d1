package pgqueue

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/comfypool/comfypool/queue"
)

// scanJob reads a row of jobCols.
func scanJob(row pgx.Row) (*queue.Job, error) {
	var (
		j                                    queue.Job
		state                                string
		meta                                 map[string]string
		enq, avail                           time.Time
		leasedAt, expires, finished          *time.Time
		errClass, errMsg, errNode, errNodeTy string
		attempts                             []string
	)
	err := row.Scan(&j.ID, &j.Version, &state, &j.Priority, &j.Workflow, &j.WorkflowKey,
		&j.Overrides, &j.Payload, &meta, &j.Requires, &j.Needs, &j.ExcludeBackends,
		&j.IdempotencyKey, &j.MaxAttempts, &j.AttemptsUsed,
		&enq, &avail, &leasedAt, &expires, &finished,
		&j.LeasedBy, &j.LeaseToken, &j.Result,
		&errClass, &errMsg, &errNode, &errNodeTy, &j.Settle, &j.Unsettled, &attempts)
	if err != nil {
		return nil, err
	}
	j.State = queue.State(state)
	if len(meta) > 0 {
		j.Metadata = meta
	}
	j.Requires, j.Needs, j.ExcludeBackends = nilEmpty(j.Requires), nilEmpty(j.Needs), nilEmpty(j.ExcludeBackends)
	j.Overrides, j.Payload, j.Result = nilEmptyBytes(j.Overrides), nilEmptyBytes(j.Payload), nilEmptyBytes(j.Result)
	j.EnqueuedAt, j.AvailableAt = enq.UTC(), avail.UTC()
	j.LeasedAt, j.LeaseExpiresAt, j.FinishedAt = utc(leasedAt), utc(expires), utc(finished)
	j.Error = queue.ErrorSummary{Class: errClass, Message: errMsg, NodeID: errNode, NodeType: errNodeTy}
	if len(attempts) > 0 {
		j.Attempts = make([]queue.Attempt, len(attempts))
		for i, s := range attempts {
			a, err := decodeAttempt(s)
			if err != nil {
				return nil, err
			}
			a.Number = i + 1
			j.Attempts[i] = a
		}
	}
	return &j, nil
}

// decodeAttempt decodes one attempt of jobCols: a JSON array.
func decodeAttempt(s string) (queue.Attempt, error) {
	var (
		a        queue.Attempt
		started  int64
		ended    *int64
		fields   = []any{&a.Backend, &a.PromptID, &started, &ended, &a.Class, &a.Error.Class, &a.Error.Message, &a.Error.NodeID, &a.Error.NodeType, &a.Counted}
		raw      []json.RawMessage
		firstErr error
	)
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return a, fmt.Errorf("pgqueue: decode attempt: %w", err)
	}
	if len(raw) != len(fields) {
		return a, fmt.Errorf("pgqueue: decode attempt: %d fields", len(raw))
	}
	for i, r := range raw {
		if err := json.Unmarshal(r, fields[i]); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return a, fmt.Errorf("pgqueue: decode attempt: %w", firstErr)
	}
	a.StartedAt = time.UnixMicro(started).UTC()
	if ended != nil {
		a.EndedAt = time.UnixMicro(*ended).UTC()
	}
	return a, nil
}

func utc(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

func nilEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func nilEmptyBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// emptyArr returns s, or an empty non-nil slice (an empty SQL array, not
// NULL).
func emptyArr(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// bytesArg is b, or nil (NULL) when empty.
func bytesArg(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

// textArg is s, or nil (NULL) when empty.
func textArg(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// metaArg is m, or nil (NULL) when empty.
func metaArg(m map[string]string) any {
	if len(m) == 0 {
		return nil
	}
	return m
}

// parseID returns id as a UUID, and false when it cannot name a job.
func parseID(id string) (uuid.UUID, bool) {
	u, err := uuid.Parse(id)
	return u, err == nil
}
