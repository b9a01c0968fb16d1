package redisqueue

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/queue"
)

// cursorPrefix starts every cursor of this driver: "r1." then the enqueue
// sequence of the last job of the page, base 36.
const cursorPrefix = "r1."

// listChunk is the number of jobs List reads per round trip.
const listChunk = 256

// allStates lists the states in Stats order.
var allStates = []queue.State{queue.StateQueued, queue.StateLeased, queue.StateRetrying,
	queue.StateCompleted, queue.StateDead, queue.StateCancelled}

// List implements [queue.Driver]. It walks an index of jobs in enqueue
// order (the state's when p names one state, else all jobs'), a chunk
// at a time, and keeps the jobs that match every filter: a listing costs
// the jobs it walks, which the narrower filters (workflow, metadata,
// backend) do not reduce. Counts are a count of each state's index when
// p filters by state alone, else a walk of every job.
func (d *Driver) List(ctx context.Context, p *queue.ListParams) (*queue.ListPage, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	var after int64 = -1 // the cursor's sequence; -1: from the start
	if p.Cursor != "" {
		s, ok := strings.CutPrefix(p.Cursor, cursorPrefix)
		n, err := strconv.ParseInt(s, 36, 64)
		if !ok || err != nil || n < 0 {
			return nil, fmt.Errorf("%w: malformed cursor %q", queue.ErrInvalid, p.Cursor)
		}
		after = n
	}
	if _, _, _, err := d.tick(ctx); err != nil {
		return nil, err
	}
	index := d.p + "all"
	if len(p.States) == 1 {
		index = d.p + "s:" + string(p.States[0])
	}
	page := &queue.ListPage{}
	var lastSeq int64
	err := d.walk(ctx, index, p.OldestFirst, after, func(j *queue.Job, seq int64) bool {
		if !matches(j, p, true) {
			return !pastEnqueueBound(j, p)
		}
		if len(page.Jobs) == p.Limit {
			page.Next = cursorPrefix + strconv.FormatInt(lastSeq, 36)
			return false
		}
		page.Jobs = append(page.Jobs, j)
		lastSeq = seq
		return true
	})
	if err != nil {
		return nil, err
	}
	if p.Count {
		if page.Counts, err = d.counts(ctx, p); err != nil {
			return nil, err
		}
	}
	return page, nil
}

// pastEnqueueBound reports whether the walk has passed the enqueue-time
// bounds (enqueue times grow with the sequence).
func pastEnqueueBound(j *queue.Job, p *queue.ListParams) bool {
	if p.OldestFirst {
		return !p.EnqueuedBefore.IsZero() && !j.EnqueuedAt.Before(p.EnqueuedBefore)
	}
	return !p.EnqueuedAfter.IsZero() && j.EnqueuedAt.Before(p.EnqueuedAfter)
}

// counts returns the counts by state of the jobs matching p's filters
// but States.
func (d *Driver) counts(ctx context.Context, p *queue.ListParams) (map[queue.State]int, error) {
	out := map[queue.State]int{}
	f := *p
	f.States = nil
	if f.Workflow == "" && f.WorkflowKey == "" && f.Backend == "" && len(f.Metadata) == 0 &&
		f.EnqueuedAfter.IsZero() && f.EnqueuedBefore.IsZero() && f.FinishedAfter.IsZero() && f.FinishedBefore.IsZero() {
		pipe := d.c.Pipeline()
		cards := make([]*redis.IntCmd, len(allStates))
		for i, st := range allStates {
			cards[i] = pipe.ZCard(ctx, d.p+"s:"+string(st))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, wrapErr("list: count", err)
		}
		for i, st := range allStates {
			if n := cards[i].Val(); n > 0 {
				out[st] = int(n)
			}
		}
		return out, nil
	}
	err := d.walk(ctx, d.p+"all", true, -1, func(j *queue.Job, _ int64) bool {
		if matches(j, &f, false) {
			out[j.State]++
		}
		return true
	})
	return out, err
}

