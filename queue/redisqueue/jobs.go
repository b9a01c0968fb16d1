package redisqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/queue"
)

// result turns an op's result into the job or the error it stands for.
func (d *Driver) result(op, id string, res []any) (*queue.Job, error) {
	status, _ := res[0].(string)
	detail := ""
	if len(res) > 1 {
		detail, _ = res[1].(string)
	}
	switch op {
	case "lease", "extend", "begin":
	default: // the lease ends (or is not this Driver's)
		if id != "" {
			d.held.drop(id)
		}
	}
	switch status {
	case "ok":
		if len(res) < 3 {
			return nil, fmt.Errorf("redisqueue: %s: malformed reply", op)
		}
		var j *queue.Job
		var err error
		switch op {
		case "lease", "extend", "begin":
			j, err = d.holdRow(res[2])
		default:
			j, err = decodeRow(res[2])
		}
		if err != nil {
			return nil, err
		}
		d.arm(j)
		if j.State.Terminal() && (op == "complete" || op == "fail" || op == "cancel") {
			d.signalSpace() // a local waiter need not wait for the message
		}
		return j, nil
	case "none":
		return nil, nil
	case "notfound":
		d.held.drop(id)
		return nil, fmt.Errorf("%w: %s", queue.ErrNotFound, id)
	case "lost":
		d.held.drop(id)
		return nil, errorf(queue.ErrLeaseLost, "job %s is %s", id, detail)
	case "invalid":
		return nil, errorf(queue.ErrInvalidState, "cannot %s job %s: it is %s", op, id, detail)
	case "cancelled":
		return nil, fmt.Errorf("cannot cancel job %s: %w", id, queue.ErrAlreadyCancelled)
	case "full":
		return nil, &queue.FullError{Capacity: d.cfg.Capacity}
	case "error":
		// The op failed in its script (a malformed record); the other
		// ops of its group went on.
		return nil, fmt.Errorf("redisqueue: %s %s: %s", op, id, detail)
	}
	return nil, fmt.Errorf("redisqueue: %s: unexpected status %q", op, status)
}

// do runs one job operation and returns its job.
func (d *Driver) do(ctx context.Context, op, id string, args ...any) (*queue.Job, error) {
	res, err := d.op(ctx, append([]any{op}, args...)...)
	if err != nil {
		return nil, err
	}
	return d.result(op, id, res)
}

// Enqueue implements [queue.Driver].
// The job is returned as the script stored it, in the same step (a
// later read could show it already leased by another process).
func (d *Driver) Enqueue(ctx context.Context, p *queue.EnqueueParams) (*queue.Job, error) {
	_, rec, err := d.enqueue(ctx, []queue.EnqueueParams{*p}, true)
	if err != nil {
		var be *queue.BatchError
		if errors.As(err, &be) {
			return nil, be.Err
		}
		return nil, err
	}
	return decodeRow(rec)
}

// EnqueueIDs implements [queue.IDEnqueuer]: the batch is one script call,
// all or nothing.
func (d *Driver) EnqueueIDs(ctx context.Context, ps []queue.EnqueueParams) ([]string, error) {
	ids, _, err := d.enqueue(ctx, ps, false)
	return ids, err
}

// enqueueFields is the number of arguments of one job in enqueue.lua.
const enqueueFields = 13

// enqueue stores ps in one script call; with record set it also returns
// the first job's record as stored.
func (d *Driver) enqueue(ctx context.Context, ps []queue.EnqueueParams, record bool) (ids []string, rec any, err error) {
	if err := d.check(ctx); err != nil {
		return nil, nil, err
	}
	ids = make([]string, len(ps))
	args := make([]any, 0, 3+len(ps)*enqueueFields)
	args = append(args, d.cfg.Capacity, len(ps), flag(record))
	for i := range ps {
		p := &ps[i]
		id, err := uuid.NewV7()
		if err != nil {
			return nil, nil, fmt.Errorf("redisqueue: enqueue: %w", err)
		}
		ids[i] = id.String()
		md := ""
		if len(p.Metadata) > 0 {
			b, err := json.Marshal(p.Metadata)
			if err != nil {
				return nil, nil, fmt.Errorf("redisqueue: enqueue: metadata: %w", err)
			}
			md = string(b)
		}
		args = append(args, ids[i], p.Priority, p.Workflow, p.WorkflowKey, p.Overrides, p.Payload, md,
			encodeSet(p.Requires), encodeSet(p.Needs), encodeSet(p.ExcludeBackends), p.IdempotencyKey, p.MaxAttempts,
			settleArg(p.Settle))
	}
	raw, err := d.runSynced(ctx, "enqueue", args...)
	if err != nil {
		return nil, nil, wrapErr("enqueue", err)
	}
	res, _ := raw.([]any)
	if len(res) == 0 {
		return nil, nil, fmt.Errorf("redisqueue: enqueue: malformed reply %T", raw)
	}
	status, _ := res[0].(string)
	if status == "ok" {
		d.signalReady() // a local lessee need not wait for the message
		if record {
			if len(res) < 2 {
				return nil, nil, fmt.Errorf("redisqueue: enqueue: malformed reply %v", res)
			}
			rec = res[1]
		}
		return ids, rec, nil
	}
	if len(res) < 2 {
		return nil, nil, fmt.Errorf("redisqueue: enqueue: malformed reply %v", res)
	}
	index, _ := res[1].(int64)
	var why error
	switch status {
	case "dup":
		existing, _ := res[2].(string)
		why = &queue.DuplicateError{Key: ps[index].IdempotencyKey, ExistingID: existing}
	case "notfound":
		why = fmt.Errorf("%w: no workflow stored under key %q", queue.ErrNotFound, ps[index].WorkflowKey)
	case "full":
		why = &queue.FullError{Capacity: d.cfg.Capacity}
	default:
		return nil, nil, fmt.Errorf("redisqueue: enqueue: unexpected status %q", status)
	}
	return nil, nil, &queue.BatchError{Index: int(index), Err: why}
}

