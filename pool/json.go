package pool

import (
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/queue"
)

// Records and events marshal to JSON with stable snake_case names, for
// services that log, store or serve them:
//
//   - statuses, event kinds and failure classes are their stable words
//     ("failed", "job:completed", "backend");
//   - an error is {"class", "message", "node_id", "node_type"}, the form a
//     job's record keeps (no nested causes, no tracebacks; see
//     RecordedError), whether it was read from a record or seen live;
//   - times are RFC 3339 in UTC, with fractional seconds when there are
//     any; a zero time is left out;
//   - a duration is a Go duration string ("1.5s", "2m0s"), as in package
//     dag;
//   - empty fields are left out;
//   - bytes are never inlined: a preview image is its size, a downloaded
//     output file its size.
//
// The shapes are pinned by golden files in testdata/json. They are for
// output: nothing unmarshals them back into these types.

// errorJSON returns err in the record's form: a *RecordedError keeps
// its own; a *JobError is the error that ended the job; class names the
// failure when err carries none (empty: derived from err, see classOf).
func errorJSON(class string, err error) *RecordedError {
	if err == nil {
		return nil
	}
	var je *JobError
	if errors.As(err, &je) && je.Err != nil {
		err = je.Err
	}
	var re *RecordedError
	if errors.As(err, &re) {
		c := *re
		return &c
	}
	var ue *UnschedulableError
	if errors.As(err, &ue) {
		return &RecordedError{Class: classUnschedulable, Message: ue.Error(), NodeID: ue.Node, NodeType: ue.ClassType}
	}
	if class == "" {
		class = classOf(err)
	}
	s := summarize(class, err)
	return &RecordedError{Class: s.Class, Message: s.Message, NodeID: s.NodeID, NodeType: s.NodeType}
}

// classUnschedulable is the class of an *UnschedulableError in JSON.
const classUnschedulable = "unschedulable"

// classOf is the class of a live error: "timeout" for a *TimeoutError,
// "cancelled" for ErrCancelled, otherwise failover.Classify's word.
func classOf(err error) string {
	var te *TimeoutError
	switch {
	case errors.As(err, &te):
		return classTimeout
	case errors.Is(err, ErrCancelled):
		return queue.ClassCancelled
	}
	return failover.Classify(err).String()
}

// utc returns t in UTC, without its monotonic reading; zero stays zero.
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// MarshalJSON encodes the job as {"id", "status", "workflow", "metadata",
// "attempts", "max_attempts", "backend", "prompt_id", "enqueued_at",
// "started_at", "finished_at", "last_error", "reservation",
// "unschedulable"}, with last_error in the error form of the package
// (see "Records and events marshal to JSON" in json.go).
func (j JobInfo) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID            string              `json:"id"`
		Status        Status              `json:"status"`
		Workflow      string              `json:"workflow,omitempty"`
		Metadata      map[string]string   `json:"metadata,omitempty"`
		Attempts      []Attempt           `json:"attempts,omitempty"`
		MaxAttempts   int                 `json:"max_attempts,omitempty"`
		Backend       string              `json:"backend,omitempty"`
		PromptID      string              `json:"prompt_id,omitempty"`
		EnqueuedAt    time.Time           `json:"enqueued_at,omitzero"`
		StartedAt     time.Time           `json:"started_at,omitzero"`
		FinishedAt    time.Time           `json:"finished_at,omitzero"`
		LastError     *RecordedError      `json:"last_error,omitempty"`
		Reservation   string              `json:"reservation,omitempty"`
		Unschedulable *UnschedulableError `json:"unschedulable,omitempty"`
	}{
		ID: j.ID, Status: j.Status, Workflow: j.Workflow, Metadata: j.Metadata,
		Attempts: j.Attempts, MaxAttempts: j.MaxAttempts, Backend: j.Backend, PromptID: j.PromptID,
		EnqueuedAt: utc(j.EnqueuedAt), StartedAt: utc(j.StartedAt), FinishedAt: utc(j.FinishedAt),
		LastError: errorJSON("", j.LastError), Reservation: j.Reservation, Unschedulable: j.Unschedulable,
	})
}

// MarshalJSON encodes the attempt as {"backend", "prompt_id",
// "started_at", "ended_at", "class", "error"}: class is the attempt's
// failover class word once it ended ("none" for the successful one),
// absent while it runs; error is in the error form of the package.
func (a Attempt) MarshalJSON() ([]byte, error) {
	class := ""
	if !a.Ended.IsZero() || a.Err != nil {
		c, err := a.Class.MarshalText()
		if err != nil {
			return nil, err
		}
		class = string(c)
	}
	return json.Marshal(struct {
		Backend   string         `json:"backend"`
		PromptID  string         `json:"prompt_id,omitempty"`
		StartedAt time.Time      `json:"started_at,omitzero"`
		EndedAt   time.Time      `json:"ended_at,omitzero"`
		Class     string         `json:"class,omitempty"`
		Error     *RecordedError `json:"error,omitempty"`
	}{
		Backend: a.Backend, PromptID: a.PromptID, StartedAt: utc(a.Started), EndedAt: utc(a.Ended),
		Class: class, Error: errorJSON(class, a.Err),
	})
}