// walk calls fn with the jobs of index (a sorted set of job IDs by
// enqueue sequence) after the sequence after (-1: all), in order, until
// fn returns false.
func (d *Driver) walk(ctx context.Context, index string, oldestFirst bool, after int64, fn func(*queue.Job, int64) bool) error {
	for {
		by := &redis.ZRangeBy{Min: "-inf", Max: "+inf", Count: listChunk}
		if after >= 0 {
			if oldestFirst {
				by.Min = "(" + strconv.FormatInt(after, 10)
			} else {
				by.Max = "(" + strconv.FormatInt(after, 10)
			}
		}
		var zs []redis.Z
		var err error
		if oldestFirst {
			zs, err = d.c.ZRangeByScoreWithScores(ctx, index, by).Result()
		} else {
			zs, err = d.c.ZRevRangeByScoreWithScores(ctx, index, by).Result()
		}
		if err != nil {
			return wrapErr("list", err)
		}
		if len(zs) == 0 {
			return nil
		}
		pipe := d.c.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, len(zs))
		for i, z := range zs {
			cmds[i] = pipe.HGetAll(ctx, d.p+"j:"+z.Member.(string))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return wrapErr("list", err)
		}
		for i, z := range zs {
			seq := int64(z.Score)
			after = seq
			rec := cmds[i].Val()
			if len(rec) == 0 {
				continue // purged meanwhile
			}
			j, err := decodeMap(rec)
			if err != nil {
				return err
			}
			if !fn(j, seq) {
				return nil
			}
		}
		if len(zs) < listChunk {
			return nil
		}
	}
}

// matches reports whether j passes p's filters (States too, when
// states is set).
func matches(j *queue.Job, p *queue.ListParams, states bool) bool {
	if states && len(p.States) > 0 && !slices.Contains(p.States, j.State) {
		return false
	}
	if p.Workflow != "" && j.Workflow != p.Workflow {
		return false
	}
	if p.WorkflowKey != "" && j.WorkflowKey != p.WorkflowKey {
		return false
	}
	if p.Backend != "" && j.LeasedBy != p.Backend &&
		!slices.ContainsFunc(j.Attempts, func(a queue.Attempt) bool { return a.Backend == p.Backend }) {
		return false
	}
	for k, v := range p.Metadata {
		if got, ok := j.Metadata[k]; !ok || got != v {
			return false
		}
	}
	if !p.EnqueuedAfter.IsZero() && j.EnqueuedAt.Before(p.EnqueuedAfter) {
		return false
	}
	if !p.EnqueuedBefore.IsZero() && !j.EnqueuedAt.Before(p.EnqueuedBefore) {
		return false
	}
	if !p.FinishedAfter.IsZero() || !p.FinishedBefore.IsZero() {
		if !j.State.Terminal() {
			return false
		}
		if !p.FinishedAfter.IsZero() && j.FinishedAt.Before(p.FinishedAfter) {
			return false
		}
		if !p.FinishedBefore.IsZero() && !j.FinishedAt.Before(p.FinishedBefore) {
			return false
		}
	}
	return true
}

// purgeExamine bounds the finished jobs one purge script call looks at.
const purgeExamine = 500

// Purge implements [queue.Driver]: oldest finished first, a bounded
// script call at a time (each atomic).
func (d *Driver) Purge(ctx context.Context, p *queue.PurgeParams) (int, error) {
	if err := d.check(ctx); err != nil {
		return 0, err
	}
	return d.purge(ctx, p)
}

func (d *Driver) purge(ctx context.Context, p *queue.PurgeParams) (int, error) {
	states := p.States
	if len(states) == 0 {
		states = []queue.State{queue.StateCompleted, queue.StateDead, queue.StateCancelled}
	}
	names := make([]string, len(states))
	for i, s := range states {
		names[i] = string(s)
	}
	before := ""
	if !p.FinishedBefore.IsZero() {
		// Rounded up: finish times are kept in µs (truncated), and a job
		// that List shows as finished before the bound must be purged.
		before = strconv.FormatInt(ceilMicro(p.FinishedBefore), 10)
	}
	total := 0
	for offset := int64(0); ; {
		limit := purgeExamine
		if p.Limit > 0 {
			limit = min(limit, p.Limit-total)
		}
		raw, err := d.run(ctx, "purge", before, encodeSet(names), purgeExamine, offset, limit)
		if err != nil {
			return total, wrapErr("purge", err)
		}
		r, _ := raw.([]any)
		if len(r) != 3 {
			return total, fmt.Errorf("redisqueue: purge: malformed reply %v", raw)
		}
		n, _ := r[0].(int64)
		offset, _ = r[1].(int64)
		done, _ := r[2].(int64)
		total += int(n)
		if done == 1 || (p.Limit > 0 && total >= p.Limit) || (n == 0 && done == 1) {
			return total, nil
		}
	}
}

// ceilMicro returns t in µs since the epoch, rounded up.
func ceilMicro(t time.Time) int64 {
	us := t.UnixMicro()
	if time.UnixMicro(us).Before(t) {
		us++
	}
	return us
}
