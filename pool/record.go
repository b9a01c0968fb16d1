package pool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/internal/jsonbytes"
	"github.com/comfypool/comfypool/queue"
)

// A job lives in the queue: its record (queue.Job) holds everything any
// Pool on the queue needs to run it, watch it and answer for it. The Pool
// writes its own parts as JSON with snake_case names, empty parts left out:
//
//   - Job.WorkflowKey names the workflow body, stored once per distinct
//     workflow (queue.Queue.PutWorkflow, keyed by its exact hash);
//   - Job.Overrides holds the job's input overrides of that workflow
//     (EnqueueTemplate), so that a million jobs over one template cost only
//     their overrides;
//   - Job.Payload holds the options that are not queue fields (spec);
//   - Job.Result holds a completed job's outcome (storedResult).
//
// Nothing else about a job is kept in a Pool's memory while it waits.

// spec is the part of EnqueueOpts a job's record keeps in its Payload.
type spec struct {
	// StartTimeout is Timeouts.Start.
	StartTimeout time.Duration `json:"start_timeout,omitempty"`
	// QueueDeadline and OverallDeadline are Timeouts.Queue and
	// Timeouts.Overall made absolute at Enqueue, so that any Pool can
	// enforce them.
	QueueDeadline   time.Time `json:"queue_deadline,omitzero"`
	OverallDeadline time.Time `json:"overall_deadline,omitzero"`
	// QueueTimeout and OverallTimeout are the durations, for JobInfo.
	QueueTimeout   time.Duration `json:"queue_timeout,omitempty"`
	OverallTimeout time.Duration `json:"overall_timeout,omitempty"`
	// PreferBackends is EnqueueOpts.PreferBackends.
	PreferBackends []string `json:"prefer_backends,omitempty"`
	// DownloadOutputs is EnqueueOpts.DownloadOutputs.
	DownloadOutputs bool `json:"download_outputs,omitempty"`
	// Inputs are EnqueueOpts.Inputs without their content readers.
	Inputs []specInput `json:"inputs,omitempty"`
	// Reservation is what Accounting.Reserve returned; Reserved says
	// Reserve succeeded (one Consume or Refund is due).
	Reservation string `json:"reservation,omitempty"`
	Reserved    bool   `json:"reserved,omitempty"`
	// ExtraData is EnqueueOpts.ExtraData, as a JSON object.
	ExtraData json.RawMessage `json:"extra_data,omitempty"`
}

// extraData returns ExtraData as a map whose values are the JSON of each
// entry (they are sent as they were encoded), or nil.
func (s *spec) extraData() map[string]any {
	var raw map[string]json.RawMessage
	if len(s.ExtraData) == 0 || json.Unmarshal(s.ExtraData, &raw) != nil || len(raw) == 0 {
		return nil
	}
	m := make(map[string]any, len(raw))
	for k, v := range raw {
		m[k] = v
	}
	return m
}

// specInput is an InputFile as the record keeps it.
type specInput struct {
	Name string `json:"name"`
	// Data is the content, when the InputFile had Data.
	Data []byte `json:"data,omitempty"`
	// Local says the content is read by an Open func that only the
	// enqueuing process holds (the job then runs in that process only).
	Local   bool          `json:"local,omitempty"`
	Source  *FileSource   `json:"source,omitempty"`
	Targets []InputTarget `json:"targets"`
	// Stored is the content in Config.Files.
	Stored *files.Ref `json:"stored,omitempty"`
}

// isZero reports whether s holds nothing (the Payload is then empty).
func (s *spec) isZero() bool {
	return s.StartTimeout == 0 && s.QueueTimeout == 0 && s.OverallTimeout == 0 &&
		len(s.PreferBackends) == 0 && !s.DownloadOutputs && len(s.Inputs) == 0 && !s.Reserved && s.Reservation == "" && len(s.ExtraData) == 0
}

// encode returns s as a record's Payload. It marshals a copy, so that
// a spec built on the enqueue path stays on the caller's stack: most
// jobs have none, and Marshal would move s to the heap for every job.
func (s *spec) encode() ([]byte, error) {
	if s.isZero() {
		return nil, nil
	}
	c := *s
	return json.Marshal(&c)
}

func decodeSpec(b []byte) (*spec, error) {
	s := &spec{}
	if len(b) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("pool: job payload: %w", err)
	}
	return s, nil
}

// Override sets one input of one node of a template (see
// WorkflowPool.EnqueueTemplate), as comfy.Workflow.SetInput does.
type Override struct {
	Node  string `json:"node"`
	Input string `json:"input"`
	Value any    `json:"value"`
}

