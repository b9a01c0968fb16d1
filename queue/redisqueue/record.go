package redisqueue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

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
// (record and pack in lua/lib.lua).
var recordFields = [...]string{"id", "st", "v", "pr", "wf", "wk", "ov", "pl", "md", "rq", "nd", "xb", "ik",
	"mx", "u", "at", "ao", "eq", "av", "la", "le", "fi", "lb", "tk", "rs", "ec", "em", "en", "et", "sq", "se", "us"}

// The positions of the fields in recordFields.
const (
	fID = iota
	fSt
	fV
	fPr
	fWf
	fWk
	fOv
	fPl
	fMd
	fRq
	fNd
	fXb
	fIk
	fMx
	fU
	fAt
	fAo
	fEq
	fAv
	fLa
	fLe
	fFi
	fLb
	fTk
	fRs
	fEc
	fEm
	fEn
	fEt
	fSq
	fSe
	fUs
	nFields
)

// rawRecord is a job's record as read: each field's value, and whether
// the job has it.
type rawRecord struct {
	v   [nFields]string
	has [nFields]bool
}

// decodeRow builds a Job from a record as the scripts return it (pack
// in lua/lib.lua): a JSON array of the values of recordFields, in order,
// false for an absent field, as Lua's cjson writes it. One string, not
// an array of 32, saves the client an allocation per field, and the
// Job's strings share its memory where nothing was escaped.
func decodeRow(raw any) (*queue.Job, error) {
	s, ok := raw.(string)
	if !ok {
		return nil, fmt.Errorf("redisqueue: malformed job record %T", raw)
	}
	var r rawRecord
	if err := splitRecord(s, &r); err != nil {
		return nil, fmt.Errorf("redisqueue: malformed job record: %w", err)
	}
	return decodeFields(&r)
}

// holdRow is decodeRow for the ops that return a leased job (Lease,
// Extend, Begin): it keeps the record for the job's Complete (see held).
func (d *Driver) holdRow(raw any) (*queue.Job, error) {
	s, ok := raw.(string)
	if !ok {
		return nil, fmt.Errorf("redisqueue: malformed job record %T", raw)
	}
	r := new(rawRecord)
	if err := splitRecord(s, r); err != nil {
		return nil, fmt.Errorf("redisqueue: malformed job record: %w", err)
	}
	j, err := decodeFields(r)
	if err != nil {
		return nil, err
	}
	if j.State == queue.StateLeased {
		d.held.put(r)
	}
	return j, nil
}

// completed builds the job that a complete of the held record base
// made, from what the script wrote (delta: v, fi, at, u, us; see
// complete in lua/ops.lua) and the result stored. base is the caller's
// own (taken from held).
func completed(base *rawRecord, delta []any, result []byte) (*queue.Job, error) {
	if len(delta) != 5 {
		return nil, fmt.Errorf("redisqueue: complete: malformed reply")
	}
	var f [5]string
	for i, v := range delta {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("redisqueue: complete: malformed reply")
		}
		f[i] = s
	}
	r := base
	r.v[fSt], r.has[fSt] = string(queue.StateCompleted), true
	r.v[fV], r.v[fFi], r.v[fAt], r.v[fU] = f[0], f[1], f[2], f[3]
	r.has[fV], r.has[fFi], r.has[fAt], r.has[fU] = true, true, true, true
	r.v[fUs], r.has[fUs] = f[4], f[4] != ""
	for _, i := range [...]int{fTk, fLe, fAo, fRs} {
		r.v[i], r.has[i] = "", false
	}
	j, err := decodeFields(r)
	if err != nil {
		return nil, err
	}
	j.Result = bytes.Clone(result) // as stored (rs), without a copy through a string
	if len(j.Result) == 0 {
		j.Result = nil
	}
	return j, nil
}

var errRecordSyntax = errors.New("not a JSON array of the record's fields")

// splitRecord reads the JSON array of a packed record into r: strings
// (unescaped), false or null (absent), or a number (its text).
func splitRecord(s string, r *rawRecord) error {
	s, ok := strings.CutPrefix(s, "[")
	if !ok {
		return errRecordSyntax
	}
	for i := range nFields {
		if i > 0 {
			if s, ok = strings.CutPrefix(s, ","); !ok {
				return errRecordSyntax
			}
		}
		switch {
		case strings.HasPrefix(s, `"`):
			end, escaped := 1, false
			for ; end < len(s) && s[end] != '"'; end++ {
				if s[end] == '\\' {
					escaped = true
					end++
				}
			}
			if end >= len(s) {
				return errRecordSyntax
			}
			v := s[1:end]
			if escaped {
				var err error
				if v, err = unescapeJSON(v); err != nil {
					return err
				}
			}
			r.v[i], r.has[i], s = v, true, s[end+1:]
		case strings.HasPrefix(s, "false"):
			s = s[len("false"):]
		case strings.HasPrefix(s, "null"):
			s = s[len("null"):]
		default: // a number, as text
			end := strings.IndexAny(s, ",]")
			if end <= 0 {
				return errRecordSyntax
			}
			r.v[i], r.has[i], s = s[:end], true, s[end:]
		}
	}
	if s != "]" {
		return errRecordSyntax
	}
	return nil
}

