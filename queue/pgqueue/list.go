package pgqueue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/comfypool/comfypool/queue"
)

// cursorPrefix starts every cursor of this driver: "p1." then the last
// job's enqueued_at (µs since the epoch) and seq, in base 36.
const cursorPrefix = "p1."

// listWhere returns the conditions of p's filters (but States and the
// cursor) over jobs aliased j, numbering args from len(*args)+1.
func listWhere(p *queue.ListParams, args *[]any) []string {
	arg := func(v any) string {
		*args = append(*args, v)
		return "$" + strconv.Itoa(len(*args))
	}
	var w []string
	if p.Workflow != "" {
		w = append(w, "j.workflow = "+arg(p.Workflow))
	}
	if p.WorkflowKey != "" {
		w = append(w, "j.workflow_key = "+arg(p.WorkflowKey))
	}
	if p.Backend != "" {
		b := arg(p.Backend)
		w = append(w, "(j.leased_by = "+b+" OR EXISTS (SELECT 1 FROM {s}.attempts a WHERE a.job_id = j.id AND a.backend = "+b+"))")
	}
	if len(p.Metadata) > 0 {
		w = append(w, "j.metadata @> "+arg(p.Metadata)+"::jsonb")
	}
	if !p.EnqueuedAfter.IsZero() {
		w = append(w, "j.enqueued_at >= "+arg(p.EnqueuedAfter))
	}
	if !p.EnqueuedBefore.IsZero() {
		w = append(w, "j.enqueued_at < "+arg(p.EnqueuedBefore))
	}
	if !p.FinishedAfter.IsZero() {
		w = append(w, "j.finished_at >= "+arg(p.FinishedAfter))
	}
	if !p.FinishedBefore.IsZero() {
		w = append(w, "j.finished_at < "+arg(p.FinishedBefore))
	}
	if !p.FinishedAfter.IsZero() || !p.FinishedBefore.IsZero() {
		w = append(w, "j.finished_at IS NOT NULL")
	}
	return w
}

func statesArg(states []queue.State) []string {
	s := make([]string, len(states))
	for i, st := range states {
		s[i] = string(st)
	}
	return s
}

