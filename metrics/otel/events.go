package otelmetrics

import (
	"context"
	"errors"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

// maxTracked bounds the jobs the event loop remembers. A job is
// remembered from its first attempt's start to its end, so the number is
// about the Pool's running jobs; a job whose terminal event the Pool
// dropped would stay, and the least recently seen go first beyond this.
const maxTracked = 10_000

// lookupTimeout bounds one read of a job's record.
const lookupTimeout = 5 * time.Second

// job is what the event loop remembers of a job between its events.
type job struct {
	// labels are the job's workflow and, with a TenantKey, its tenant
	// (folded).
	labels     []attribute.KeyValue
	enqueuedAt time.Time
	// ran is set once an attempt of the job started (wait time measured).
	ran bool
	// The open attempt: its number (0 when none), backend and start.
	attempt int
	backend string
	started time.Time
	seen    time.Time // the latest event, for eviction
}

// loop turns events into measurements until the subscription's channel
// closes (Close, or the Pool stopped). After Close gave up waiting
// (m.ctx ended) it drains the channel without measuring.
func (m *Metrics) loop(events <-chan pool.Event) {
	defer close(m.done)
	for e := range events {
		if m.ctx.Err() != nil {
			continue
		}
		m.handle(e)
		if m.afterEvent != nil {
			m.afterEvent(e)
		}
	}
	clear(m.jobs)
}

func (m *Metrics) handle(e pool.Event) {
	ctx := m.ctx
	switch e.Kind {
	case pool.EventJobQueued:
		m.enqueued.Add(ctx, 1)

	case pool.EventJobStarted:
		j := m.track(e)
		if !j.ran && !j.enqueuedAt.IsZero() {
			m.waitTime.Record(ctx, seconds(e.Time.Sub(j.enqueuedAt)), j.with())
		}
		j.ran = true
		j.attempt, j.backend, j.started = e.Attempt, e.Backend, e.Time

	case pool.EventJobRetrying:
		j := m.track(e)
		class := failover.Classify(e.Err)
		m.retries.Add(ctx, 1, j.with(KeyBackend.String(e.Backend), classAttr(class)))
		m.endAttempt(j, e.Time, e.Attempt, class)

	case pool.EventJobCompleted, pool.EventJobFailed, pool.EventJobCancelled:
		j := m.jobs[e.JobID]
		if j == nil {
			j = m.lookup(e.JobID)
		}
		delete(m.jobs, e.JobID)
		outcome, class := outcomeOf(e)
		// The job's end ends its open attempt, whatever the event's
		// Attempt says (a cancel's event may give 0).
		m.endAttempt(j, e.Time, j.attempt, class)
		attrs := j.with(KeyOutcome.String(outcome))
		m.finished.Add(ctx, 1, attrs)
		if !j.enqueuedAt.IsZero() {
			m.jobDuration.Record(ctx, seconds(e.Time.Sub(j.enqueuedAt)), attrs)
		}

	case pool.EventClientBlockedWorkflow:
		if f := e.Failover; f != nil {
			m.blocks.Add(ctx, 1, metric.WithAttributes(KeyBackend.String(f.Key.Backend),
				KeyWorkflow.String(m.workflows.fold(workflowValue(f.Key.Workflow, m.cfg.WorkflowNames)))))
		}
	}
}

// endAttempt records the duration of j's open attempt when it is attempt
// n (the attempt whose start the loop saw), ended at end, and closes it.
func (m *Metrics) endAttempt(j *job, end time.Time, n int, class failover.Class) {
	if j.attempt == 0 || j.attempt != n {
		return
	}
	m.attempt.Record(m.ctx, seconds(end.Sub(j.started)),
		metric.WithAttributes(KeyBackend.String(j.backend), j.labels[0], classAttr(class)))
	j.attempt = 0
}

// track returns the remembered job of e, reading its record the first
// time.
func (m *Metrics) track(e pool.Event) *job {
	j := m.jobs[e.JobID]
	if j == nil {
		if len(m.jobs) >= maxTracked {
			m.evict()
		}
		j = m.lookup(e.JobID)
		m.jobs[e.JobID] = j
	}
	j.seen = e.Time
	return j
}

// lookup reads a job's record (from the Pool's memory while the job runs)
// for its workflow, tenant and enqueue time.
func (m *Metrics) lookup(id string) *job {
	ctx, cancel := context.WithTimeout(m.ctx, lookupTimeout)
	defer cancel()
	info, err := m.p.Job(ctx, id)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			m.log.DebugContext(ctx, "reading a job's record failed", "job_id", id, "error", err)
		}
		return &job{labels: m.labels(Unknown, Unknown)}
	}
	tenant := ""
	if m.cfg.TenantKey != "" {
		tenant = m.tenants.fold(info.Metadata[m.cfg.TenantKey])
	}
	wf := m.workflows.fold(workflowValue(info.Workflow, m.cfg.WorkflowNames))
	return &job{labels: m.labels(wf, tenant), enqueuedAt: info.EnqueuedAt}
}

// labels returns a job's workflow attribute and, with a TenantKey, its
// tenant attribute.
func (m *Metrics) labels(workflow, tenant string) []attribute.KeyValue {
	if m.cfg.TenantKey == "" {
		return []attribute.KeyValue{KeyWorkflow.String(workflow)}
	}
	return []attribute.KeyValue{KeyWorkflow.String(workflow), KeyTenant.String(tenant)}
}

// with returns the job's labels and extra as a measurement option.
func (j *job) with(extra ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append(slices.Clip(j.labels), extra...)...)
}

// evict forgets the least recently seen job.
func (m *Metrics) evict() {
	var oldest string
	var at time.Time
	for id, j := range m.jobs {
		if oldest == "" || j.seen.Before(at) {
			oldest, at = id, j.seen
		}
	}
	delete(m.jobs, oldest)
}

// outcomeOf returns how a terminal event ended its job and the failure
// class of its last attempt.
func outcomeOf(e pool.Event) (string, failover.Class) {
	switch e.Kind {
	case pool.EventJobCompleted:
		return string(pool.StatusCompleted), failover.ClassNone
	case pool.EventJobFailed:
		var je *pool.JobError
		if errors.As(e.Err, &je) && len(je.Attempts) > 0 {
			if a := je.Attempts[len(je.Attempts)-1]; a.Err != nil {
				return string(pool.StatusFailed), a.Class
			}
		}
		return string(pool.StatusFailed), failover.Classify(e.Err)
	default:
		return string(pool.StatusCancelled), failover.ClassCancelled
	}
}

func classAttr(c failover.Class) attribute.KeyValue { return KeyFailureClass.String(c.String()) }

func seconds(d time.Duration) float64 { return max(d, 0).Seconds() }