// Lease implements [queue.Driver].
func (d *Driver) Lease(ctx context.Context, p *queue.LeaseParams) (*queue.Job, error) {
	wfs := ""
	if p.Workflows != nil {
		wfs = encodeSet(p.Workflows)
	}
	has := ""
	if p.Has != nil {
		has = encodeSet(p.Has.Items())
	}
	return d.do(ctx, "lease", "", p.Backend, micros(p.Duration), uuid.NewString(), wfs,
		encodeSet(p.Tags), has, encodeSet(p.ExcludeWorkflows), encodeSet(p.PreferWorkflows))
}

// Extend implements [queue.Driver].
func (d *Driver) Extend(ctx context.Context, id, token string, dur time.Duration) (*queue.Job, error) {
	return d.do(ctx, "extend", id, id, token, micros(dur))
}

// Begin implements [queue.Driver].
func (d *Driver) Begin(ctx context.Context, id, token string, p *queue.BeginParams) (*queue.Job, error) {
	return d.do(ctx, "begin", id, id, token, p.Backend, p.PromptID)
}

// Complete implements [queue.Driver]. When this Driver holds the job's
// record from the lease (see held), the script returns only what it
// wrote, and the job is that record with these.
func (d *Driver) Complete(ctx context.Context, id, token string, result []byte) (*queue.Job, error) {
	base := d.held.take(id, token)
	known := ""
	if base != nil {
		known = base.v[fV]
	}
	res, err := d.op(ctx, "complete", id, token, result, known)
	if err != nil {
		return nil, err
	}
	if base == nil || len(res) < 2 || res[1] != "d" {
		return d.result("complete", id, res)
	}
	j, err := completed(base, res[2:], result)
	if err != nil {
		return nil, err
	}
	d.signalSpace() // a local waiter need not wait for the message
	return j, nil
}

// needsArg encodes replacement needs: "" keeps them.
func needsArg(needs []string) string {
	if needs == nil {
		return ""
	}
	return encodeSet(needs)
}