// unescapeJSON returns the bytes of the escaped JSON string s (without
// its quotes). cjson escapes bytes, not characters: a \u00XX it writes
// is the byte XX, and the bytes of a binary value pass through as they
// are, which encoding/json would replace when they are not UTF-8.
func unescapeJSON(s string) (string, error) {
	b := make([]byte, 0, len(s))
	for {
		i := strings.IndexByte(s, '\\')
		if i < 0 {
			return string(append(b, s...)), nil
		}
		b = append(b, s[:i]...)
		if i+1 >= len(s) {
			return "", errRecordSyntax
		}
		c, n := s[i+1], 2
		switch c {
		case '"', '\\', '/':
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		case 'u':
			r, ok := hex4(s[i+2:])
			if !ok {
				return "", errRecordSyntax
			}
			n = 6
			if r >= 0x100 {
				b = utf8.AppendRune(b, r)
				s = s[i+n:]
				continue
			}
			c = byte(r)
		default:
			return "", errRecordSyntax
		}
		b = append(b, c)
		s = s[i+n:]
	}
}

// hex4 decodes the four hex digits that begin s.
func hex4(s string) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s[:4]) {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// decodeMap builds a Job from a record read with HGETALL.
func decodeMap(m map[string]string) (*queue.Job, error) {
	var r rawRecord
	for i, name := range recordFields {
		r.v[i], r.has[i] = m[name]
	}
	return decodeFields(&r)
}

// decodeFields builds a Job from a record's fields.
func decodeFields(r *rawRecord) (*queue.Job, error) {
	j := &queue.Job{}
	var err error
	for i, v := range r.v {
		if !r.has[i] {
			continue
		}
		switch i {
		case fID:
			j.ID = v
		case fSt:
			j.State = queue.State(v)
		case fV:
			j.Version, err = strconv.ParseUint(v, 10, 64)
		case fPr:
			j.Priority, err = strconv.Atoi(v)
		case fWf:
			j.Workflow = v
		case fWk:
			j.WorkflowKey = v
		case fOv:
			j.Overrides = bytesOf(v)
		case fPl:
			j.Payload = bytesOf(v)
		case fMd:
			if v != "" {
				err = json.Unmarshal([]byte(v), &j.Metadata)
			}
		case fRq:
			j.Requires, err = decodeSet(v)
		case fNd:
			j.Needs, err = decodeSet(v)
		case fXb:
			j.ExcludeBackends, err = decodeSet(v)
		case fIk:
			j.IdempotencyKey = v
		case fMx:
			j.MaxAttempts, err = strconv.Atoi(v)
		case fU:
			j.AttemptsUsed, err = strconv.Atoi(v)
		case fEq:
			j.EnqueuedAt, err = timeOf(v)
		case fAv:
			j.AvailableAt, err = timeOf(v)
		case fLa:
			j.LeasedAt, err = timeOf(v)
		case fLe:
			j.LeaseExpiresAt, err = timeOf(v)
		case fFi:
			j.FinishedAt, err = timeOf(v)
		case fLb:
			j.LeasedBy = v
		case fTk:
			j.LeaseToken = v
		case fRs:
			j.Result = bytesOf(v)
		case fEc:
			j.Error.Class = v
		case fEm:
			j.Error.Message = v
		case fEn:
			j.Error.NodeID = v
		case fEt:
			j.Error.NodeType = v
		case fSe:
			j.Settle = v == "1"
		case fUs:
			j.Unsettled = v == "1"
		}
		if err != nil {
			return nil, fmt.Errorf("redisqueue: job record field %s: %w", recordFields[i], err)
		}
	}
	if j.ID == "" {
		return nil, fmt.Errorf("redisqueue: job record without id")
	}
	if j.Attempts, err = decodeAttempts(r.v[fAt], r.v[fAo]); err != nil {
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
	if plain, ok := strings.CutPrefix(s, `["`); ok && strings.HasSuffix(plain, `"]`) && !strings.Contains(plain, `\`) {
		// No escapes (the common case), so every quote is a delimiter:
		// split without the reflection of encoding/json.
		out = strings.Split(plain[:len(plain)-2], `","`)
		for _, e := range out {
			if strings.Contains(e, `"`) { // not JSON: let encoding/json say why
				out = nil
				break
			}
		}
	}
	if out == nil {
		if err := json.Unmarshal([]byte(s), &out); err != nil {
			return nil, err
		}
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
	n := 1
	for _, e := range s {
		if !plainJSON(e) {
			b, _ := json.Marshal(s) // []string always encodes
			return string(b)
		}
		n += len(e) + 3
	}
	// What json.Marshal writes for strings it does not escape.
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, e := range s {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(append(append(b, '"'), e...), '"')
	}
	return string(append(b, ']'))
}

// plainJSON reports whether json.Marshal writes s as it is, in quotes:
// printable ASCII without the characters it escapes.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
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