// List implements [queue.Driver].
func (d *Driver) List(ctx context.Context, p *queue.ListParams) (*queue.ListPage, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	var curAt, curSeq int64
	if p.Cursor != "" {
		s, ok := strings.CutPrefix(p.Cursor, cursorPrefix)
		a, b, ok2 := strings.Cut(s, ".")
		var err1, err2 error
		if ok && ok2 {
			curAt, err1 = strconv.ParseInt(a, 36, 64)
			curSeq, err2 = strconv.ParseInt(b, 36, 64)
		}
		if !ok || !ok2 || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: malformed cursor %q", queue.ErrInvalid, p.Cursor)
		}
	}
	args := []any{d.now()}
	where := listWhere(p, &args)
	countWhere := cloneSlice(where)
	countArgs := cloneSlice(args)
	if p.States != nil {
		args = append(args, statesArg(p.States))
		where = append(where, "j.state = ANY($"+strconv.Itoa(len(args))+")")
	}
	cmp, dir := ">", "ASC"
	if !p.OldestFirst {
		cmp, dir = "<", "DESC"
	}
	if p.Cursor != "" {
		args = append(args, time.UnixMicro(curAt).UTC(), curSeq)
		n := len(args)
		where = append(where, fmt.Sprintf("(j.enqueued_at, j.seq) %s ($%d, $%d)", cmp, n-1, n))
	}
	args = append(args, p.Limit+1)
	sql := `SELECT ` + jobCols + `, (extract(epoch FROM j.enqueued_at) * 1000000)::bigint, j.seq
	  FROM {s}.jobs j WHERE ($1::timestamptz IS NULL OR true)` + and(where) + `
	 ORDER BY j.enqueued_at ` + dir + `, j.seq ` + dir + ` LIMIT $` + strconv.Itoa(len(args))
	sql = strings.ReplaceAll(sql, "{s}", d.schema)

	b := &pgx.Batch{}
	due := d.queueDue(b, d.now())
	b.Queue(sql, args...)
	if p.Count {
		b.Queue(strings.ReplaceAll(`SELECT j.state, count(*) FROM {s}.jobs j WHERE ($1::timestamptz IS NULL OR true)`+
			and(countWhere)+` GROUP BY j.state`, "{s}", d.schema), countArgs...)
	}
	br := d.db.SendBatch(ctx, b)
	defer br.Close()
	if err := execDue(br, due); err != nil {
		return nil, d.wrap("list", err)
	}
	page := &queue.ListPage{}
	rows, err := br.Query()
	if err != nil {
		return nil, d.wrap("list", err)
	}
	var lastAt, lastSeq int64
	for rows.Next() {
		if len(page.Jobs) == p.Limit {
			page.Next = cursorPrefix + strconv.FormatInt(lastAt, 36) + "." + strconv.FormatInt(lastSeq, 36)
			break
		}
		j, err := scanJob(extraRow{rows, []any{&lastAt, &lastSeq}})
		if err != nil {
			rows.Close()
			return nil, d.wrap("list", err)
		}
		page.Jobs = append(page.Jobs, j)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, d.wrap("list", err)
	}
	if p.Count {
		page.Counts = map[queue.State]int{}
		rows, _ := br.Query()
		var (
			st string
			n  int
		)
		if _, err := pgx.ForEachRow(rows, []any{&st, &n}, func() error { page.Counts[queue.State(st)] = n; return nil }); err != nil {
			return nil, d.wrap("list", err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, d.wrap("list", err)
	}
	return page, nil
}

// extraRow scans jobCols and then extra columns.
type extraRow struct {
	rows  pgx.Rows
	extra []any
}

func (r extraRow) Scan(dest ...any) error { return r.rows.Scan(append(dest, r.extra...)...) }

func cloneSlice[T any](s []T) []T { return append([]T(nil), s...) }

func and(where []string) string {
	if len(where) == 0 {
		return ""
	}
	return " AND (" + strings.Join(where, ") AND (") + ")"
}

// Purge implements [queue.Driver]. It skips unsettled jobs.
func (d *Driver) Purge(ctx context.Context, p *queue.PurgeParams) (int, error) {
	if err := d.check(ctx); err != nil {
		return 0, err
	}
	var before, limit any
	if !p.FinishedBefore.IsZero() {
		before = p.FinishedBefore
	}
	if p.Limit > 0 {
		limit = p.Limit
	}
	tag, err := d.db.Exec(ctx, `DELETE FROM `+d.schema+`.jobs WHERE id IN (
		SELECT id FROM `+d.schema+`.jobs WHERE state = ANY($1) AND finished_at IS NOT NULL
		   AND ($2::timestamptz IS NULL OR finished_at < $2) AND NOT unsettled
		 ORDER BY finished_at, seq LIMIT $3)`, statesArg(p.States), before, limit)
	if err != nil {
		return 0, d.wrap("purge", err)
	}
	return int(tag.RowsAffected()), nil
}

// Stats implements [queue.Driver]. It counts the jobs by state (a scan of
// an index of the jobs table: cheap for thousands of jobs, not free for
// millions).
func (d *Driver) Stats(ctx context.Context) (*queue.Stats, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	now := d.now()
	b := &pgx.Batch{}
	due := d.queueDue(b, now)
	b.Queue(`SELECT state, count(*) FROM ` + d.schema + `.jobs GROUP BY state`)
	b.Queue(`SELECT (extract(epoch FROM coalesce($1::timestamptz, now()) - min(enqueued_at)) * 1000000)::bigint
	           FROM `+d.schema+`.jobs WHERE state = 'queued'`, now)
	br := d.db.SendBatch(ctx, b)
	defer br.Close()
	if err := execDue(br, due); err != nil {
		return nil, d.wrap("stats", err)
	}
	st := &queue.Stats{}
	rows, _ := br.Query()
	var (
		state string
		n     int
	)
	_, err := pgx.ForEachRow(rows, []any{&state, &n}, func() error {
		switch queue.State(state) {
		case queue.StateQueued:
			st.Queued = n
		case queue.StateLeased:
			st.Leased = n
		case queue.StateRetrying:
			st.Retrying = n
		case queue.StateCompleted:
			st.Completed = n
		case queue.StateDead:
			st.Dead = n
		case queue.StateCancelled:
			st.Cancelled = n
		}
		return nil
	})
	if err != nil {
		return nil, d.wrap("stats", err)
	}
	var age *int64
	if err := br.QueryRow().Scan(&age); err != nil {
		return nil, d.wrap("stats", err)
	}
	if age != nil && *age > 0 {
		st.OldestQueuedAge = time.Duration(*age) * time.Microsecond
	}
	if err := br.Close(); err != nil {
		return nil, d.wrap("stats", err)
	}
	return st, nil
}

// PutWorkflow implements [queue.Driver].
func (d *Driver) PutWorkflow(ctx context.Context, key string, body []byte) error {
	if err := d.check(ctx); err != nil {
		return err
	}
	if body == nil {
		body = []byte{}
	}
	if _, err := d.db.Exec(ctx, d.q.putWorkflow, d.now(), key, body); err != nil {
		return d.wrap("put workflow", err)
	}
	return nil
}

// GetWorkflow implements [queue.Driver].
func (d *Driver) GetWorkflow(ctx context.Context, key string) ([]byte, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	var body []byte
	err := d.db.QueryRow(ctx, d.q.getWorkflow, key).Scan(&body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pgqueue: workflow %q: %w", key, queue.ErrNotFound)
	}
	if err != nil {
		return nil, d.wrap("get workflow", err)
	}
	return body, nil
}

// PurgeWorkflows implements [queue.Driver].
func (d *Driver) PurgeWorkflows(ctx context.Context, storedBefore time.Time) (int, error) {
	if err := d.check(ctx); err != nil {
		return 0, err
	}
	tag, err := d.db.Exec(ctx, d.q.purgeWorkflows, storedBefore)
	if err != nil {
		return 0, d.wrap("purge workflows", err)
	}
	return int(tag.RowsAffected()), nil
}

// SetPaused implements [queue.Driver]. A resume notifies every process on
// the queue (their Ready fires).
func (d *Driver) SetPaused(ctx context.Context, s queue.PauseScope, paused bool) error {
	if err := d.check(ctx); err != nil {
		return err
	}
	kind, name := "all", ""
	switch {
	case s.Workflow != "":
		kind, name = "workflow", s.Workflow
	case s.Tag != "":
		kind, name = "tag", s.Tag
	}
	var err error
	if paused {
		_, err = d.db.Exec(ctx, `INSERT INTO `+d.schema+`.pauses (kind, name) VALUES ($1, $2) ON CONFLICT DO NOTHING`, kind, name)
	} else {
		_, err = d.db.Exec(ctx, `WITH del AS (DELETE FROM `+d.schema+`.pauses WHERE kind = $1 AND name = $2 RETURNING 1)
			SELECT pg_notify($3, 'resume') FROM del`, kind, name, d.channel)
	}
	if err != nil {
		return d.wrap("set paused", err)
	}
	if !paused {
		d.signalReady() // this process need not wait for the notification
	}
	return nil
}

// Paused implements [queue.Driver].
func (d *Driver) Paused(ctx context.Context) ([]queue.PauseScope, error) {
	if err := d.check(ctx); err != nil {
		return nil, err
	}
	rows, _ := d.db.Query(ctx, `SELECT kind, name FROM `+d.schema+`.pauses`)
	var (
		out        []queue.PauseScope
		kind, name string
	)
	_, err := pgx.ForEachRow(rows, []any{&kind, &name}, func() error {
		switch kind {
		case "workflow":
			out = append(out, queue.PauseScope{Workflow: name})
		case "tag":
			out = append(out, queue.PauseScope{Tag: name})
		default:
			out = append(out, queue.PauseScope{})
		}
		return nil
	})
	if err != nil {
		return nil, d.wrap("paused", err)
	}
	return out, nil
}