// outputFileJSON is an output file in JSON: where it is, not its bytes.
type outputFileJSON struct {
	Node        string `json:"node"`
	Filename    string `json:"filename"`
	Subfolder   string `json:"subfolder,omitempty"`
	Type        string `json:"type"`
	ContentType string `json:"content_type,omitempty"`
	// Size is the length of the bytes downloaded with
	// EnqueueOpts.DownloadOutputs; absent when they were not.
	Size int `json:"size,omitempty"`
}

// MarshalJSON encodes the result as {"job_id", "backend", "prompt_id",
// "outputs", "files", "attempts"}: outputs are each output node's UI
// output as the backend sent it; files list the output files as
// {"node", "filename", "subfolder", "type", "content_type", "size"}
// (size and content_type only for files downloaded with
// EnqueueOpts.DownloadOutputs; never their bytes). The backend's full
// result (Comfy) is left out: outputs hold what it adds to the record.
func (r *Result) MarshalJSON() ([]byte, error) {
	files := r.outputFiles()
	out := make([]outputFileJSON, len(files))
	for i, f := range files {
		out[i] = outputFileJSON{Node: f.Node, Filename: f.Ref.Filename, Subfolder: f.Ref.Subfolder, Type: f.Ref.Type}
		if f.Data != nil {
			out[i].ContentType, out[i].Size = f.ContentType, len(f.Data)
		}
	}
	return json.Marshal(struct {
		JobID    string           `json:"job_id"`
		Backend  string           `json:"backend"`
		PromptID string           `json:"prompt_id"`
		Outputs  any              `json:"outputs,omitempty"`
		Files    []outputFileJSON `json:"files,omitempty"`
		Attempts []Attempt        `json:"attempts,omitempty"`
	}{JobID: r.JobID, Backend: r.Backend, PromptID: r.PromptID, Outputs: r.Outputs, Files: out, Attempts: r.Attempts})
}

// outputFiles returns r's files: those the Pool listed, or for a Result
// made otherwise those of its Outputs.
func (r *Result) outputFiles() []OutputFile {
	if r.files != nil || len(r.Outputs) == 0 {
		return r.files
	}
	return outputFiles(r.Backend, &comfy.Result{Outputs: r.Outputs}, nil)
}

// MarshalJSON encodes the error as {"class": "unschedulable", "message",
// "node_id", "node_type", "input", "value", "backend"}: the error form of
// the package, with what is missing (see the fields of
// UnschedulableError; node_type is its ClassType).
func (e *UnschedulableError) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Class    string `json:"class"`
		Message  string `json:"message"`
		NodeID   string `json:"node_id,omitempty"`
		NodeType string `json:"node_type,omitempty"`
		Input    string `json:"input,omitempty"`
		Value    string `json:"value,omitempty"`
		Backend  string `json:"backend,omitempty"`
	}{classUnschedulable, e.Error(), e.Node, e.ClassType, e.Input, e.Value, e.Backend})
}

// MarshalJSON encodes the preview as {"mime_type", "size"}: the image's
// type and length, never its bytes (read Image for them).
func (p PreviewEvent) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		MIMEType string `json:"mime_type,omitempty"`
		Size     int    `json:"size"`
	}{p.MIMEType, len(p.Image)})
}

// failoverJSON is a block or unblock in an event's JSON; the backend is
// the event's.
type failoverJSON struct {
	Workflow string         `json:"workflow"`
	Until    time.Time      `json:"until,omitzero"`
	Failures int            `json:"failures,omitempty"`
	Error    *RecordedError `json:"error,omitempty"`
}