// settleArg is enqueue.lua's settle field: "1", or "" (not written).
func settleArg(settle bool) string {
	if settle {
		return "1"
	}
	return ""
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Fail implements [queue.Driver].
func (d *Driver) Fail(ctx context.Context, id, token string, p *queue.FailParams) (*queue.Job, error) {
	e := p.Error
	retryAfter := "0"
	if p.RetryAfter > 0 {
		retryAfter = micros(p.RetryAfter)
	}
	return d.do(ctx, "fail", id, id, token, e.Class, e.Message, e.NodeID, e.NodeType,
		retryAfter, flag(p.NoRetry), flag(p.ExcludeBackend), needsArg(p.Needs))
}

// Requeue implements [queue.Driver].
func (d *Driver) Requeue(ctx context.Context, id, token string, p *queue.RequeueParams) (*queue.Job, error) {
	e := p.Error
	return d.do(ctx, "requeue", id, id, token, e.Class, e.Message, e.NodeID, e.NodeType, needsArg(p.Needs))
}

// Cancel implements [queue.Driver].
func (d *Driver) Cancel(ctx context.Context, id string, p *queue.CancelParams) (*queue.Job, error) {
	e := p.Error
	return d.do(ctx, "cancel", id, id, e.Class, e.Message, e.NodeID, e.NodeType)
}

// Retry implements [queue.Driver].
func (d *Driver) Retry(ctx context.Context, id string) (*queue.Job, error) {
	return d.do(ctx, "retry", id, id, d.cfg.Capacity)
}

// Get implements [queue.Driver].
func (d *Driver) Get(ctx context.Context, id string) (*queue.Job, error) {
	return d.do(ctx, "get", id, id)
}

// Settle implements [queue.Settler]: one op of the ops script clears the
// job's us field and claim and moves it from unsettled to fin; a job
// that is not unsettled is returned as it is. It publishes no change.
func (d *Driver) Settle(ctx context.Context, id string) (*queue.Job, error) {
	return d.do(ctx, "settle", id, id)
}

// ClaimUnsettled implements [queue.Settler] with one script
// (lua/settle.lua), which applies what is due, returns lapsed claims to
// the sorted set of unsettled jobs by finish time and claims the oldest:
// it reads the jobs it returns and the claims that lapsed, not the
// queue.
func (d *Driver) ClaimUnsettled(ctx context.Context, finishedBefore time.Time, claim time.Duration, limit int) ([]*queue.Job, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	before := ""
	if !finishedBefore.IsZero() {
		// Finish times are whole µs: FinishedAt <= finishedBefore is
		// fi <= finishedBefore's µs, rounded down.
		before = strconv.FormatInt(finishedBefore.UnixMicro(), 10)
	}
	raw, err := d.run(ctx, "settle", before, micros(claim), limit)
	if err != nil {
		return nil, wrapErr("claim unsettled", err)
	}
	rows, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("redisqueue: claim unsettled: malformed reply %T", raw)
	}
	jobs := make([]*queue.Job, 0, len(rows))
	for _, row := range rows {
		j, err := decodeRow(row)
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// PutWorkflow implements [queue.Driver].
func (d *Driver) PutWorkflow(ctx context.Context, key string, body []byte) error {
	if err := d.check(ctx); err != nil {
		return err
	}
	_, err := d.run(ctx, "workflows", "put", key, body)
	return wrapErr("put workflow", err)
}

// GetWorkflow implements [queue.Driver].
func (d *Driver) GetWorkflow(ctx context.Context, key string) ([]byte, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	b, err := d.c.Get(ctx, d.p+"w:"+key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w: no workflow stored under key %q", queue.ErrNotFound, key)
	}
	if err != nil {
		return nil, wrapErr("get workflow", err)
	}
	return b, nil
}

// PurgeWorkflows implements [queue.Driver].
func (d *Driver) PurgeWorkflows(ctx context.Context, storedBefore time.Time) (int, error) {
	if err := d.check(ctx); err != nil {
		return 0, err
	}
	n, err := d.run(ctx, "workflows", "purge", strconv.FormatInt(storedBefore.UnixMicro(), 10))
	if err != nil {
		return 0, wrapErr("purge workflows", err)
	}
	c, _ := n.(int64)
	return int(c), nil
}

// pauseMember is a scope's member of the paused set.
func pauseMember(s queue.PauseScope) string {
	switch {
	case s.Workflow != "":
		return "w:" + s.Workflow
	case s.Tag != "":
		return "t:" + s.Tag
	}
	return "a"
}

// SetPaused implements [queue.Driver].
func (d *Driver) SetPaused(ctx context.Context, s queue.PauseScope, paused bool) error {
	if err := d.check(ctx); err != nil {
		return err
	}
	_, err := d.run(ctx, "pause", pauseMember(s), flag(paused))
	if err == nil && !paused {
		d.signalReady()
	}
	return wrapErr("set paused", err)
}

// Paused implements [queue.Driver].
func (d *Driver) Paused(ctx context.Context) ([]queue.PauseScope, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	ms, err := d.c.SMembers(ctx, d.p+"paused").Result()
	if err != nil {
		return nil, wrapErr("paused", err)
	}
	out := make([]queue.PauseScope, 0, len(ms))
	for _, m := range ms {
		switch {
		case m == "a":
			out = append(out, queue.PauseScope{})
		case len(m) > 2 && m[:2] == "w:":
			out = append(out, queue.PauseScope{Workflow: m[2:]})
		case len(m) > 2 && m[:2] == "t:":
			out = append(out, queue.PauseScope{Tag: m[2:]})
		}
	}
	return out, nil
}

// Stats implements [queue.Driver].
func (d *Driver) Stats(ctx context.Context) (*queue.Stats, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	raw, err := d.run(ctx, "stats")
	if err != nil {
		return nil, wrapErr("stats", err)
	}
	r, _ := raw.([]any)
	if len(r) != 7 {
		return nil, fmt.Errorf("redisqueue: stats: malformed reply %v", raw)
	}
	n := func(i int) int { v, _ := r[i].(int64); return int(v) }
	age, _ := strconv.ParseInt(fmt.Sprint(r[6]), 10, 64)
	return &queue.Stats{Queued: n(0), Leased: n(1), Retrying: n(2), Completed: n(3), Dead: n(4), Cancelled: n(5),
		Capacity: d.cfg.Capacity, OldestQueuedAge: time.Duration(age) * time.Microsecond}, nil
}
