package redisqueue

import (
	"encoding/json"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"strings"
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
//	at  closed attempts       ao  open attempt     eq  enqueued at
//	av  available at          la  leased at        le  lease expires at
//	fi  finished at           lb  leased by        tk  lease token
//	rs  result                sq  enqueue sequence bk  bucket (see the package doc)
//	se  "1": enqueued with Settle                  us  "1": unsettled
//	ec, em, en, et            the error's class, message, node id, node type
//
// Attempts are runs of length-prefixed fields (see lua/lib.lua).

// recordFields are the fields the scripts return of a job, in order
// (record in lua/lib.lua): values only, which costs both sides less than
// HGETALL's names and values.
var recordFields = [...]string{"id", "st", "v", "pr", "wf", "wk", "ov", "pl", "md", "rq", "nd", "xb", "ik",
	"mx", "u", "at", "ao", "eq", "av", "la", "le", "fi", "lb", "tk", "rs", "ec", "em", "en", "et", "sq", "se", "us"}

// decodeRow builds a Job from a record as the scripts return it.
func decodeRow(raw any) (*queue.Job, error) {
	vals, ok := raw.([]any)
	if !ok || len(vals) != len(recordFields) {
		return nil, fmt.Errorf("redisqueue: malformed job record %T", raw)
	}
	return decodeFields(func(yield func(k, v string) bool) {
		for i, v := range vals {
			if s, ok := v.(string); ok && !yield(recordFields[i], s) {
				return
			}
		}
	})
}

// decodeMap builds a Job from a record read with HGETALL.
func decodeMap(m map[string]string) (*queue.Job, error) {
	return decodeFields(maps.All(m))
}

// decodeFields builds a Job from a record's fields.
func decodeFields(record iter.Seq2[string, string]) (*queue.Job, error) {
	j := &queue.Job{}
	var err error
	var closedAttempts, openAttempt string
	for k, v := range record {
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
			closedAttempts = v
		case "ao":
			openAttempt = v
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
		case "se":
			j.Settle = v == "1"
		case "us":
			j.Unsettled = v == "1"
		}
		if err != nil {
			return nil, fmt.Errorf("redisqueue: job record field %s: %w", k, err)
		}
	}
	if j.ID == "" {
		return nil, fmt.Errorf("redisqueue: job record without id")
	}
	if j.Attempts, err = decodeAttempts(closedAttempts, openAttempt); err != nil {
		return nil, fmt.Errorf("redisqueue: job record field at: %w", err)
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
	// Sorted here, by bytes: Lua's table.sort compares with the
	// server's locale.
	slices.Sort(out)
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

// The fields of an attempt in "at" (closed) and "ao" (open): see
// lua/lib.lua.
const (
	openFields   = 3  // backend, prompt id, started
	closedFields = 10 // and ended, class, error class, message, node id, node type, counted
)

// decodeAttempts decodes the closed attempts and the open one.
func decodeAttempts(closedRuns, open string) ([]queue.Attempt, error) {
	var out []queue.Attempt
	var f [closedFields]string
	for rest := closedRuns; rest != ""; {
		var err error
		if rest, err = fields(rest, f[:closedFields]); err != nil {
			return nil, err
		}
		a, err := attemptOf(len(out)+1, f[:])
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	if open != "" {
		rest, err := fields(open, f[:openFields])
		if err != nil || rest != "" {
			return nil, fmt.Errorf("malformed open attempt %q", open)
		}
		a, err := attemptOf(len(out)+1, f[:openFields])
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// fields reads len(dst) length-prefixed fields off s and returns the rest.
func fields(s string, dst []string) (string, error) {
	for i := range dst {
		c := strings.IndexByte(s, ':')
		if c < 0 {
			return "", fmt.Errorf("malformed attempt record")
		}
		n, err := strconv.Atoi(s[:c])
		if err != nil || n < 0 || c+1+n > len(s) {
			return "", fmt.Errorf("malformed attempt record")
		}
		dst[i], s = s[c+1:c+1+n], s[c+1+n:]
	}
	return s, nil
}

// attemptOf builds attempt number n from its fields (3 when open, 10
// when closed).
func attemptOf(n int, f []string) (queue.Attempt, error) {
	a := queue.Attempt{Number: n, Backend: f[0], PromptID: f[1]}
	var err error
	if a.StartedAt, err = timeOf(f[2]); err != nil {
		return a, err
	}
	if len(f) == openFields {
		return a, nil
	}
	if a.EndedAt, err = timeOf(f[3]); err != nil {
		return a, err
	}
	a.Class = f[4]
	a.Error = queue.ErrorSummary{Class: f[5], Message: f[6], NodeID: f[7], NodeType: f[8]}
	a.Counted = f[9] == "1"
	return a, nil
}