// MarshalJSON encodes the event as {"kind", "time", "job_id", "backend",
// "attempt", "prompt_id", "progress", "preview", "output", "result",
// "error", "retry_after", "state", "failover"}, each payload present
// only for the kinds that carry it (see EventKind): progress is {"node",
// "value", "max"}; preview {"mime_type", "size"} (no image bytes); output
// {"node", "output"}; result as Result marshals; error in the error form
// of the package; retry_after a duration string; state the backend's
// connection state word ("connected"); failover {"workflow", "until",
// "failures", "error"}; lease {"holder", "expires"}.
func (e Event) MarshalJSON() ([]byte, error) {
	v := struct {
		Kind       EventKind      `json:"kind"`
		Time       time.Time      `json:"time,omitzero"`
		JobID      string         `json:"job_id,omitempty"`
		Backend    string         `json:"backend,omitempty"`
		Attempt    int            `json:"attempt,omitempty"`
		PromptID   string         `json:"prompt_id,omitempty"`
		Progress   *ProgressEvent `json:"progress,omitempty"`
		Preview    *PreviewEvent  `json:"preview,omitempty"`
		Output     *OutputEvent   `json:"output,omitempty"`
		Result     *Result        `json:"result,omitempty"`
		Error      *RecordedError `json:"error,omitempty"`
		RetryAfter string         `json:"retry_after,omitempty"`
		State      string         `json:"state,omitempty"`
		Failover   *failoverJSON  `json:"failover,omitempty"`
		Lease      *leaseJSON     `json:"lease,omitempty"`
	}{
		Kind: e.Kind, Time: utc(e.Time), JobID: e.JobID, Backend: e.Backend, Attempt: e.Attempt,
		PromptID: e.PromptID, Progress: e.Progress, Preview: e.Preview, Output: e.Output,
		Result: e.Result, Error: errorJSON("", e.Err),
	}
	if e.RetryAfter != 0 {
		v.RetryAfter = e.RetryAfter.String()
	}
	if e.State != nil {
		v.State = e.State.String()
	}
	if f := e.Failover; f != nil {
		v.Failover = &failoverJSON{Workflow: f.Key.Workflow, Until: utc(f.Until), Failures: f.Failures, Error: errorJSON("", f.Err)}
	}
	if l := e.Lease; l != nil {
		v.Lease = &leaseJSON{Holder: l.Holder, Expires: utc(l.Expires)}
	}
	return json.Marshal(v)
}

// leaseJSON is a client:lease event's lease.
type leaseJSON struct {
	Holder  string    `json:"holder"`
	Expires time.Time `json:"expires,omitzero"`
}

// LogValue makes an Event log as a group of the fields it marshals to
// JSON, under the same names (see Event.MarshalJSON), for slog:
// logger.Info("event", "event", ev). A preview is its MIME type and
// size, an output its node and the kinds it holds, a result its backend,
// prompt id and number of files; an error is the group {class, message,
// node_id, node_type}.
func (e Event) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String("kind", string(e.Kind)))
	if !e.Time.IsZero() {
		attrs = append(attrs, slog.Time("time", utc(e.Time)))
	}
	str := func(k, v string) {
		if v != "" {
			attrs = append(attrs, slog.String(k, v))
		}
	}
	str("job_id", e.JobID)
	str("backend", e.Backend)
	if e.Attempt != 0 {
		attrs = append(attrs, slog.Int("attempt", e.Attempt))
	}
	str("prompt_id", e.PromptID)
	if p := e.Progress; p != nil {
		attrs = append(attrs, slog.Group("progress", "node", p.Node, "value", p.Value, "max", p.Max))
	}
	if p := e.Preview; p != nil {
		attrs = append(attrs, slog.Group("preview", "mime_type", p.MIMEType, "size", len(p.Image)))
	}
	if o := e.Output; o != nil {
		attrs = append(attrs, slog.Group("output", "node", o.Node, "kinds", slices.Sorted(maps.Keys(o.Output))))
	}
	if r := e.Result; r != nil {
		attrs = append(attrs, slog.Group("result", "backend", r.Backend, "prompt_id", r.PromptID, "files", len(r.outputFiles())))
	}
	if err := errorJSON("", e.Err); err != nil {
		attrs = append(attrs, err.attr())
	}
	if e.RetryAfter != 0 {
		attrs = append(attrs, slog.Duration("retry_after", e.RetryAfter))
	}
	if e.State != nil {
		attrs = append(attrs, slog.String("state", e.State.String()))
	}
	if f := e.Failover; f != nil {
		g := []any{"workflow", f.Key.Workflow}
		if !f.Until.IsZero() {
			g = append(g, "until", utc(f.Until))
		}
		if f.Failures != 0 {
			g = append(g, "failures", f.Failures)
		}
		if err := errorJSON("", f.Err); err != nil {
			g = append(g, err.attr())
		}
		attrs = append(attrs, slog.Group("failover", g...))
	}
	if l := e.Lease; l != nil {
		g := []any{"holder", l.Holder}
		if !l.Expires.IsZero() {
			g = append(g, "expires", utc(l.Expires))
		}
		attrs = append(attrs, slog.Group("lease", g...))
	}
	return slog.GroupValue(attrs...)
}

// attr is the error as the slog group "error": {class, message, node_id,
// node_type}, empty ones left out.
func (e *RecordedError) attr() slog.Attr {
	g := []any{"class", e.Class, "message", e.Message}
	if e.NodeID != "" {
		g = append(g, "node_id", e.NodeID)
	}
	if e.NodeType != "" {
		g = append(g, "node_type", e.NodeType)
	}
	return slog.Group("error", g...)
}