// storedResult is a completed job's outcome as its record keeps it.
type storedResult struct {
	Backend   string                  `json:"backend"`
	PromptID  string                  `json:"prompt_id"`
	Outputs   map[string]comfy.Output `json:"outputs,omitempty"`
	Recovered bool                    `json:"recovered,omitempty"`
	// Stored are the outputs' copies in the Pool's file store.
	Stored []storedFile `json:"stored,omitempty"`
}

// marshal encodes sr as encoding/json does, into the same document up to
// the escaping of '<', '>' and '&' inside outputs, without reflection: a
// result is written for every job. An output that is not valid JSON is an
// error, as it is for json.Marshal.
func (sr *storedResult) marshal() ([]byte, error) {
	if len(sr.Stored) > 0 {
		return json.Marshal(sr) // outputs copied to a file store: rare enough
	}
	b := bytes.NewBuffer(make([]byte, 0, 256))
	str := func(s string) { b.Write(jsonbytes.AppendString(b.AvailableBuffer(), s)) }
	b.WriteString(`{"backend":`)
	str(sr.Backend)
	b.WriteString(`,"prompt_id":`)
	str(sr.PromptID)
	if len(sr.Outputs) > 0 {
		b.WriteString(`,"outputs":{`)
		var nodes, kinds [8]string // no allocation for a few of each
		for i, node := range jsonbytes.SortedKeys(nodes[:0], sr.Outputs) {
			if i > 0 {
				b.WriteByte(',')
			}
			str(node)
			b.WriteByte(':')
			o := sr.Outputs[node]
			if o == nil {
				b.WriteString("null")
				continue
			}
			b.WriteByte('{')
			for j, kind := range jsonbytes.SortedKeys(kinds[:0], o) {
				if j > 0 {
					b.WriteByte(',')
				}
				str(kind)
				b.WriteByte(':')
				if o[kind] == nil {
					b.WriteString("null")
				} else if err := json.Compact(b, o[kind]); err != nil {
					return nil, fmt.Errorf("pool: node %s's output %q: %w", node, kind, err)
				}
			}
			b.WriteByte('}')
		}
		b.WriteByte('}')
	}
	if sr.Recovered {
		b.WriteString(`,"recovered":true`)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// storedFile is one output file's copy in Config.Files.
type storedFile struct {
	Node string        `json:"node"`
	File comfy.FileRef `json:"file"`
	Ref  files.Ref     `json:"ref"`
}

// localTagPrefix starts the tag a job requires when its input files can
// be read only in the process that enqueued it (an InputFile.Open): only
// that Pool's leases offer the tag.
const localTagPrefix = "comfypool.local:"

// userTags returns the job's Requires without the Pool's internal tags.
func userTags(requires []string) []string {
	return slices.DeleteFunc(slices.Clone(requires), func(t string) bool { return strings.HasPrefix(t, localTagPrefix) })
}

// JobError classes the Pool writes beside failover's words (see
// queue.ErrorSummary.Class).
const (
	// classTimeout ends a job whose queue or overall timeout fired; the
	// message is the *TimeoutError's.
	classTimeout = "timeout"
)

// summarize turns an error into the summary a record keeps: class, message
// and the failing node, no nested causes.
func summarize(class string, err error) queue.ErrorSummary {
	s := queue.ErrorSummary{Class: class, Message: err.Error()}
	var pe *comfy.PromptError
	var ee *comfy.ExecutionError
	switch {
	case errors.As(err, &ee):
		s.NodeID, s.NodeType = ee.NodeID, ee.NodeType
	case errors.As(err, &pe):
		s.NodeID, s.NodeType = pe.NodeID, pe.NodeType
	}
	return s
}

// RecordedError is a failure as a job's record keeps it, for a job whose
// error this process did not see happen (it ran in another process on the
// queue, or before a restart). It matches ErrCancelled for a cancelled
// job, and ErrTimeout for a timed-out one. It marshals as
// {"class", "message", "node_id", "node_type"}.
type RecordedError struct {
	Class    string `json:"class"`
	Message  string `json:"message"`
	NodeID   string `json:"node_id,omitempty"`
	NodeType string `json:"node_type,omitempty"`
}

// Error implements error.
func (e *RecordedError) Error() string { return e.Message }

// Is matches ErrCancelled and ErrTimeout by class.
func (e *RecordedError) Is(target error) bool {
	switch target {
	case ErrCancelled:
		return e.Class == queue.ClassCancelled
	case ErrTimeout:
		return e.Class == classTimeout
	}
	return false
}

// recorded returns the error a record's summary stands for: a
// *TimeoutError, ErrCancelled, or a *RecordedError.
func recorded(s queue.ErrorSummary) error {
	if s.IsZero() {
		return nil
	}
	if s.Class == classTimeout {
		which := strings.TrimSuffix(strings.TrimPrefix(s.Message, "pool: "), " timeout")
		return &TimeoutError{Which: which}
	}
	return &RecordedError{Class: s.Class, Message: s.Message, NodeID: s.NodeID, NodeType: s.NodeType}
}

// attemptsOf converts a record's attempts.
func attemptsOf(in []queue.Attempt) []Attempt {
	if len(in) == 0 {
		return nil
	}
	out := make([]Attempt, len(in))
	for i, a := range in {
		var c failover.Class
		if a.Class != "" && c.UnmarshalText([]byte(a.Class)) != nil {
			c = failover.ClassBackend // a queue word: lease_expired, superseded
		}
		if a.Class == queue.ClassCancelled || a.Class == queue.ClassSuperseded || a.Class == classTimeout {
			c = failover.ClassCancelled // asked for (a timeout is the caller's bound): no backend's fault
		}
		out[i] = Attempt{Backend: a.Backend, PromptID: a.PromptID, Started: a.StartedAt, Ended: a.EndedAt, Class: c}
		if !a.Error.IsZero() {
			out[i].Err = recorded(a.Error)
		} else if a.Class == queue.ClassLeaseExpired {
			out[i].Err = &RecordedError{Class: a.Class, Message: "queue: lease expired"}
		}
	}
	return out
}

// statusOf maps a record's state to the Pool's status.
func statusOf(qj *queue.Job) Status {
	switch qj.State {
	case queue.StateLeased:
		return StatusRunning
	case queue.StateRetrying:
		return StatusRetrying
	case queue.StateCompleted:
		return StatusCompleted
	case queue.StateDead:
		return StatusFailed
	case queue.StateCancelled:
		if qj.Error.Class == classTimeout {
			return StatusFailed
		}
		return StatusCancelled
	}
	return StatusQueued
}

// infoOf builds a JobInfo from a record.
func infoOf(qj *queue.Job, s *spec) *JobInfo {
	info := &JobInfo{
		ID: qj.ID, Status: statusOf(qj), Workflow: qj.Workflow, Metadata: maps.Clone(qj.Metadata),
		Attempts: attemptsOf(qj.Attempts), MaxAttempts: qj.MaxAttempts,
		EnqueuedAt: qj.EnqueuedAt, FinishedAt: qj.FinishedAt,
	}
	if s != nil {
		info.Reservation = s.Reservation
	}
	if n := len(info.Attempts); n > 0 {
		last := info.Attempts[n-1]
		info.Backend, info.PromptID, info.StartedAt = last.Backend, last.PromptID, last.Started
	}
	for i := len(info.Attempts) - 1; i >= 0; i-- {
		if info.Attempts[i].Err != nil {
			info.LastError = info.Attempts[i].Err
			break
		}
	}
	if !qj.Error.IsZero() {
		info.LastError = recorded(qj.Error)
	}
	return info
}

// outcomeOf returns the answer of Wait for a terminal record: the result
// of a completed job, the error of any other.
func (p *WorkflowPool) outcomeOf(qj *queue.Job) (*Result, error) {
	switch statusOf(qj) {
	case StatusCompleted:
		var sr storedResult
		if len(qj.Result) > 0 {
			if err := json.Unmarshal(qj.Result, &sr); err != nil {
				return nil, fmt.Errorf("pool: job %s: stored result: %w", qj.ID, err)
			}
		}
		cres := &comfy.Result{PromptID: sr.PromptID, Outputs: sr.Outputs, Recovered: sr.Recovered}
		var got []OutputFile
		for _, s := range sr.Stored {
			got = append(got, OutputFile{Node: s.Node, Ref: s.File, ContentType: s.Ref.ContentType, Stored: &s.Ref})
		}
		return &Result{
			JobID: qj.ID, Backend: sr.Backend, PromptID: sr.PromptID, Outputs: sr.Outputs,
			Attempts: attemptsOf(qj.Attempts), Comfy: cres, pool: p,
			files: outputFiles(sr.Backend, cres, got),
		}, nil
	case StatusCancelled:
		return nil, ErrCancelled
	}
	err := recorded(qj.Error)
	if err == nil {
		err = errors.New("pool: job failed")
	}
	return nil, &JobError{JobID: qj.ID, Attempts: attemptsOf(qj.Attempts), Err: err}
}
