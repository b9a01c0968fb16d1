package redisqueue

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/comfypool/comfypool/queue"
)

// A job is one hash, "{prefix}:j:<id>", with these fields (times are
// microseconds since the epoch, by the server's clock; sets are JSON
// arrays of strings; absent fields are empty):
//
//	id  the job's ID          st  state            v   version
//	pr  priority              wf  workflow         wk  workflow key
//	ov  overrides             pl  payload          md  metadata (JSON object)
//	rq  requires              nd  needs            xb  excluded backends
//	ik  idempotency key       mx  max attempts     u   attempts used
//	at  attempts (JSON array) eq  enqueued at      av  available at
//	la  leased at             le  lease expires at fi  finished at
//	lb  leased by             tk  lease token      rs  result
//	ec, em, en, et            the error's class, message, node id, node type
//	sq  enqueue sequence      bk  bucket (see the package doc)

// attemptRecord is one element of the "at" field.
type attemptRecord struct {
	Backend  string `json:"b"`
	PromptID string `json:"p,omitempty"`
	Started  string `json:"s"`
	Ended    string `json:"e,omitempty"`
	Class    string `json:"c,omitempty"`
	ErrClass string `json:"ec,omitempty"`
	Message  string `json:"em,omitempty"`
	NodeID   string `json:"en,omitempty"`
	NodeType string `json:"et,omitempty"`
	Counted  bool   `json:"k,omitempty"`
}

// decodeRecord builds a Job from a record as HGETALL returns it (field,
// value, field, value, ...).
func decodeRecord(raw any) (*queue.Job, error) {
	flat, ok := raw.([]any)
	if !ok || len(flat)%2 != 0 {
		return nil, fmt.Errorf("redisqueue: malformed job record %T", raw)
	}
	j := &queue.Job{}
	var err error
	for i := 0; i < len(flat); i += 2 {
		k, _ := flat[i].(string)
		v, _ := flat[i+1].(string)
		switch k {
		case "id":
			j.ID = v
		case "st":
			j.State = queue.State(v)
		case "v":
			j.Version, err = strconv.ParseUint(v, 10, 64)
		case "pr":
			j.Priority, err = strconv.Atoi(v)
		case "wf":
			j.Workflow = v
		case "wk":
			j.WorkflowKey = v
		case "ov":
			j.Overrides = bytesOf(v)
		case "pl":
			j.Payload = bytesOf(v)
		case "md":
			if v != "" {
				err = json.Unmarshal([]byte(v), &j.Metadata)
			}
		case "rq":
			j.Requires, err = decodeSet(v)
		case "nd":
			j.Needs, err = decodeSet(v)
		case "xb":
			j.ExcludeBackends, err = decodeSet(v)
		case "ik":
			j.IdempotencyKey = v
		case "mx":
			j.MaxAttempts, err = strconv.Atoi(v)
		case "u":
			j.AttemptsUsed, err = strconv.Atoi(v)
		case "at":
			j.Attempts, err = decodeAttempts(v)
		case "eq":
			j.EnqueuedAt, err = timeOf(v)
		case "av":
			j.AvailableAt, err = timeOf(v)
		case "la":
			j.LeasedAt, err = timeOf(v)
		case "le":
			j.LeaseExpiresAt, err = timeOf(v)
		case "fi":
			j.FinishedAt, err = timeOf(v)
		case "lb":
			j.LeasedBy = v
		case "tk":
			j.LeaseToken = v
		case "rs":
			j.Result = bytesOf(v)
		case "ec":
			j.Error.Class = v
		case "em":
			j.Error.Message = v
		case "en":
			j.Error.NodeID = v
		case "et":
			j.Error.NodeType = v
		}
		if err != nil {
			return nil, fmt.Errorf("redisqueue: job record field %s: %w", k, err)
		}
	}
	if j.ID == "" {
		return nil, fmt.Errorf("redisqueue: job record without id")
	}
	return j, nil
}

func bytesOf(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

func decodeSet(s string) ([]string, error) {
	if s == "" || s == "[]" || s == "{}" {
		return nil, nil
	}
	var out []string
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// encodeSet encodes a set as a JSON array ("[]" when empty: the scripts
// compare with it).
func encodeSet(s []string) string {
	if len(s) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(s) // []string always encodes
	return string(b)
}

func timeOf(s string) (time.Time, error) {
	if s == "" || s == "0" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMicro(n).UTC(), nil
}

func decodeAttempts(s string) ([]queue.Attempt, error) {
	if s == "" || s == "{}" || s == "[]" {
		return nil, nil
	}
	var recs []attemptRecord
	if err := json.Unmarshal([]byte(s), &recs); err != nil {
		return nil, err
	}
	out := make([]queue.Attempt, len(recs))
	for i, r := range recs {
		a := queue.Attempt{Number: i + 1, Backend: r.Backend, PromptID: r.PromptID, Class: r.Class, Counted: r.Counted,
			Error: queue.ErrorSummary{Class: r.ErrClass, Message: r.Message, NodeID: r.NodeID, NodeType: r.NodeType}}
		var err error
		if a.StartedAt, err = timeOf(r.Started); err != nil {
			return nil, err
		}
		if a.EndedAt, err = timeOf(r.Ended); err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}
